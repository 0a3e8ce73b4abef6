"""Shared test settings.

A test that runs a reconcile through the controllers builds its own (controller/runtime.py): a
ModelController whose clock and queue are not started kicks nothing on its own, so nothing it
schedules runs later, in another test, against another test's fake API."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

BIN_DIR = Path(os.environ.get("RANKOPS_K8S_BIN", Path.home() / ".cache/rankops/k8s/v1.34.4/bin"))


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """etcd and a real API server (the local control plane's, no controllers), one per test module."""
    from rankops_dev.controlplane import LocalControlPlane

    missing = [b for b in ("etcd", "kube-apiserver") if not os.access(BIN_DIR / b, os.X_OK)]
    if missing:
        pytest.fail(f"{missing} not in {BIN_DIR}: run dev/rankops_dev/build.sh first (CI does)")
    with LocalControlPlane(BIN_DIR, work_dir=tmp_path_factory.mktemp("cp")) as cp:
        yield cp
