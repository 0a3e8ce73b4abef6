#!/usr/bin/env bash
# Builds the local control plane and the real node once per machine from the Go module proxy:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm and kube-score
# (the manifest linter tests/test_manifest_lint.py runs), the kubelet and kube-proxy (the real node,
# real_node.py); and installs the Debian packages the dev cluster runs: containerd, runc, the CNI plugins, iptables, conntrack and dnsmasq (the real node),
# buildah and debootstrap (`rankops dev images`: the images, built here without a registry).
# Also sccadmit: OpenShift's SCC admission plugin (vendored in sccadmit/ beside this file) as a
# command the OpenShift tests run on rendered pods.
# Binaries are cached outside the repo in $RANKOPS_K8S_BIN (default
# ~/.cache/rankops/k8s/<version>/bin); what is already there is reused.
# Prints the bin directory on its last line.
# `build.sh kubelet kube-proxy` (the old optional targets) is accepted: they are built anyway.
set -euo pipefail

NODE_TARGETS=()
for arg in "$@"; do
  case "$arg" in
    kubelet|kube-proxy) NODE_TARGETS+=("$arg") ;;
    *) echo "build.sh: unknown target $arg (targets: kubelet kube-proxy; none: everything)" >&2; exit 2 ;;
  esac
done
[ ${#NODE_TARGETS[@]} -eq 0 ] && NODE_TARGETS=(kubelet kube-proxy)

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.6}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}     # v0.8.0 needs go 1.26 in go.mod; 0.7.0 builds on 1.24+
HELM_VERSION=${HELM_VERSION:-v3.19.0}
KUBE_SCORE_VERSION=${KUBE_SCORE_VERSION:-v1.20.0}   # the proxy's only tag (kube-linter's module is refused)
CACHE=${RANKOPS_CACHE:-$HOME/.cache/rankops}
BIN=${RANKOPS_K8S_BIN:-$CACHE/k8s/$K8S_VERSION/bin}
WORK=$CACHE/k8s/$K8S_VERSION/src
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
export GOPATH=${GOPATH:-$(go env GOPATH)}
mkdir -p "$BIN" "$WORK"

say() { echo "[control-plane] $*" >&2; }
have() { [ -x "$BIN/$1" ]; }

minor=$(echo "$K8S_VERSION" | cut -d. -f2)
staging_v="v0.${minor}.$(echo "$K8S_VERSION" | cut -d. -f3)"

