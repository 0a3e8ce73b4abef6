"""Issue 37, item 4 (the validator's part): a stuck validator is restarted, its API calls end, it
runs at a priority that keeps it on its node, and the image override of the operator reaches it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rankops.api.gpunodepool import GpuNodePool
from rankops.validator import heartbeat
from rankops.validator.daemonset import (DEFAULT_PRIORITY_CLASS, DEFAULT_SERVICE_ACCOUNT, HEARTBEAT,
                                         HEARTBEAT_INTERVALS, render_validator)
from rankops.validator.node import API_TIMEOUT, run_on_node


def _pool(**validator) -> GpuNodePool:
    return GpuNodePool.model_validate({"metadata": {"name": "t4-pool"},
                                       "spec": {"nodeSelector": {"pool": "t4"}, "validator": validator}})


def _container(ds: dict) -> dict:
    return ds["spec"]["template"]["spec"]["containers"][0]


def test_the_daemonset_probes_a_heartbeat_of_three_intervals():
    [ds] = render_validator(_pool(intervalSeconds=120), "ns")
    container = _container(ds)
    args = container["args"]
    assert args[args.index("--heartbeat") + 1] == HEARTBEAT
    assert any(m["mountPath"] == os.path.dirname(HEARTBEAT) for m in container["volumeMounts"]), "writable"
    probe = container["livenessProbe"]
    command = probe["exec"]["command"]
    assert command[:4] == ["python3", "-m", "rankops.validator.heartbeat", HEARTBEAT]
    assert command[command.index("--max-age") + 1] == str(HEARTBEAT_INTERVALS * 120) == "360"
    assert probe["timeoutSeconds"] <= probe["periodSeconds"]


def test_the_probe_command_fails_on_a_missing_or_old_heartbeat(tmp_path):
    beat = tmp_path / "heartbeat"
    probe = [sys.executable, "-m", "rankops.validator.heartbeat", str(beat), "--max-age", "900"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    missing = subprocess.run(probe, capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 1 and "missing" in missing.stderr
    heartbeat.touch(str(beat))
    assert subprocess.run(probe, env=env, timeout=60).returncode == 0
    old = time.time() - 901
    os.utime(beat, (old, old))
    stale = subprocess.run(probe, capture_output=True, text=True, env=env, timeout=60)
    assert stale.returncode == 1 and "stuck" in stale.stderr
    assert heartbeat.main([str(beat), "--max-age", "1000"]) == 0


class RecordingApi:
    """CoreV1Api's read_node/patch_node, noting the keyword arguments of each call."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.fail = fail

    def read_node(self, name, **kwargs):
        self.calls.append(("read_node", kwargs))
        if self.fail:
            raise self.fail
        return {"metadata": {"name": name, "labels": {"pool": "t4"}},
                "status": {"capacity": {"nvidia.com/gpu": "1"}}}

    def patch_node(self, name, body, **kwargs):
        self.calls.append(("patch_node", kwargs))


POOLS = lambda: [{"metadata": {"name": "t4-pool", "creationTimestamp": "2026-01-01T00:00:00Z"},  # noqa: E731
                  "spec": {"nodeSelector": {"pool": "t4"}}}]


def test_every_api_call_of_the_validator_has_a_timeout(build_host):
    api = RecordingApi()
    run_on_node("gpu-1", str(build_host()), "t4-pool", 300, once=True, use_nvml=False, api=api, pools=POOLS)
    assert [name for name, _ in api.calls] == ["read_node", "patch_node"]
    assert all(kwargs.get("_request_timeout") == API_TIMEOUT for _, kwargs in api.calls), api.calls
    connect, read = API_TIMEOUT
    assert 0 < connect <= read <= 60


def test_each_round_touches_the_heartbeat_even_when_the_api_fails(build_host, tmp_path):
    beat = tmp_path / "heartbeat"
    rounds = []

    def sleep(_):
        rounds.append(os.stat(beat).st_mtime)
        os.utime(beat, (0, 0))   # aged: the next round must touch it again
        if len(rounds) == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_on_node("gpu-1", str(build_host()), "t4-pool", 60, use_nvml=False, api=RecordingApi(RuntimeError("timed out")),
                    pools=POOLS, sleep=sleep, heartbeat_file=str(beat))
    assert len(rounds) == 2 and all(mtime > time.time() - 60 for mtime in rounds)


def test_the_validator_has_a_priority_class_by_default_and_none_when_asked():
    [ds] = render_validator(_pool(), "ns")
    assert ds["spec"]["template"]["spec"]["priorityClassName"] == DEFAULT_PRIORITY_CLASS == "system-node-critical"
    [ds] = render_validator(_pool(), "ns", priority_class_name="gpu-agents")
    assert ds["spec"]["template"]["spec"]["priorityClassName"] == "gpu-agents"
    [ds] = render_validator(_pool(), "ns", priority_class_name="")
    assert "priorityClassName" not in ds["spec"]["template"]["spec"]


def test_the_operators_validator_image_replaces_the_pools():
    """pools.reconcile passes --validator-image as image=: it used to be a TypeError."""
    [ds] = render_validator(_pool(image="quay.io/x/v:1"), "ns", image="mirror.corp/rankops-validator:1")
    assert _container(ds)["image"] == "mirror.corp/rankops-validator:1"
    [ds] = render_validator(_pool(image="quay.io/x/v:1"), "ns")
    assert _container(ds)["image"] == "quay.io/x/v:1"


def test_one_default_validator_service_account_name():
    from rankops.commands.render import render_documents
    import argparse

    from rankops.commands import run
    from rankops.controller.context import OperatorContext
    from rankops_dev.operator_process import VALIDATOR_SERVICE_ACCOUNT

    [ds] = render_documents([("pool", {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
                                       "metadata": {"name": "t4-pool"}, "spec": {"nodeSelector": {"pool": "t4"}}})])
    names = {ds["spec"]["template"]["spec"]["serviceAccountName"], OperatorContext().validator_service_account,
             VALIDATOR_SERVICE_ACCOUNT}
    parser = argparse.ArgumentParser()
    run.add_commands(parser.add_subparsers())
    names.add(parser.parse_args(["run"]).validator_service_account)
    assert names == {DEFAULT_SERVICE_ACCOUNT} == {"rankops-operator-validator"}
