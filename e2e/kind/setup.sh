#!/usr/bin/env bash
# Makes a kind cluster ready for `pytest e2e`: kwok in the cluster with the rankops stages,
# the e2e set of simulated GPU nodes, and the operator chart installed.
# Needs: kind, kubectl, helm, docker (or podman), network, and `rankops` installed (pip install -e .).
# Usage: e2e/kind/setup.sh, then: KUBECONFIG=~/.kube/kind-rankops-e2e pytest e2e
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=${CLUSTER:-rankops-e2e}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
RELEASE_NAMESPACE=${RELEASE_NAMESPACE:-rankops-system}
export KUBECONFIG=${KUBECONFIG:-$HOME/.kube/kind-$CLUSTER}

say() { echo "[kind-e2e] $*" >&2; }

if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  say "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --config "$ROOT/e2e/kind/cluster.yaml" --wait 120s
fi
mkdir -p "$(dirname "$KUBECONFIG")"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"

say "installing kwok $KWOK_VERSION (controller + CRDs) in kube-system"
kubectl apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION/kwok.yaml"
kubectl wait --for condition=Established --timeout 60s crd/stages.kwok.x-k8s.io
# The rankops stages replace kwok's stage-fast.yaml: the same node/pod lifecycle the local
# control plane runs, plus the simulated exit codes and termination messages.
kubectl apply -f "$ROOT/operator/rankops/devcluster/kwok/"
kubectl -n kube-system rollout status deployment/kwok-controller --timeout 120s

say "creating the e2e GPU nodes"
rankops dev nodes --set e2e --kubeconfig "$KUBECONFIG"

say "installing the chart into $RELEASE_NAMESPACE"
helm upgrade --install rankops "$ROOT/charts/rankops-operator" \
  --namespace "$RELEASE_NAMESPACE" --create-namespace \
  --set-string "operator.nodeSelector.kubernetes\.io/hostname=$CLUSTER-control-plane"
# The suite runs the operator itself, as the chart's ServiceAccount (impersonation proves the
# chart's RBAC is enough); the chart's own Deployment is scaled to 0 so only one operator acts.
kubectl -n "$RELEASE_NAMESPACE" scale deployment -l app.kubernetes.io/instance=rankops --replicas=0

say "ready: export KUBECONFIG=$KUBECONFIG; pytest e2e"