build_kubernetes() {
  local missing=()
  local wanted=(kube-apiserver kube-controller-manager kube-scheduler kubectl ${NODE_TARGETS[@]+"${NODE_TARGETS[@]}"})
  for b in "${wanted[@]}"; do have "$b" || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && { say "kubernetes $K8S_VERSION: cached"; return; }
  say "kubernetes $K8S_VERSION: building ${missing[*]} (cold: tens of minutes on 2 cores)"
  local dir=$WORK/kubernetes
  mkdir -p "$dir"
  local gomod
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module rankops.local/k8s-build"
    echo
    echo "go $(awk '/^go /{print $2; exit}' "$gomod")"
    grep -E '^godebug ' "$gomod" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # Every staging module the release replaces with ./staging/... gets its published v0.x.y.
    grep -E '=> \./staging/' "$gomod" | awk -v v="$staging_v" '{print "replace " $1 " => " $1 " " v}'
  } > "$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for b in "${wanted[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"; done
    printf ')\n'
  } > "$dir/tools.go"
  (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$dir" && go mod download)
  local ld=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  for b in "${missing[@]}"; do
    say "  go build $b"
    (cd "$dir" && go build -tags selinux,notest -trimpath -ldflags "-s -w $ld" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b")
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
}

build_module_tool() {  # name module version package [ldflags]
  local name=$1 module=$2 version=$3 pkg=$4 ld=${5:-}
  have "$name" && [ "${RELINK:-}" != "$name" ] && { say "$name $version: cached"; return; }
  say "$name $version: building"
  local dir=$WORK/$name
  mkdir -p "$dir"
  (cd "$dir" && rm -f go.mod go.sum && go mod init "rankops.local/$name-build" >/dev/null 2>&1 \
     && go get "$module@$version" >/dev/null \
     && go build -trimpath -ldflags "-s -w $ld" -o "$BIN/$name.tmp" "$pkg")
  mv "$BIN/$name.tmp" "$BIN/$name"
}

# Rebuilt when its in-repo source changes: $BIN/sccadmit.sha256 holds the hash of the source it was
# built from (tests/test_openshift_scc.py computes the same and refuses a stale binary).
sccadmit_hash() {
  (cd "$1" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort \
     | xargs sha256sum) | sha256sum | cut -d' ' -f1
}

build_sccadmit() {
  local src hash
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/sccadmit" && pwd)
  hash=$(sccadmit_hash "$src")
  have sccadmit && [ "$(cat "$BIN/sccadmit.sha256" 2>/dev/null)" = "$hash" ] && { say "sccadmit: cached"; return; }
  say "sccadmit: building (OpenShift's SCC admission, from $src)"
  # The same tags and flags as the Kubernetes build, so its compiled packages are reused; readonly:
  # the committed go.sum is the whole truth, nothing in the repo is rewritten.
  (cd "$src" && GOFLAGS="-mod=readonly -buildvcs=false" go build -tags selinux,notest -trimpath -ldflags "-s -w" -o "$BIN/sccadmit.tmp" .)
  mv "$BIN/sccadmit.tmp" "$BIN/sccadmit"
  echo "$hash" > "$BIN/sccadmit.sha256"
}

# command (or path) -> Debian package: what the dev cluster runs, installed when missing.
DEBIAN_PARTS=(
  "containerd containerd"
  "/usr/sbin/runc runc"
  "/usr/lib/cni/bridge containernetworking-plugins"
  "/usr/sbin/iptables iptables"
  "/usr/sbin/conntrack conntrack"
  "/usr/sbin/dnsmasq dnsmasq-base"
  "buildah buildah"
  "debootstrap debootstrap"
)

ensure_debian_packages() {
  local missing=() part
  for part in "${DEBIAN_PARTS[@]}"; do
    set -- $part
    if [[ $1 == /* ]]; then [ -e "$1" ] || missing+=("$2"); else command -v "$1" >/dev/null || missing+=("$2"); fi
  done
  [ ${#missing[@]} -eq 0 ] && { say "Debian packages: all there"; return; }
  command -v apt-get >/dev/null || { say "missing: ${missing[*]}: install them with your package manager"; exit 1; }
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  say "Debian packages: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
    || { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
}

start=$(date +%s)
ensure_debian_packages
build_module_tool etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3 \
  "-X go.etcd.io/etcd/api/v3/version.GitSHA=release"
build_module_tool kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
  "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
# helm's Makefile links in the Kubernetes version `helm template` and `helm lint` assume; without it
# they assume v1.20 and refuse the chart (kubeVersion >= 1.27). A helm linked before this: relinked.
helm_kube="helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
helm_kube="$helm_kube -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
[ -f "$BIN/.helm-kube-1.$minor" ] || RELINK=helm
build_module_tool helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X $helm_kube"
touch "$BIN/.helm-kube-1.$minor"
# A kube-score of another version (its own `version` says which): rebuilt.
have kube-score && ! "$BIN/kube-score" version 2>/dev/null | grep -q "version: $KUBE_SCORE_VERSION," && RELINK=kube-score
build_module_tool kube-score github.com/zegl/kube-score "$KUBE_SCORE_VERSION" github.com/zegl/kube-score/cmd/kube-score \
  "-X main.version=$KUBE_SCORE_VERSION"
build_kubernetes
build_sccadmit
say "ready in $(( $(date +%s) - start ))s: $BIN"
echo "$BIN"
