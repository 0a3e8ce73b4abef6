"""Simulated validators (dev demo, e2e): each sample host gives its verdict with the nvidia-smi
output it would have, and a pod's command line, as the operator renders it, parses with the
validator's own parser into the pool's requirements."""
from __future__ import annotations

import json

import pytest

from rankops.api.gpunodepool import GpuNodePool, NodeRequirements
from rankops_dev.node_validators import (HEALTHY, plan_runs, rollout_complete,
                                         validator_arguments)
from rankops.validator import gpu
from rankops.validator.daemonset import render_validator
from rankops.validator.host import HostView
from rankops.validator.report import render_text, requirements_digest, validate_host
from rankops_dev import sample_hosts as trees


@pytest.mark.parametrize("name", sorted(trees.SCENARIOS))
def test_scenario_verdict_with_its_nvidia_smi_output(build_host, name):
    scenario = trees.SCENARIOS[name]
    host = HostView(build_host(name))
    xml = trees.nvidia_smi_xml(name)
    report = validate_host(host, NodeRequirements.model_validate(scenario.requirements),
                           gpu.gather(host, xml and str(xml), use_nvml=False))
    assert report.ready is scenario.ready, render_text(report)
    assert tuple(check.id for check in report.blocking) == scenario.blocking, render_text(report)
    assert (report.gpu_source == "nvidia-smi -q -x") is scenario.nvidia_smi, render_text(report)


def _pool(taint: bool) -> GpuNodePool:
    return GpuNodePool.model_validate({
        "metadata": {"name": "t4-pool", "uid": "u-1"},
        "spec": {"nodeSelector": {"node.kubernetes.io/instance-type": "g4dn.xlarge"},
                 "requirements": trees.T4_REQUIREMENTS, "taintFailingNodes": taint}})


def _pod(daemonset: dict, name: str, node: str | None, deleting: bool = False) -> dict:
    template = daemonset["spec"]["template"]
    meta = {"name": name, "uid": f"uid-{name}", **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "spec": {**template["spec"], **({"nodeName": node} if node else {})}}


@pytest.mark.parametrize("taint", [True, False])
def test_rendered_daemonset_args_parse_into_the_pools_requirements(taint):
    pool = _pool(taint)
    [daemonset] = render_validator(pool, namespace="rankops-system", service_account="validator-sa")
    pods = [_pod(daemonset, "v-a", "kwok-t4-0"), _pod(daemonset, "v-b", "kwok-t4-1"),
            _pod(daemonset, "v-old", "kwok-t4-1", deleting=True), _pod(daemonset, "v-unscheduled", None)]

    runs = plan_runs(pods, {"kwok-t4-1": "nouveau-loaded"})

    assert [(r.node, r.scenario, r.pod, r.service_account) for r in runs] == [
        ("kwok-t4-0", HEALTHY, "v-a", "validator-sa"), ("kwok-t4-1", "nouveau-loaded", "v-b", "validator-sa")]
    args = validator_arguments(runs[0].args)
    requirements = NodeRequirements.model_validate(json.loads(args.requirements))
    assert requirements_digest(requirements) == requirements_digest(pool.spec.requirements)
    assert args.pool_name == "t4-pool" and args.taint_failing_nodes is taint and args.host_root == "/host"


def test_plan_refuses_nodes_without_a_validator_and_unknown_scenarios():
    [daemonset] = render_validator(_pool(True), namespace="rankops-system", service_account="sa")
    pods = [_pod(daemonset, "v-a", "kwok-t4-0")]
    with pytest.raises(ValueError, match="no validator pod on node.*kwok-l4-0"):
        plan_runs(pods, {"kwok-l4-0": HEALTHY})
    with pytest.raises(ValueError, match="unknown host scenario.*broken"):
        plan_runs(pods, {"kwok-t4-0": "broken"})
    with pytest.raises(ValueError, match="two live validator pods"):
        plan_runs(pods + [_pod(daemonset, "v-b", "kwok-t4-0")], {})


def test_validator_arguments_refuse_what_the_pod_would():
    with pytest.raises(ValueError, match="refuse"):
        validator_arguments(("validate-node", "--no-such-flag"))
    with pytest.raises(ValueError, match="not a node-patching"):
        validator_arguments(("validate-node", "--host-root", "/host"))


@pytest.mark.parametrize("status, generation, done", [
    ({"observedGeneration": 2, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2,
      "currentNumberScheduled": 2, "numberAvailable": 2}, 2, True),
    ({"observedGeneration": 1, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2,
      "currentNumberScheduled": 2, "numberAvailable": 2}, 2, False),   # spec change not seen yet
    ({"observedGeneration": 2, "desiredNumberScheduled": 2, "updatedNumberScheduled": 1,
      "currentNumberScheduled": 2, "numberAvailable": 2}, 2, False),   # one old pod left
    ({"observedGeneration": 2, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2,
      "currentNumberScheduled": 2, "numberAvailable": 1}, 2, False),
])
def test_rollout_complete(status, generation, done):
    assert rollout_complete({"metadata": {"generation": generation}, "status": status}) is done
