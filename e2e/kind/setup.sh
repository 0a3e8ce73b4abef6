#!/usr/bin/env bash
# Makes a kind cluster ready for `pytest e2e`: the rankops images built and loaded into the nodes,
# two workers prepared as the real nodes the real-pod tests run on, kwok in the cluster with the
# rankops stages, the e2e set of simulated GPU nodes, and the operator chart installed.
# Needs: kind, kubectl, helm, docker (or podman), network, and `rankops` installed (pip install -e . -e ./dev: `rankops dev nodes` is the dev harness).
# Usage: e2e/kind/setup.sh, then: source ~/.kube/kind-rankops-e2e.env; pytest e2e
# (in GitHub Actions the variables go to $GITHUB_ENV instead).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=${CLUSTER:-rankops-e2e}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
RELEASE_NAMESPACE=${RELEASE_NAMESPACE:-rankops-system}
export KUBECONFIG=${KUBECONFIG:-$HOME/.kube/kind-$CLUSTER}
# What the e2e fixtures read (RANKOPS_E2E_REAL_NODE, RANKOPS_E2E_IMAGES, RANKOPS_E2E_STORE_HOST,
# RANKOPS_E2E_ENGINE, RANKOPS_E2E_CONTROL_PLANE), as `export` lines.
ENV_FILE=${ENV_FILE:-$KUBECONFIG.env}
# The workers' roles (cluster.yaml): the chart's on <cluster>-worker; the real nodes are the ones
# labelled (and tainted) rankops.io/real-node=true, <cluster>-worker2 (the operator's, with the
# static CPU manager) first.
SYSTEM_NODE=${SYSTEM_NODE:-$CLUSTER-worker}
FIRST_REAL_NODE=${FIRST_REAL_NODE:-$CLUSTER-worker2}
REAL_NODE_KEY=rankops.io/real-node
REAL_NODE_GPUS=${REAL_NODE_GPUS:-2}
if [[ -z ${ENGINE:-} ]]; then
  if command -v docker >/dev/null; then ENGINE=docker; else ENGINE=podman; fi
fi
# The Triton test image needs Debian (its Dockerfile installs libpython3.11 with apt-get) and
# glibc >= 2.35 (the nvidia-pytriton wheel is manylinux_2_35): UBI 8's python-311 has glibc
# 2.28 (UBI 9: 2.34), so it builds on Docker's official Python 3.11 image on Debian bookworm.
TRITON_BASE_IMAGE=${TRITON_BASE_IMAGE:-docker.io/library/python:3.11-slim-bookworm}

say() { echo "[kind-e2e] $*" >&2; }

