#!/usr/bin/env bash
# The real build proof of `rankops dev images` (issue 38 item 1), not part of the test suite (it
# takes minutes, needs root, buildah and debootstrap). Builds every image cold (COLD=1: the
# rankops images, the base and buildah's layer cache removed first; Debian's .debs stay cached),
# builds again to show the warm (cached) run builds nothing, exports OCI archives for
# `ctr -n k8s.io images import`, checks each archive's index names its tag, runs --check, and
# (with containerd installed) imports the archives into a private containerd and runs them with runc.
# Usage: sudo COLD=1 PYTHON=.venv/bin/python bash scripts/build-images-check.sh [EXPORT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD/operator:$PWD/dev${PYTHONPATH:+:$PYTHONPATH}"
OUT=${1:-/tmp/rankops-images}
rankops_dev_images() { nice -n 19 "$PYTHON" -m rankops_dev images "$@"; }

if [[ ${COLD:-0} == 1 ]]; then
  # Only this project's images, then the layers no image uses any more.
  buildah images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/rankops-' | xargs -r buildah rmi -f >/dev/null
  buildah rmi --prune >/dev/null 2>&1 || true
fi
echo "== first run${COLD:+ (cold)}"
start=$(date +%s); rankops_dev_images; echo "total $(( $(date +%s) - start )) s"
echo "== second run (warm: every tag exists)"
start=$(date +%s); rankops_dev_images --export "$OUT"; echo "total $(( $(date +%s) - start )) s"
for archive in "$OUT"/*.tar; do
  ref=$(tar -xOf "$archive" index.json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])')
  echo "$archive: $(du -h "$archive" | cut -f1), ref $ref"
done
echo "== check"
rankops_dev_images --check

# The archives in containerd, run by runc as a pod would run them (read-only root, /tmp a tmpfs as
# the rendered pod's emptyDir, the host's loopback): a private containerd, no CRI, stopped after.
if ! command -v containerd >/dev/null || ! command -v ctr >/dev/null; then
  echo "== containerd: skipped (apt-get install -y containerd runc)"; exit 0
fi
echo "== containerd + runc"
W=$(mktemp -d /tmp/rankops-ctr-XXXX); chmod 755 "$W"
printf 'version = 2\nroot = "%s/root"\nstate = "%s/state"\n[grpc]\n  address = "%s/containerd.sock"\n' "$W" "$W" "$W" > "$W/config.toml"
nice -n 19 containerd --config "$W/config.toml" > "$W/containerd.log" 2>&1 &
containerd_pid=$!
stop() { ctr_ task kill -s SIGKILL triton-check >/dev/null 2>&1 || true; sleep 1
         ctr_ task rm -f triton-check >/dev/null 2>&1 || true; ctr_ container rm triton-check >/dev/null 2>&1 || true
         kill "$containerd_pid"; wait "$containerd_pid" 2>/dev/null || true; umount -R "$W/state" 2>/dev/null || true; rm -rf "$W"; }
ctr_() { ctr --address "$W/containerd.sock" -n k8s.io "$@"; }
trap stop EXIT
for i in $(seq 30); do ctr_ version >/dev/null 2>&1 && break; sleep 0.5; done
for archive in "$OUT"/*.tar; do nice -n 19 ionice -c3 ctr --address "$W/containerd.sock" -n k8s.io images import "$archive" | tail -1; done
image() { ctr_ images ls -q | grep "^localhost/rankops-$1:" | head -1; }
echo "operator: $(ctr_ run --rm --read-only "$(image operator)" operator-check id)"
ctr_ run --rm --read-only "$(image operator)" operator-check rankops --help | head -1
"$PYTHON" -c 'import sys; from pathlib import Path; from rankops_dev.image_check import write_repository; write_repository(Path(sys.argv[1]))' "$W/repo"
port=$("$PYTHON" -c 'from rankops_dev.ports import free_ports; print(free_ports(1, "127.0.0.1")[0])')
ctr_ run --rm --read-only --net-host --mount "type=bind,src=$W/repo/models,dst=/models,options=rbind:ro" \
  --mount type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev "$(image triton-test)" triton-check \
  tritonserver --model-repository=/models --http-address=127.0.0.1 --http-port="$port"\
  --allow-grpc=false --allow-metrics=false > "$W/triton.log" 2>&1 &
for i in $(seq 120); do curl -sf "http://127.0.0.1:$port/v2/health/ready" && break; sleep 0.5; done
curl -sf -X POST "http://127.0.0.1:$port/v2/models/add/infer" -H 'Content-Type: application/json' \
  -d '{"inputs":[{"name":"a","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]},{"name":"b","shape":[1,4],"datatype":"FP32","data":[10,20,30,40]}]}' \
  || { tail -20 "$W/triton.log"; exit 1; }
pid=$(ctr_ task ls | awk '$1 == "triton-check" {print $2}')
echo; echo "triton-test: pid $pid, uid $(awk '/^Uid/{print $2}' /proc/$pid/status), pid namespace $(readlink /proc/$pid/ns/pid) (this shell's $(readlink /proc/self/ns/pid)), CapEff $(awk '/^CapEff/{print $2}' /proc/$pid/status)"
