#!/usr/bin/env bash
# Issue 38, first step: the proof that a real node runs on this kind of machine (2026-12-03).
# NOT wired into any test yet: it starts, in a network namespace `rkn`, etcd + kube-apiserver
# (advertised on 10.200.0.1, an address on the namespace's loopback that the pod bridge reaches),
# the controller-manager and scheduler, containerd 1.6 (Debian) with the CRI plugin, runc and the
# bridge/host-local/portmap CNI plugins, and a real kubelet v1.34.4 (go build of
# k8s.io/kubernetes/cmd/kubelet from build.sh's module cache: 40 s warm). A pod from an image
# built with buildah (busybox-static, from scratch) and imported with `ctr -n k8s.io images
# import` ran as uid 65532 in its own PID namespace with a read-only root, got 10.244.0.x on
# the bridge and reached the API server.
#
# What it took (each one an error first):
#   - `nsenter --net=/var/run/netns/rkn`, not `ip netns exec`: the latter remounts /sys, the
#     cgroup v1 mounts under /sys/fs/cgroup vanish and the kubelet stops with "failed to find
#     cgroup mounts".
#   - containerd's CRI `restrict_oom_score_adj = true`: this machine's root lacks
#     CAP_SYS_RESOURCE, so the sandbox's oom_score_adj -998 is refused (runc 1.1.5: "can't get
#     final child's PID from pipe: EOF"; crun: "write to /proc/self/oom_score_adj: Permission denied").
#   - runc, not crun: crun 1.8.1 refuses hybrid cgroups ("cgroups in hybrid mode not supported").
#   - no `dummy` link type in this kernel: the API server's address sits on the namespace's lo.
# Packages: apt-get install containerd runc containernetworking-plugins buildah busybox-static.
# Usage: KUBELET=/path/to/kubelet bash scripts/real-node-spike.sh   (then see the end of this file)
# Spike: control plane + containerd + kubelet inside netns rkn
set -euo pipefail
B=/root/.cache/rankops/k8s/v1.34.4/bin
W=${WORK:-/tmp/rn/w}; grep $W /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true; rm -rf $W; mkdir -p $W/{etcd,pki,cni/net.d,cr/root,cr/state,kubelet,logs}
ip netns del rkn 2>/dev/null || true
ip netns add rkn
N="nsenter --net=/var/run/netns/rkn"
$N ip link set lo up
$N ip addr add 10.200.0.1/32 dev lo
TOKEN=spiketoken123
echo "$TOKEN,admin,admin,system:masters" > $W/pki/tokens.csv
openssl genrsa -out $W/pki/sa.key 2048 2>/dev/null; openssl rsa -in $W/pki/sa.key -pubout -out $W/pki/sa.pub 2>/dev/null
cat > $W/kubeconfig <<K
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.200.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: $TOKEN}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
K
$N $B/etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 > $W/logs/etcd.log 2>&1 &
sleep 2
$N $B/kube-apiserver --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --advertise-address=10.200.0.1 --secure-port=6443 \
  --cert-dir=$W/pki --token-auth-file=$W/pki/tokens.csv --service-account-key-file=$W/pki/sa.pub --service-account-signing-key-file=$W/pki/sa.key \
  --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC --allow-privileged=true > $W/logs/apiserver.log 2>&1 &
for i in $(seq 60); do $N $B/kubectl --kubeconfig $W/kubeconfig get --raw /readyz >/dev/null 2>&1 && break; sleep 1; done
$N $B/kube-controller-manager --kubeconfig $W/kubeconfig --service-account-private-key-file=$W/pki/sa.key --use-service-account-credentials --controllers='*,-nodeipam' --secure-port=0 > $W/logs/kcm.log 2>&1 &
$N $B/kube-scheduler --kubeconfig $W/kubeconfig --secure-port=0 > $W/logs/sched.log 2>&1 &
cat > $W/containerd.toml <<C
version = 2
root = "$W/cr/root"
state = "$W/cr/state"
[grpc]
  address = "$W/cr/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:spike"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${SNAP:-overlayfs}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni/net.d"
C
cat > $W/cni/net.d/10-bridge.conflist <<J
{"cniVersion": "1.0.0", "name": "rankops", "plugins": [
 {"type": "bridge", "bridge": "rkbr0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
 {"type": "portmap", "capabilities": {"portMappings": true}}]}
J
$N containerd --config $W/containerd.toml > $W/logs/containerd.log 2>&1 &
sleep 2
cat > $W/kubelet.yaml <<Y
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$W/cr/containerd.sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
address: 10.200.0.1
staticPodPath: ""
clusterDNS: []
resolvConf: ""
enforceNodeAllocatable: []
cgroupsPerQOS: true
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
Y
$N ${KUBELET:-/tmp/kubelet-bin/kubelet} --config $W/kubelet.yaml --kubeconfig $W/kubeconfig --root-dir $W/kubelet --hostname-override rn-node-0 --node-ip 10.200.0.1 --v=1 > $W/logs/kubelet.log 2>&1 &
echo started
# Then: an image into containerd, and a pod:
#   c=$(buildah from scratch); buildah copy $c /bin/busybox /bin/busybox
#   buildah run --isolation chroot $c -- /bin/busybox --install -s /bin
#   buildah config --cmd '["/bin/sleep","infinity"]' --user 65532:65532 $c; buildah commit -q $c localhost/busybox:spike
#   buildah push -q localhost/busybox:spike oci-archive:/tmp/busybox.tar:localhost/busybox:spike
#   ctr --address $W/cr/containerd.sock -n k8s.io images import /tmp/busybox.tar
#   ctr --address $W/cr/containerd.sock -n k8s.io images tag localhost/busybox:spike localhost/pause:spike
#   nsenter --net=/var/run/netns/rkn kubectl --kubeconfig $W/kubeconfig apply -f <a pod with imagePullPolicy: Never>
