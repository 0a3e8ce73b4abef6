"""The real node's configuration files and command lines, as pure functions of its layout.

containerd 1.6 (Debian's) with the CRI plugin and runc; the CNI bridge, host-local, loopback and
portmap plugins; a kubelet and a kube-proxy (iptables mode) of the control plane's release. Each
choice that this machine forced is said where it is made (facts: docs of issue 38 and
scripts/real-node-spike.sh).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class NodeLayout:
    """Where everything of one real node lives, and its addresses."""

    work_dir: Path
    node_name: str
    node_ip: str            # on the namespace's loopback; also the API server's address
    pod_subnet: str         # the CNI bridge's host-local range
    service_cidr: str
    bridge: str = "rkbr0"
    sandbox_image: str = "localhost/rankops-pause:1"
    runc: str = "/usr/sbin/runc"
    cni_bin_dir: str = "/usr/lib/cni"
    cluster_dns: bool = True  # dnsmasq on node_ip:53 (cluster_dns.py)
    # "static": Guaranteed pods' whole-CPU containers get exclusive cores (spec.latencyIsolation).
    cpu_manager_policy: str = "none"
    # A sample host tree (validator/sample_hosts.py) that the node's validator pods check instead
    # of this machine: containerd's runc is then sample_host_runc.py (the demo's passing node).
    sample_host: Path | None = None
    # Where a second node's kubelet keeps its cgroups (its own kubepods under it), so the two
    # kubelets never clean up, or hand out the cores of, each other's pods. "/": the machine's root.
    cgroup_root: str = "/"
    # The pods of every node of the namespace: kube-proxy does not masquerade traffic from them
    # ("": this node's pod_subnet, the only node).
    cluster_pod_cidr: str = ""
    # The address of the node that runs the namespace's kube-proxy and DNS, None: this one (the
    # first node). Both share the namespace's iptables, so one kube-proxy serves every node.
    services_node_ip: str | None = None

    @property
    def runs_shared_services(self) -> bool:
        """Whether kube-proxy and the cluster DNS run with this node (the namespace's first)."""
        return self.services_node_ip is None

    @property
    def dns_ip(self) -> str:
        return self.services_node_ip or self.node_ip

    @property
    def runtime_binary(self) -> str:
        """What containerd runs as runc: runc itself, or the sample-host wrapper in front of it."""
        return str(self.work_dir / "runc-sample-host") if self.sample_host else self.runc

    @property
    def containerd_root(self) -> Path:
        return self.work_dir / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.work_dir / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.work_dir / "containerd" / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.work_dir / "cni" / "net.d"

    @property
    def hosts_dir(self) -> Path:
        return self.work_dir / "dns"

    @property
    def kubelet_root(self) -> Path:
        return self.work_dir / "kubelet"

    @property
    def pod_logs_dir(self) -> Path:
        """Not the machine's /var/log/pods: a kubelet removes the log directories of pods it does
        not know there, another node's included."""
        return self.work_dir / "pod-logs"


def containerd_config(layout: NodeLayout) -> str:
    """containerd's TOML (version 2 schema of containerd 1.6): own root, state and socket, so it
    never meets another containerd on the machine."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f'root = "{layout.containerd_root}"',
        f'state = "{layout.containerd_state}"',
        "[grpc]",
        f'  address = "{layout.containerd_socket}"',
        f"[{cri}]",
        f'  sandbox_image = "{layout.sandbox_image}"',
        # This machine's root lacks CAP_SYS_RESOURCE: the sandbox's oom_score_adj of -998 is
        # refused (runc: "can't get final child's PID from pipe: EOF") unless it is restricted.
        "  restrict_oom_score_adj = true",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        # runc, not crun: crun 1.8 refuses hybrid cgroups ("cgroups in hybrid mode not supported").
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        f'  BinaryName = "{layout.runtime_binary}"',
        f"[{cri}.cni]",
        f'  bin_dir = "{layout.cni_bin_dir}"',
        f'  conf_dir = "{layout.cni_conf_dir}"',
        "",
    ]
    return "\n".join(lines)


def sample_host_runc_script(layout: NodeLayout, python: str) -> str:
    """The runc containerd runs when the node has a sample host: `create` goes through
    sample_host_runc.py (which rewrites the validator's /host mounts), every other call to runc
    directly (probes exec through it: no interpreter on their path)."""
    wrapper = Path(__file__).with_name("sample_host_runc.py")
    return ("#!/bin/sh\n"
            f'case " $* " in *" create "*|*" run "*) exec "{python}" "{wrapper}" "{layout.runc}" '
            f'"{layout.sample_host}" "$@";; esac\n'
            f'exec "{layout.runc}" "$@"\n')


def cni_conflist(layout: NodeLayout) -> str:
    """bridge (the gateway is the bridge's address) + host-local IPAM, portmap, and loopback is
    configured by containerd itself for every sandbox from the same bin_dir."""
    gateway = layout.pod_subnet.rsplit(".", 1)[0] + ".1"
    conf = {
        "cniVersion": "1.0.0",
        "name": "rankops",
        "plugins": [
            {"type": "bridge", "bridge": layout.bridge, "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": layout.pod_subnet,
                                                          "gateway": gateway}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(layout.work_dir / "cni" / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_config(layout: NodeLayout) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",     # no systemd runs here
        "failSwapOn": False,
        "failCgroupV1": False,          # cgroup v1 (hybrid) here; v1.35 refuses it otherwise
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        # The API server reaches the kubelet (logs, exec) with no client certificate: the dev
        # node lets it. Nothing outside the namespace can reach this address.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": layout.node_ip,
        "healthzBindAddress": layout.node_ip,  # not loopback's port 10248, which one kubelet holds
        "podLogsDir": str(layout.pod_logs_dir),
        "resolvConf": "",  # pods get the cluster's DNS only; the host's resolvers are outside
        "clusterDNS": [layout.dns_ip] if layout.cluster_dns else [],
        "clusterDomain": "cluster.local",
        "enforceNodeAllocatable": [],
        "cgroupsPerQOS": True,
        **({"cgroupRoot": layout.cgroup_root} if layout.cgroup_root != "/" else {}),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A shared dev machine's disk is often fuller than the default thresholds.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "maxPods": 30,
    }
    if layout.cpu_manager_policy == "static":
        # The static policy needs a reservation; 100m of kube-reserved CPU is rounded up to one
        # whole core kept out of the exclusive pool, while the scheduler still sees capacity - 100m
        # (on 2 cores: 1.9 allocatable, one core to give exclusively).
        config["cpuManagerPolicy"] = "static"
        config["kubeReserved"] = {"cpu": "100m"}
        config["cpuManagerReconcilePeriod"] = "5s"
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(layout: NodeLayout, kubeconfig: Path) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": layout.node_name,
        "bindAddress": layout.node_ip,
        "clusterCIDR": layout.cluster_pod_cidr or layout.pod_subnet,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # nf_conntrack_max and the TCP timeouts are machine-wide; inside a network namespace they
        # cannot be set. Zero leaves them as they are.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def containerd_command(config_path: Path) -> list[str]:
    return ["containerd", "--config", str(config_path)]


def kubelet_command(binary: Path, layout: NodeLayout, config_path: Path, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={config_path}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={layout.kubelet_root}", f"--hostname-override={layout.node_name}",
            f"--node-ip={layout.node_ip}", "--v=1"]


def kube_proxy_command(binary: Path, config_path: Path) -> list[str]:
    return [str(binary), f"--config={config_path}", "--v=1"]


def ctr_command(layout: NodeLayout, *args: str) -> list[str]:
    return ["ctr", "--address", str(layout.containerd_socket), "-n", "k8s.io", *args]


def gpu_capacity_patch(count: int) -> list[dict]:
    """JSON patch of a node's status advertising `count` nvidia.com/gpu (an extended resource the
    kubelet keeps: the documented way without a device plugin). Allocatable too: the scheduler
    reads allocatable, which the kubelet would otherwise copy over only at its next status
    update (up to 10 s: the first GPU pod was refused "Insufficient nvidia.com/gpu" for 9 s)."""
    return [{"op": "add", "path": f"/status/{field}/nvidia.com~1gpu", "value": str(count)}
            for field in ("capacity", "allocatable")]
