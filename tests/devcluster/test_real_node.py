"""The real node's pure parts: configuration files, command lines, the pause image's archive,
the mounts it removes, the check's pods, and the forwarder (on loopback, with its dial replaced).

The node itself runs in `scripts/real-node-check.sh` (root, containerd, a network namespace):
not in this suite (issue 38, item 3 brings real nodes into the e2e run).
"""
from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import tarfile
import threading
import tomllib
from pathlib import Path

import pytest
import yaml

from rankops_dev import netns as ns
from rankops_dev import real_node_config as cfg
from rankops_dev.controlplane import serving_sans
from rankops_dev.pause_image import PAUSE_IMAGE, write_archive
from rankops_dev.real_node import archive_image_name, mounts_under
from rankops_dev.real_node_check import client_pod, triton_pod

BUILD_SH = Path(__file__).resolve().parents[2] / "dev" / "rankops_dev" / "build.sh"
LAYOUT = cfg.NodeLayout(Path("/w/node"), "n0", "10.200.0.1", "10.245.0.0/24", "10.96.0.0/16")


def test_containerd_config_is_its_own_and_fits_this_machine():
    conf = tomllib.loads(cfg.containerd_config(LAYOUT))
    assert (conf["root"], conf["state"]) == ("/w/node/containerd/root", "/w/node/containerd/state")
    assert conf["grpc"]["address"] == "/w/node/containerd/containerd.sock"
    cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # root here lacks CAP_SYS_RESOURCE
    assert cri["sandbox_image"] == LAYOUT.sandbox_image
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["BinaryName"] == "/usr/sbin/runc"  # crun refuses hybrid cgroups
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": "/w/node/cni/net.d"}


def test_cni_conflist_bridge_host_local_portmap():
    conf = json.loads(cfg.cni_conflist(LAYOUT))
    bridge, portmap = conf["plugins"]
    assert bridge["type"] == "bridge" and bridge["isGateway"] and not bridge["ipMasq"]
    assert bridge["ipam"]["type"] == "host-local"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.245.0.0/24", "gateway": "10.245.0.1"}]]
    assert bridge["ipam"]["dataDir"].startswith("/w/node/")  # not the machine's /var/lib/cni
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}


def test_kubelet_config():
    conf = yaml.safe_load(cfg.kubelet_config(LAYOUT))
    assert conf["kind"] == "KubeletConfiguration"
    assert conf["cgroupDriver"] == "cgroupfs" and conf["failSwapOn"] is False
    assert conf["failCgroupV1"] is False
    assert conf["containerRuntimeEndpoint"] == "unix:///w/node/containerd/containerd.sock"
    assert conf["address"] == "10.200.0.1"
    assert conf["healthzBindAddress"] == "10.200.0.1"   # loopback's port would be one kubelet's
    assert conf["podLogsDir"] == "/w/node/pod-logs"     # another kubelet removes logs it does not know
    assert "cgroupRoot" not in conf                     # the first node: the machine's root, as ever


def test_a_second_node_has_its_own_of_everything_and_shares_the_first_s_proxy_and_dns():
    import dataclasses

    second = dataclasses.replace(LAYOUT, work_dir=Path("/w/node-1"), node_name="n1", node_ip="10.200.0.2",
                                 pod_subnet="10.245.1.0/24", bridge="rkbr1", cgroup_root="/n1",
                                 cluster_pod_cidr="10.245.0.0/16", services_node_ip="10.200.0.1")
    assert LAYOUT.runs_shared_services and not second.runs_shared_services
    kubelet = yaml.safe_load(cfg.kubelet_config(second))
    assert kubelet["cgroupRoot"] == "/n1"             # its own kubepods: no kubelet cleans up the other's pods
    assert kubelet["clusterDNS"] == ["10.200.0.1"]    # the first node's dnsmasq
    assert (kubelet["address"], kubelet["healthzBindAddress"]) == ("10.200.0.2", "10.200.0.2")
    assert kubelet["containerRuntimeEndpoint"] == "unix:///w/node-1/containerd/containerd.sock"
    assert kubelet["podLogsDir"] == "/w/node-1/pod-logs"
    containerd = tomllib.loads(cfg.containerd_config(second))
    assert (containerd["root"], containerd["grpc"]["address"]) == ("/w/node-1/containerd/root",
                                                                   "/w/node-1/containerd/containerd.sock")
    [bridge, _] = json.loads(cfg.cni_conflist(second))["plugins"]
    assert bridge["bridge"] == "rkbr1"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.245.1.0/24", "gateway": "10.245.1.1"}]]
    assert bridge["ipam"]["dataDir"].startswith("/w/node-1/")
    assert "--root-dir=/w/node-1/kubelet" in cfg.kubelet_command(Path("/b/kubelet"), second, Path("/k"), Path("/kc"))
    # The one kube-proxy (the first node's) does not masquerade the second node's pods.
    first = dataclasses.replace(LAYOUT, cluster_pod_cidr="10.245.0.0/16")
    assert yaml.safe_load(cfg.kube_proxy_config(first, Path("/kc")))["clusterCIDR"] == "10.245.0.0/16"


