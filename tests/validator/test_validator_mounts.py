"""Issue 37, item 2: the validator mounts only the host paths its checks read, never / nor anything
holding the kubelet's pod directories, and runs with a group of its own (not 0).

The checks see the host through the mounts as they saw it through a mount of /: each path is
mounted at the same place under /host. Proved by recording every host path the checks ask for over
every sample host, and by running the checks on a copy of each sample host made of the mounted
paths alone (what the container sees, as the kubelet would mount it) and comparing the reports.
"""
from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

import pytest

from rankops.api.gpunodepool import GpuNodePool, NodeRequirements
from rankops.validator import gpu
from rankops.validator.daemonset import HOST_MOUNTS, HOST_ROOT, NON_ROOT_GID, render_validator
from rankops.validator.host import HostView
from rankops.validator.report import validate_host
from rankops_dev import sample_hosts as trees

POD_DIRS = "/var/lib/kubelet/pods"
# On every systemd host /var/run is a link to /run: the checks' /var/run/cdi is /run/cdi, mounted.
ALIASES = {"/var/run": "/run"}
# Host trees the sample scenarios do not cover: RKE2's containerd, the GPU Operator's CRI-O hook.
RKE2 = "var/lib/rancher/rke2/agent/etc/containerd"
EXTRA_LAYOUTS = {
    "rke2": ("healthy-rhel89", {"etc/crio": None, "etc/cdi/nvidia.yaml": None,
                                f"{RKE2}/config.toml": '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                                                       'runtime_type = "io.containerd.runc.v2"\n'}),
    "crio-hook-under-run": ("healthy-rhel89", {"etc/crio/crio.conf.d/99-nvidia.toml": None, "etc/cdi/nvidia.yaml": None,
                                               "run/containers/oci/hooks.d/nvidia.json": '{"hook": {"path": '
                                               '"/usr/bin/nvidia-container-toolkit"}}'}),
    "dkms-open": ("healthy-rhel89", {}),
}


def _pool() -> GpuNodePool:
    return GpuNodePool.model_validate({"metadata": {"name": "t4-pool"}, "spec": {"nodeSelector": {"pool": "t4"}}})


def _pod_spec() -> dict:
    [ds] = render_validator(_pool(), "rankops-system")
    return ds["spec"]["template"]["spec"]


def _host_paths(spec: dict) -> dict[str, str]:
    """hostPath path -> type, of every hostPath volume of the pod."""
    return {v["hostPath"]["path"]: v["hostPath"].get("type", "") for v in spec["volumes"] if "hostPath" in v}


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _covered(path: str) -> bool:
    for alias, target in ALIASES.items():
        if _under(path, alias):
            path = target + path[len(alias):]
    return any(_under(path, mounted) for mounted, _ in HOST_MOUNTS)


def test_no_host_path_mount_is_root_or_holds_the_kubelets_pod_directories():
    spec = _pod_spec()
    paths = _host_paths(spec)
    assert paths, "the validator reads the host through hostPath volumes"
    for path in paths:
        assert path != "/" and not _under(POD_DIRS, path), f"hostPath {path} shows {POD_DIRS}"
        assert not _under(path, POD_DIRS)
        # Nor the container runtimes' sockets and state (a socket is reachable through a read-only mount).
        for private in ("/run/containerd", "/var/run/containerd", "/run/crio", "/var/lib/containerd", "/var/lib/kubelet/pki",
                        "/var/lib/kubelet/pod-resources", "/run/secrets", "/var/lib/etcd", "/root"):
            assert not _under(private, path) and not _under(path, private), (path, private)
    [container] = spec["containers"]
    by_name = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        volume = by_name[mount["name"]]
        if "hostPath" in volume:
            assert mount["readOnly"] is True, mount
            assert mount["mountPath"] == HOST_ROOT + volume["hostPath"]["path"], "the checks' layout is the host's"
    assert set(paths) == {path for path, _ in HOST_MOUNTS}


def test_the_validator_runs_with_a_group_of_its_own():
    spec = _pod_spec()
    [container] = spec["containers"]
    for context in (spec["securityContext"], container["securityContext"]):
        assert context["runAsGroup"] == NON_ROOT_GID != 0 and context["runAsUser"] != 0
    assert not spec["securityContext"].get("supplementalGroups") and "fsGroup" not in spec["securityContext"]


class RecordingHost(HostView):
    """A HostView that notes every host path asked for (glob, list, read, link)."""

    def __init__(self, root):
        super().__init__(root)
        self.asked: set[str] = set()

    def _resolve(self, host_path):
        self.asked.add(host_path)
        return super()._resolve(host_path)


def _layouts(build_host):
    for scenario in trees.SCENARIOS:
        yield scenario, build_host(scenario), trees.SCENARIOS[scenario].requirements, trees.nvidia_smi_xml(scenario)
    for name, (scenario, overrides) in EXTRA_LAYOUTS.items():
        yield name, build_host(scenario, overrides), trees.T4_REQUIREMENTS, trees.nvidia_smi_xml(scenario)


def _report(host: HostView, requirements: dict, xml):
    facts = gpu.gather(host, xml and str(xml), use_nvml=False)
    return validate_host(host, NodeRequirements.model_validate(requirements), facts, node="gpu-1", pool="t4-pool")


def test_every_path_the_checks_read_is_mounted(build_host):
    asked: set[str] = set()
    for _, root, requirements, xml in _layouts(build_host):
        host = RecordingHost(root)
        _report(host, requirements, xml)
        asked |= host.asked
    assert {"/etc/os-release", "/proc/driver/nvidia/version", "/var/lib/dkms/nvidia", "/lib/modules/"
            f"{trees.KERNEL}", "/var/lib/kubelet/config.yaml"} <= asked, "the recording sees the checks' reads"
    uncovered = sorted(path for path in asked if not _covered(path))
    assert not uncovered, f"read by the checks but not mounted: {uncovered}"


def mounted_view(host_root: Path, view: Path) -> Path:
    """What the container sees under /host: each HOST_MOUNTS path as the kubelet mounts it (a link
    on the host is followed; a missing *OrCreate path is created empty), nothing else."""
    host = HostView(host_root)
    view.mkdir()
    for path, kind in HOST_MOUNTS:
        source = host.local_path(path)
        target = view / PurePosixPath(path).relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is not None and source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        elif source is not None and source.is_file():
            shutil.copyfile(source, target)
        elif kind == "FileOrCreate":
            target.touch()
        elif kind == "CharDevice":
            continue   # every kernel has it; a sample host without it reads as a node where it is unreadable
        else:
            assert kind == "DirectoryOrCreate", f"hostPath {path} ({kind}) is missing: the pod would not start"
            target.mkdir(parents=True)
    return view


def test_the_checks_judge_the_mounts_as_they_judged_the_whole_host(build_host, tmp_path):
    for name, root, requirements, xml in _layouts(build_host):
        # What the mount of / showed and the mounts must not: a pod's token and Secret.
        secret = root / "var/lib/kubelet/pods/0f3c/volumes/kubernetes.io~projected/kube-api-access/token"
        secret.parent.mkdir(parents=True)
        secret.write_text("eyJhbGciOi...")
        view = mounted_view(root, tmp_path / f"view-{name}")
        assert HostView(root).exists(f"{POD_DIRS}/0f3c/volumes/kubernetes.io~projected/kube-api-access/token")
        assert not HostView(view).exists(POD_DIRS)
        assert HostView(view).list_dir("/var/lib/kubelet").value == ["config.yaml"], "its config file alone"
        whole, mounted = _report(HostView(root), requirements, xml), _report(HostView(view), requirements, xml)
        assert mounted.ready == whole.ready, name
        assert [(c.id, c.status, c.observed) for c in mounted.checks] == \
               [(c.id, c.status, c.observed) for c in whole.checks], name


@pytest.mark.parametrize("kind", ["Directory", "DirectoryOrCreate", "FileOrCreate"])
def test_mount_kinds_are_the_kubelets(kind):
    assert kind in {k for _, k in HOST_MOUNTS}