# Builds one target and prints its reference: localhost/rankops-<target>:<12 hex digits of the
# image ID>, so a changed tree gives a new name and the nodes never run a stale image under an
# old one (pods use IfNotPresent; a registry is never asked for localhost/).
build_image() {
  local target=$1 dockerfile=$2 context=$3
  shift 3
  local iidfile id ref
  iidfile=$(mktemp)
  say "building $target ($ENGINE build -f ${dockerfile#"$ROOT"/} --target $target $*)"
  "$ENGINE" build -f "$dockerfile" --target "$target" --iidfile "$iidfile" "$@" "$context" >&2
  id=$(<"$iidfile")
  rm -f "$iidfile"
  id=${id#sha256:}
  ref=localhost/rankops-$target:${id:0:12}
  "$ENGINE" tag "$id" "$ref"
  echo "$ref"
}

# Into the workers' containerd (pods never run on the tainted control plane, and the gates
# image with torch is ~1.5 GB): `kind load docker-image` reads docker's store; podman's images go
# through an archive (kind's podman provider has no image store of its own to read).
load_image() {
  local ref=$1 archive
  local nodes
  nodes=$(IFS=,; echo "$SYSTEM_NODE,${REAL_NODES[*]}")
  say "loading $ref into $nodes"
  if [[ $ENGINE == docker ]]; then
    kind load docker-image --name "$CLUSTER" --nodes "$nodes" "$ref"
  else
    archive=$(mktemp "${TMPDIR:-/tmp}/rankops-image.XXXXXX")
    "$ENGINE" save --format docker-archive -o "$archive" "$ref"
    kind load image-archive --name "$CLUSTER" --nodes "$nodes" "$archive"
    rm -f "$archive"
  fi
}

if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  say "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --config "$ROOT/e2e/kind/cluster.yaml" --wait 120s
fi
mkdir -p "$(dirname "$KUBECONFIG")"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"
real_nodes=$(kubectl get nodes -l "$REAL_NODE_KEY=true" -o jsonpath='{.items[*].metadata.name}')
read -r -a REAL_NODES <<< "$real_nodes"
if [[ ${#REAL_NODES[@]} -ne 2 || " $real_nodes " != *" $FIRST_REAL_NODE "* ]] \
    || ! kubectl get node "$SYSTEM_NODE" >/dev/null; then
  say "want $SYSTEM_NODE and two nodes labelled $REAL_NODE_KEY=true ($FIRST_REAL_NODE one of them)," \
      "found '$real_nodes': this cluster predates e2e/kind/cluster.yaml; delete it" \
      "(kind delete cluster --name $CLUSTER) and run again"
  exit 1
fi

# The product images on images/Dockerfile's default base (UBI 8 python-311), as users build them.
operator_ref=$(build_image operator "$ROOT/images/Dockerfile" "$ROOT")
gates_ref=$(build_image gates "$ROOT/images/Dockerfile" "$ROOT")
validator_ref=$(build_image validator "$ROOT/images/Dockerfile" "$ROOT")
# Its context is the two files it copies, which live beside the dev cluster's other code.
triton_ref=$(build_image triton-test "$ROOT/images/Dockerfile.triton-test" \
  "$ROOT/dev/rankops_dev" --build-arg "BASE_IMAGE=$TRITON_BASE_IMAGE")
for ref in "$operator_ref" "$gates_ref" "$validator_ref" "$triton_ref"; do
  load_image "$ref"
done

# The real node's GPUs, as the local real node's (rankops_dev/real_node_config.py's
# gpu_capacity_patch): the kubelet keeps an extended resource patched into status.capacity
# (kubernetes.io/docs/tasks/administer-cluster/extended-resource-node); allocatable is patched
# too so that the scheduler need not wait for the kubelet's next status update to copy it.
gpu_patch=$(printf '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"%s"},{"op":"add","path":"/status/allocatable/nvidia.com~1gpu","value":"%s"}]' \
  "$REAL_NODE_GPUS" "$REAL_NODE_GPUS")
for node in "${REAL_NODES[@]}"; do
  say "giving $node $REAL_NODE_GPUS nvidia.com/gpu"
  kubectl patch node "$node" --subresource=status --type=json -p "$gpu_patch"
  kubectl wait node "$node" --timeout 60s \
    --for=jsonpath='{.status.allocatable.nvidia\.com/gpu}'="$REAL_NODE_GPUS"
done

# The tests send their traffic from this machine to the pods' IPs (on this machine's dev cluster
# they send from inside its network namespace): a route to each real node's pod range through
# the node's address on the kind network (rootful engines only: a rootless podman's node
# addresses are not reachable from the host).
SUDO=$([[ $(id -u) == 0 ]] && echo "" || echo sudo)
for node in "${REAL_NODES[@]}"; do
  pod_cidr=$(kubectl get node "$node" -o jsonpath='{.spec.podCIDR}')
  node_ip=$(kubectl get node "$node" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
  if [[ ! $pod_cidr =~ ^[0-9.]+/[0-9]+$ || ! $node_ip =~ ^[0-9.]+$ ]]; then
    say "$node: want one IPv4 pod range and one IPv4 InternalIP, got '$pod_cidr' and '$node_ip'" \
        "(an IPv4 kind cluster, as e2e/kind/cluster.yaml makes)"
    exit 1
  fi
  say "routing $pod_cidr through $node ($node_ip)"
  $SUDO ip route replace "$pod_cidr" via "$node_ip"
done

# The S3 server the real-pod tests start on this machine listens on the kind network's gateway:
# the address of this machine that the nodes (and their pods, masqueraded) reach.
if [[ -z ${STORE_HOST:-} ]]; then
  if [[ $ENGINE == docker ]]; then
    gateways=$(docker network inspect kind --format '{{range .IPAM.Config}}{{.Gateway}} {{end}}')
  else
    gateways=$(podman network inspect kind --format '{{range .Subnets}}{{.Gateway}} {{end}}')
  fi
  for gateway in $gateways; do
    if [[ $gateway == *.* ]]; then STORE_HOST=$gateway; break; fi
  done
fi
if [[ -z ${STORE_HOST:-} ]]; then
  say "no IPv4 gateway on the container network 'kind': set STORE_HOST to an address of this machine the nodes reach"
  exit 1
fi

say "installing kwok $KWOK_VERSION (controller + CRDs) in kube-system"
kubectl apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION/kwok.yaml"
kubectl wait --for condition=Established --timeout 60s crd/stages.kwok.x-k8s.io
# The rankops stages replace kwok's stage-fast.yaml: the same node/pod lifecycle the local
# control plane runs, plus the simulated exit codes and termination messages.
kubectl apply -f "$ROOT/dev/rankops_dev/kwok/"
# On the chart's worker: kwok's simulated nodes are untainted, and a controller scheduled onto
# one of them would be a simulated pod itself.
kubectl -n kube-system patch deployment kwok-controller --type=merge \
  -p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"kubernetes.io/hostname\":\"$SYSTEM_NODE\"}}}}}"
kubectl -n kube-system rollout status deployment/kwok-controller --timeout 120s

say "creating the e2e GPU nodes"
rankops dev nodes --set e2e --kubeconfig "$KUBECONFIG"

say "installing the chart into $RELEASE_NAMESPACE"
# Every image the chart and the models' pods name is the one just loaded: a pod that asked a
# registry would fail (the refs exist only in the nodes), so a wrong name shows at once.
image_values=()
for value_ref in "image=$operator_ref" "fetcher.image=$operator_ref" "gates.image=$gates_ref" \
                 "validator.image=$validator_ref"; do
  key=${value_ref%%=*} ref=${value_ref#*=}
  image_values+=(--set-string "$key.repository=${ref%:*}" --set-string "$key.tag=${ref##*:}")
done
helm upgrade --install rankops "$ROOT/charts/rankops-operator" \
  --namespace "$RELEASE_NAMESPACE" --create-namespace \
  "${image_values[@]}" \
  --set-string "operator.nodeSelector.kubernetes\.io/hostname=$SYSTEM_NODE"
# The suite runs the operator itself, as the chart's ServiceAccount (impersonation proves the
# chart's RBAC is enough); the chart's own Deployment is scaled to 0 so only one operator acts.
kubectl -n "$RELEASE_NAMESPACE" scale deployment -l app.kubernetes.io/instance=rankops --replicas=0

images_env=operator=$operator_ref,gates=$gates_ref,validator=$validator_ref,triton=$triton_ref
{
  echo "export KUBECONFIG=$KUBECONFIG"
  echo "export RANKOPS_E2E_REAL_NODE=$FIRST_REAL_NODE"
  echo "export RANKOPS_E2E_ENGINE=$ENGINE"
  echo "export RANKOPS_E2E_CONTROL_PLANE=$CLUSTER-control-plane"
  echo "export RANKOPS_E2E_IMAGES=$images_env"
  echo "export RANKOPS_E2E_STORE_HOST=$STORE_HOST"
} > "$ENV_FILE"
if [[ -n ${GITHUB_ENV:-} ]]; then
  sed 's/^export //' "$ENV_FILE" >> "$GITHUB_ENV"
fi
say "ready: source $ENV_FILE; pytest e2e"
cat "$ENV_FILE" >&2