def test_a_cluster_s_nodes_get_addresses_ranges_and_cgroup_roots_of_their_own(tmp_path):
    from rankops_dev.real_cluster import RealCluster

    cluster = RealCluster(tmp_path / "images", tmp_path / "work", name="rk", real_nodes=3,
                          cpu_manager_policy="static")
    layouts = [cluster._layout(index, None) for index in range(3)]
    assert [lay.node_name for lay in layouts] == ["rk-node-0", "rk-node-1", "rk-node-2"]
    for field in ("work_dir", "node_ip", "pod_subnet", "bridge", "containerd_socket", "kubelet_root",
                  "pod_logs_dir"):
        assert len({getattr(lay, field) for lay in layouts}) == 3, field
    assert layouts[0].work_dir == tmp_path / "work" / "node"   # the one-node cluster's, as before
    assert (layouts[0].node_ip, layouts[0].pod_subnet, layouts[0].cgroup_root) == ("10.200.0.1", "10.245.0.0/24", "/")
    assert [lay.cgroup_root for lay in layouts[1:]] == ["/rk-node-1", "/rk-node-2"]
    assert [lay.services_node_ip for lay in layouts] == [None, "10.200.0.1", "10.200.0.1"]
    # A second static CPU manager would hand out the first's exclusive cores again.
    assert [lay.cpu_manager_policy for lay in layouts] == ["static", "none", "none"]


def test_the_static_cpu_manager_is_asked_for_with_a_reservation_it_rounds_up_to_a_core():
    import dataclasses

    assert "cpuManagerPolicy" not in yaml.safe_load(cfg.kubelet_config(LAYOUT))  # none: the default
    conf = yaml.safe_load(cfg.kubelet_config(dataclasses.replace(LAYOUT, cpu_manager_policy="static")))
    assert conf["cpuManagerPolicy"] == "static"
    assert conf["kubeReserved"] == {"cpu": "100m"}  # the kubelet refuses the static policy without one


def test_kube_proxy_config_iptables_and_no_machine_wide_sysctls():
    conf = yaml.safe_load(cfg.kube_proxy_config(LAYOUT, Path("/w/node/kc")))
    assert conf["mode"] == "iptables" and conf["hostnameOverride"] == "n0"
    assert conf["clusterCIDR"] == "10.245.0.0/24"
    assert conf["clientConnection"]["kubeconfig"] == "/w/node/kc"
    assert conf["conntrack"]["maxPerCore"] == 0
    assert conf["conntrack"]["tcpEstablishedTimeout"] == "0s"


def test_command_lines():
    kubelet = cfg.kubelet_command(Path("/b/kubelet"), LAYOUT, Path("/w/k.yaml"), Path("/w/kc"))
    assert kubelet[0] == "/b/kubelet"
    assert {"--config=/w/k.yaml", "--kubeconfig=/w/kc", "--root-dir=/w/node/kubelet",
            "--hostname-override=n0", "--node-ip=10.200.0.1"} <= set(kubelet)
    assert cfg.kube_proxy_command(Path("/b/kube-proxy"), Path("/w/p.yaml"))[:2] == ["/b/kube-proxy", "--config=/w/p.yaml"]
    assert cfg.ctr_command(LAYOUT, "images", "ls") == [
        "ctr", "--address", "/w/node/containerd/containerd.sock", "-n", "k8s.io", "images", "ls"]


