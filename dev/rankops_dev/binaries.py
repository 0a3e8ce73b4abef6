"""Where the local control plane's binaries live, and building them when they are missing.

`build.sh` beside this file is the one place that knows how to build them (the README and CI
call it too); this module only finds its cache and runs it.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).with_name("build.sh")
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                          "kubectl", "kwok")
ALL_BINARIES = CONTROL_PLANE_BINARIES + ("helm",)
NODE_BINARIES = ("kubelet", "kube-proxy")  # the real node's (real_node.py): `build.sh kubelet kube-proxy`


class BinariesMissing(RuntimeError):
    """The binaries are not built and building them failed or was not allowed."""


def k8s_version() -> str:
    """The pinned Kubernetes release: $K8S_VERSION, else build.sh's default (one source)."""
    if os.environ.get("K8S_VERSION"):
        return os.environ["K8S_VERSION"]
    match = re.search(r"^K8S_VERSION=\$\{K8S_VERSION:-(v[0-9.]+)\}", BUILD_SCRIPT.read_text(), re.M)
    if not match:
        raise BinariesMissing(f"{BUILD_SCRIPT}: no K8S_VERSION default line found")
    return match.group(1)


def bin_dir() -> Path:
    """The cache directory build.sh fills (same defaults as the script)."""
    if os.environ.get("RANKOPS_K8S_BIN"):
        return Path(os.environ["RANKOPS_K8S_BIN"])
    cache = Path(os.environ.get("RANKOPS_CACHE") or Path.home() / ".cache" / "rankops")
    return cache / "k8s" / k8s_version() / "bin"


def missing_binaries(directory: Path, names: tuple[str, ...] = ALL_BINARIES) -> list[str]:
    return [name for name in names if not os.access(directory / name, os.X_OK)]


def ensure_binaries(build: bool = True) -> Path:
    """Return the bin directory, running build.sh first if anything is missing.

    The build prints its progress on stderr (inherited); a cold build takes tens of minutes.
    """
    directory = bin_dir()
    missing = missing_binaries(directory)
    if not missing:
        return directory
    if not build:
        raise BinariesMissing(f"missing in {directory}: {', '.join(missing)}; "
                              f"build them with: bash {BUILD_SCRIPT}")
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise BinariesMissing(f"{BUILD_SCRIPT} failed (exit {result.returncode}); "
                              "its progress and errors are printed above")
    lines = result.stdout.strip().splitlines()
    directory = Path(lines[-1]) if lines else directory
    still = missing_binaries(directory)
    if still:
        raise BinariesMissing(f"{BUILD_SCRIPT} finished but {', '.join(still)} not in {directory}")
    return directory


def ensure_node_binaries() -> Path:
    """The bin directory with the real node's kubelet and kube-proxy in it (same release as the
    control plane), running `build.sh kubelet kube-proxy` if either is missing."""
    directory = bin_dir()
    if not missing_binaries(directory, NODE_BINARIES):
        return directory
    result = subprocess.run(["bash", str(BUILD_SCRIPT), *NODE_BINARIES], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise BinariesMissing(f"{BUILD_SCRIPT} {' '.join(NODE_BINARIES)} failed (exit {result.returncode})")
    still = missing_binaries(directory, NODE_BINARIES)
    if still:
        raise BinariesMissing(f"{BUILD_SCRIPT} finished but {', '.join(still)} not in {directory}")
    return directory
