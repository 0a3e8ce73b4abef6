#!/usr/bin/env bash
# Renders everything derived from the Helm chart, so the checked-in copies never drift from it
# (tests/test_chart.py re-renders and compares):
#   charts/rankops-operator/files/crds/ <- crds/*.yaml (the CRDs `rankops crds` generates; templates/crds.yaml)
#   charts/rankops-operator/files/crd-policies/ <- crds/*.yaml that are not CRDs (admission policies)
#   manifests/install.yaml          <- Namespace + `helm template` with default values (CRDs included)
#   deploy/monitoring/              <- the chart's PrometheusRule and Grafana dashboard
# Usage: scripts/render-manifests.sh [--check]   (--check: render to a temp dir and diff, no writes)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHART=$ROOT/charts/rankops-operator
BIN=${RANKOPS_K8S_BIN:-$HOME/.cache/rankops/k8s/v1.34.4/bin}
HELM=${HELM:-$BIN/helm}
RELEASE=rankops
NAMESPACE=rankops-system
# Pinned, so the checked-in renders do not depend on the Kubernetes version a helm binary assumes.
KUBE_VERSION=1.34.0

if [ ! -x "$HELM" ]; then
  echo "helm not found at $HELM: run dev/rankops_dev/build.sh (or set HELM / RANKOPS_K8S_BIN)" >&2
  exit 1
fi

check=false
[ "${1:-}" = "--check" ] && check=true
out=$ROOT
if $check; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  mkdir -p "$out/charts" && cp -r "$CHART" "$out/charts/"
  CHART=$out/charts/rankops-operator
fi
mkdir -p "$out/manifests" "$out/deploy/monitoring" "$CHART/files/crds"

# 1. The chart ships the generated files unchanged: CRDs in files/crds/ (templated by
#    templates/crds.yaml, so `helm upgrade` applies a changed CRD: Helm never upgrades a chart's
#    crds/ folder), the admission policies generated beside them in files/crd-policies/.
mkdir -p "$CHART/files/crd-policies"
if compgen -G "$ROOT/crds/*.yaml" > /dev/null; then
  find "$CHART/files/crds" "$CHART/files/crd-policies" -name '*.yaml' -delete
  for f in "$ROOT"/crds/*.yaml; do
    if grep -q '^kind: CustomResourceDefinition$' "$f"; then
      cp "$f" "$CHART/files/crds/"
    else
      cp "$f" "$CHART/files/crd-policies/"
    fi
  done
fi

# 2. Plain manifests for `kubectl apply -f manifests/install.yaml`.
{
  cat <<YAML
# rankops operator, rendered from charts/rankops-operator by scripts/render-manifests.sh.
# Do not edit: change the chart and re-run the script. Install with:
#   kubectl apply --server-side -f manifests/install.yaml
---
apiVersion: v1
kind: Namespace
metadata:
  name: $NAMESPACE
  labels:
    app.kubernetes.io/part-of: rankops
    # The validator DaemonSets in this namespace mount the host's / read-only (hostPath), which
    # the baseline and restricted Pod Security levels forbid; the operator pod itself meets
    # restricted, and audit/warn still report anything that does not.
    pod-security.kubernetes.io/enforce: privileged
    pod-security.kubernetes.io/audit: restricted
    pod-security.kubernetes.io/warn: restricted
YAML
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version "$KUBE_VERSION"
} > "$out/manifests/install.yaml"

# 3. Monitoring, for clusters that do not install the chart's monitoring options.
{
  echo "# Rendered from charts/rankops-operator (monitoring.prometheusRule) by scripts/render-manifests.sh."
  echo "# Apply in the namespace your Prometheus Operator watches for rules."
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version "$KUBE_VERSION" \
    --set monitoring.prometheusRule.enabled=true --show-only templates/prometheusrule.yaml
} > "$out/deploy/monitoring/prometheusrule.yaml"
cp "$CHART/files/dashboard.json" "$out/deploy/monitoring/rankops-dashboard.json"

if $check; then
  status=0
  for f in manifests/install.yaml deploy/monitoring/prometheusrule.yaml deploy/monitoring/rankops-dashboard.json; do
    diff -u "$ROOT/$f" "$out/$f" || { echo "drift: $f (run scripts/render-manifests.sh)" >&2; status=1; }
  done
  for d in files/crds files/crd-policies; do
    diff -ru "$ROOT/charts/rankops-operator/$d" "$CHART/$d" \
      || { echo "drift: charts/rankops-operator/$d (run scripts/render-manifests.sh)" >&2; status=1; }
  done
  exit $status
fi
echo "rendered manifests/install.yaml, deploy/monitoring/, charts/rankops-operator/files/crds/" >&2