def test_gpu_patch_escapes_the_slash():
    assert cfg.gpu_capacity_patch(2) == [
        {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "2"},
        {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": "2"}]


def test_netns_commands_enter_with_nsenter_not_ip_netns_exec():
    commands = ns.create_commands("rk", "10.200.0.1", "10.200.0.2")
    assert commands[0] == ["ip", "netns", "add", "rk"]
    for command in commands[1:]:  # `ip netns exec` remounts /sys and hides the cgroup mounts
        assert command[:2] == ["nsenter", "--net=/var/run/netns/rk"]
    assert ["nsenter", "--net=/var/run/netns/rk", "ip", "addr", "add", "10.200.0.1/32", "dev", "lo"] in commands
    assert ["nsenter", "--net=/var/run/netns/rk", "ip", "addr", "add", "10.200.0.2/32", "dev", "lo"] in commands
    assert ns.delete_command("rk") == ["ip", "netns", "delete", "rk"]


def test_serving_certificate_names():
    sans = serving_sans("10.200.0.1", "10.96.0.0/16").split(",")
    assert {"IP:127.0.0.1", "IP:10.200.0.1", "IP:10.96.0.1", "DNS:kubernetes.default.svc"} <= set(sans)
    assert serving_sans("127.0.0.1", "10.96.0.0/16").count("IP:127.0.0.1") == 1


def test_pause_archive_is_an_oci_layout_named_for_import(tmp_path):
    archive = write_archive(b"\x7fELF-not-really", tmp_path / "pause.tar")
    assert archive_image_name(archive) == PAUSE_IMAGE
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        assert {"oci-layout", "index.json"} <= names
        for name in names - {"oci-layout", "index.json"}:
            data = tar.extractfile(name).read()
            assert name == f"blobs/sha256/{hashlib.sha256(data).hexdigest()}"
        index = json.load(tar.extractfile("index.json"))
        manifest = json.load(tar.extractfile("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))
        config = json.load(tar.extractfile("blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    assert write_archive(b"\x7fELF-not-really", tmp_path / "again.tar").read_bytes() == archive.read_bytes()


def test_mounts_under_deepest_first_and_only_under_root():
    info = "\n".join(f"1 2 0:1 / {p} rw - tmpfs t rw" for p in
                     ["/", "/w/node", "/w/node/kubelet", "/w/node/kubelet/pods/x/vol", "/w/nodes", "/other"])
    assert mounts_under(Path("/w/node"), info) == ["/w/node/kubelet/pods/x/vol", "/w/node/kubelet", "/w/node"]


def test_check_pods_run_restricted_from_local_images():
    triton = triton_pod("localhost/rankops-triton-test:x", Path("/w/models"), "n0")
    (container,) = triton["spec"]["containers"]
    assert container["imagePullPolicy"] == "Never"
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == 1000 and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert {"name": "tmp", "emptyDir": {}} in triton["spec"]["volumes"]  # the Python backend writes /tmp
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    client = client_pod("localhost/rankops-operator:x", "n0")
    assert client["spec"]["containers"][0]["securityContext"]["runAsUser"] == 1001
    assert "TRITON_SERVICE_HOST" in client["spec"]["containers"][0]["command"][-1]


def test_forwarder_pumps_both_ways(monkeypatch):
    upstream = socket.create_server(("127.0.0.1", 0))
    dialled = []

    def echo() -> None:
        conn, _ = upstream.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()

    def dial(name: str, target: tuple[str, int]) -> socket.socket:
        dialled.append((name, target))
        return socket.create_connection(("127.0.0.1", upstream.getsockname()[1]))

    forwarder = ns.Forwarder("rk", 0, ("10.200.0.1", 6443), dial=dial)
    try:
        with socket.create_connection(("127.0.0.1", forwarder.port), timeout=5) as client:
            client.sendall(b"hello")
            assert client.recv(1024) == b"HELLO"
        assert dialled == [("rk", ("10.200.0.1", 6443))]
    finally:
        forwarder.close()
        upstream.close()


def test_build_sh_refuses_an_unknown_target():
    result = subprocess.run(["bash", str(BUILD_SH), "kubelett"], capture_output=True, text=True)
    assert result.returncode == 2 and "targets: kubelet kube-proxy" in result.stderr


def test_dnsmasq_answers_cluster_names_only_and_forwards_nothing():
    from rankops_dev.cluster_dns import dnsmasq_command

    command = dnsmasq_command("10.200.0.1", Path("/w/dns"), Path("/w/dnsmasq.pid"))
    assert command[0] == "dnsmasq" and "--keep-in-foreground" in command
    assert {"--no-resolv", "--no-hosts", "--local=/cluster.local/", "--listen-address=10.200.0.1",
            "--bind-interfaces", "--hostsdir=/w/dns", "--conf-file=/dev/null"} <= set(command)
    assert not [arg for arg in command if arg.startswith(("--server", "--resolv-file"))]


def test_hosts_lines_one_a_service_headless_left_out():
    from rankops_dev.cluster_dns import hosts_lines

    services = [{"metadata": {"name": "triton", "namespace": "default"}, "spec": {"clusterIP": "10.96.3.4"}},
                {"metadata": {"name": "head", "namespace": "x"}, "spec": {"clusterIP": "None"}},
                {"metadata": {"name": "kubernetes", "namespace": "default"}, "spec": {"clusterIP": "10.96.0.1"}}]
    assert hosts_lines(services) == ("10.96.0.1 kubernetes.default.svc.cluster.local\n"
                                     "10.96.3.4 triton.default.svc.cluster.local\n")


def test_kubelet_points_pods_at_the_cluster_dns():
    conf = yaml.safe_load(cfg.kubelet_config(LAYOUT))
    assert conf["clusterDNS"] == ["10.200.0.1"] and conf["clusterDomain"] == "cluster.local"
    assert conf["resolvConf"] == ""  # the host's resolvers are outside the namespace


def test_a_second_kubelet_s_cgroup_root_is_made_in_every_hierarchy_and_removed_whole(tmp_path, monkeypatch):
    from rankops_dev import real_node

    monkeypatch.setattr(real_node, "CGROUP_ROOT", tmp_path)
    for hierarchy in ("cpuset", "memory", "unified"):
        (tmp_path / hierarchy).mkdir()
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    (tmp_path / "memory" / "kubepods" / "burstable").mkdir(parents=True)   # the first node's

    real_node.make_cgroup_root("/rk-node-1")
    for hierarchy in ("cpuset", "memory", "unified"):
        assert (tmp_path / hierarchy / "rk-node-1").is_dir(), hierarchy
    (tmp_path / "cpuset" / "rk-node-1" / "cpuset.cpus").write_text("")   # as a new cpuset is: empty
    (tmp_path / "cpuset" / "rk-node-1" / "cpuset.mems").write_text("")
    real_node.make_cgroup_root("/rk-node-1")
    assert (tmp_path / "cpuset" / "rk-node-1" / "cpuset.cpus").read_text() == "0-1\n"   # the parent's
    (tmp_path / "cpuset" / "rk-node-1" / "cpuset.cpus").unlink()   # a real cgroup's files go with it
    (tmp_path / "cpuset" / "rk-node-1" / "cpuset.mems").unlink()
    (tmp_path / "memory" / "rk-node-1" / "kubepods" / "besteffort").mkdir(parents=True)

    assert tmp_path / "memory" / "rk-node-1" / "kubepods" in real_node._kubepods_cgroups("/rk-node-1")
    assert tmp_path / "memory" / "kubepods" not in real_node._kubepods_cgroups("/rk-node-1")
    assert real_node._remove_cgroups(set(), "/rk-node-1", timeout=0)
    assert not list(tmp_path.glob("*/rk-node-1"))                      # the second node's, whole
    assert (tmp_path / "memory" / "kubepods" / "burstable").is_dir()   # the first node's left alone
