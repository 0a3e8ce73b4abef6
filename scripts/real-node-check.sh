#!/usr/bin/env bash
# Issue 38, item 2: the local control plane and one real node (containerd + runc + CNI bridge +
# kubelet + kube-proxy, all in a network namespace of their own); a Triton pod from the
# triton-test image serves an ONNX model, a client pod from the operator image asks it through
# its Service and reads the API server through the `kubernetes` Service. Prints the container
# IDs, the Triton process's UID, capabilities and PID namespace, and create -> Ready seconds.
# Not part of the test suite. Needs: root; apt-get install containerd runc
# containernetworking-plugins iptables conntrack dnsmasq-base; the archives of `rankops dev images --export DIR`
# (RANKOPS_IMAGES_DIR, default /tmp/rankops-images); kubelet and kube-proxy, which this builds
# when missing (build.sh kubelet kube-proxy: the same release as the control plane).
# Everything is torn down on exit (the Python side on success, failure, Ctrl-C or SIGTERM; a
# sweep here after a harder death). Usage: bash scripts/real-node-check.sh [--keep]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONPATH=$ROOT/operator:$ROOT/dev:$ROOT${PYTHONPATH:+:$PYTHONPATH}
[ "$(id -u)" -eq 0 ] || { echo "real-node-check: needs root (network namespace, containerd, kubelet)" >&2; exit 2; }
for tool in containerd runc ctr nsenter iptables conntrack dnsmasq; do
  command -v $tool >/dev/null || { echo "real-node-check: $tool missing (apt-get install containerd runc iptables conntrack dnsmasq-base)" >&2; exit 2; }
done
[ -x /usr/lib/cni/bridge ] || { echo "real-node-check: CNI plugins missing (apt-get install containernetworking-plugins)" >&2; exit 2; }
NAME=rankops-$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')
WORK=$(mktemp -d /tmp/rankops-node-XXXXXX)
sweep() { "$PY" -m rankops_dev.real_node_check --sweep --name "$NAME" --work "$WORK"; }
trap sweep EXIT
"$PY" -m rankops_dev.real_node_check --name "$NAME" --work "$WORK" "$@"
