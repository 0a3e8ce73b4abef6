#!/usr/bin/env bash
# The real build proof of `rankops dev images` (issue 38 item 1), not part of the test suite (it
# takes minutes, needs root, buildah and debootstrap). Builds every image cold (COLD=1: the
# rankops images, the base and buildah's layer cache removed first; Debian's .debs stay cached),
# builds again to show the warm (cached) run builds nothing, exports OCI archives for
# `ctr -n k8s.io images import`, checks each archive's index names its tag, then runs --check.
# Usage: sudo COLD=1 PYTHON=.venv/bin/python bash scripts/build-images-check.sh [EXPORT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
OUT=${1:-/tmp/rankops-images}
rankops_dev_images() { nice -n 19 "$PYTHON" -m rankops dev images "$@"; }

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
