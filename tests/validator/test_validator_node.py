"""Node patch, the one-shot shell loop, pool status aggregation and the DaemonSet."""
from __future__ import annotations

import json

import pytest
import yaml

from rankops.controller.patching import apply_merge_patch
from rankops.api.gpunodepool import GpuNodePool, NodeRequirements
from rankops.cli import main
from rankops.validator import gpu
from rankops.validator.daemonset import render_validator, validator_name
from rankops.validator.host import HostView
from rankops_dev import sample_hosts as trees
from rankops.validator.node import (ANNOTATION_REPORT, LABEL_CUDA, LABEL_DRIVER, LABEL_DRIVER_BRANCH,
                                    LABEL_DRIVER_MINOR, LABEL_LATENCY_TUNED, LABEL_OS, LABEL_POOL,
                                    LABEL_READY, LABEL_TOPOLOGY_ALIGNED, TAINT_KEY, clear_marks_patch, label_value, node_patch,
                                    run_on_node)
from rankops.api.conditions import Condition
from rankops.pool_status import aggregate_pool_status, pool_conditions
from rankops.validator.report import validate_host

REQUIREMENTS = NodeRequirements.model_validate(trees.T4_REQUIREMENTS)
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OUR_TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def _report(build_host, scenario="healthy-rhel89", requirements=REQUIREMENTS, node="gpu-1"):
    host = HostView(build_host(scenario))
    return validate_host(host, requirements, gpu.gather(host, use_nvml=False), node=node, pool="t4-pool")


def _node(name="gpu-1", taints=(), labels=None, annotations=None, gpus=1):
    return {"metadata": {"name": name, "resourceVersion": "42", "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"taints": list(taints)} if taints else {},
            "status": {"capacity": {"cpu": "8", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}}}


def test_labels_and_annotation_of_a_ready_node(build_host):
    patch = node_patch(_report(build_host), "t4-pool", True, _node(taints=[OTHER_TAINT]))
    assert patch["metadata"]["labels"] == {LABEL_READY: "true", LABEL_POOL: "t4-pool", LABEL_DRIVER: "535.104.05",
                                           LABEL_CUDA: "12.2", LABEL_OS: "rhel-8.9",
                                           LABEL_DRIVER_BRANCH: "535", LABEL_DRIVER_MINOR: "104",
                                           # the base host has no CPU sysfs, tuned or kubelet config
                                           LABEL_LATENCY_TUNED: "unknown", LABEL_TOPOLOGY_ALIGNED: "unknown"}
    report = json.loads(patch["metadata"]["annotations"][ANNOTATION_REPORT])
    assert report["ready"] is True and report["node"] == "gpu-1" and "remedy" not in report["checks"][0]
    assert "spec" not in patch  # taints untouched


def test_failing_node_is_tainted_only_when_asked_and_other_taints_survive(build_host):
    report = _report(build_host, "selinux-boolean-off")
    tainted = node_patch(report, "t4-pool", True, _node(taints=[OTHER_TAINT]))
    assert tainted["spec"]["taints"] == [OTHER_TAINT, OUR_TAINT]
    assert tainted["metadata"]["resourceVersion"] == "42" and tainted["metadata"]["labels"][LABEL_READY] == "false"
    assert "spec" not in node_patch(report, "t4-pool", False, _node(taints=[OTHER_TAINT]))
    assert "spec" not in node_patch(report, "t4-pool", True, _node(taints=[OTHER_TAINT, OUR_TAINT]))


def test_taint_removed_when_the_node_passes_or_tainting_is_turned_off(build_host):
    current = _node(taints=[OUR_TAINT, OTHER_TAINT])
    assert node_patch(_report(build_host), "t4-pool", True, current)["spec"]["taints"] == [OTHER_TAINT]
    failing = _report(build_host, "no-toolkit")
    assert node_patch(failing, "t4-pool", False, current)["spec"]["taints"] == [OTHER_TAINT]


def test_unknown_facts_remove_their_labels(build_host):
    labels = node_patch(_report(build_host, "empty", NodeRequirements()), "p", False, _node())["metadata"]["labels"]
    assert labels[LABEL_OS] is None and labels[LABEL_DRIVER] is None and labels[LABEL_READY] == "false"
    assert labels[LABEL_DRIVER_BRANCH] is None and labels[LABEL_DRIVER_MINOR] is None


@pytest.mark.parametrize("driver, branch, minor", [
    ("535.104.05", "535", "104"), ("570.26", "570", "26"), ("560.35.03", "560", "35"),
    ("535", None, None), ("garbage", None, None), (None, None, None),
])
def test_driver_branch_and_minor_labels_are_integers_affinity_can_compare(driver, branch, minor):
    from rankops.validator.node import driver_number_labels
    assert driver_number_labels(driver) == {LABEL_DRIVER_BRANCH: branch, LABEL_DRIVER_MINOR: minor}


@pytest.mark.parametrize("text, value", [
    ("535.104.05", "535.104.05"), ("rhel-8.9", "rhel-8.9"), ("a b/c", "a-b-c"), ("-x-", "x"),
    ("x" * 80, "x" * 63), ("", None), ("---", None), (None, None),
])
def test_label_value(text, value):
    assert label_value(text) == value




NOT_OURS_TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoExecute"}  # same key, someone else's


@pytest.mark.parametrize("scenario, taint_failing", [
    ("healthy-rhel89", True), ("selinux-boolean-off", True), ("selinux-boolean-off", False), ("empty", True),
])
def test_clearing_the_marks_restores_the_node_as_it_was_before_validation(build_host, scenario, taint_failing):
    before = _node(taints=[OTHER_TAINT, NOT_OURS_TAINT, {"key": "dedicated", "effect": "NoExecute"}],
                   labels={"nvidia.com/gpu.product": "Tesla-T4", "rankops.io/other": "kept"},
                   annotations={"note": "kept"})
    marked = apply_merge_patch(before, node_patch(_report(build_host, scenario), "t4-pool", taint_failing, before))
    assert marked != before
    patch = clear_marks_patch(marked)
    assert apply_merge_patch(marked, patch) == before
    assert patch["metadata"]["resourceVersion"] == "42", "a node changed since it was read gets a 409"
    if "spec" in marked and OUR_TAINT in marked["spec"]["taints"]:
        assert patch["spec"]["taints"] == before["spec"]["taints"], "the other taints, exactly, in order"
    else:
        assert "spec" not in patch, "taints are only sent when the rankops taint is there"


def test_clearing_sends_only_the_marks_there_are():
    labels = {LABEL_READY: "false", LABEL_POOL: "t4-pool", "zone": "a"}
    patch = clear_marks_patch(_node(labels=labels, taints=[OUR_TAINT]))
    assert patch == {"metadata": {"labels": {LABEL_READY: None, LABEL_POOL: None}, "resourceVersion": "42"},
                     "spec": {"taints": []}}
    assert clear_marks_patch(_node(labels={"zone": "a"}, taints=[OTHER_TAINT])) == {}
    assert clear_marks_patch({"metadata": {"name": "bare"}}) == {}
    only_annotation = clear_marks_patch({"metadata": {"annotations": {ANNOTATION_REPORT: "{}"}}})
    assert only_annotation == {"metadata": {"annotations": {ANNOTATION_REPORT: None}}}


class FakeCoreApi:
    """read_node/patch_node as kubernetes.client.CoreV1Api has them, recording patches."""

    def __init__(self, node, conflicts=0, fail=None):
        self.node, self.conflicts, self.fail, self.patches = node, conflicts, fail, []

    def read_node(self, name, **_):
        assert name == self.node["metadata"]["name"]
        return self.node

    def patch_node(self, name, body, **_):
        if self.fail:
            raise self.fail
        if self.conflicts:
            self.conflicts -= 1
            error = RuntimeError("Conflict")
            error.status = 409
            raise error
        self.patches.append(body)


def _pool_dict(name, selector, created="2026-01-01T00:00:00Z", **meta):
    return {"metadata": {"name": name, "creationTimestamp": created, **meta}, "spec": {"nodeSelector": selector}}


ONLY_T4 = lambda: [_pool_dict("t4-pool", {"pool": "t4"})]  # noqa: E731 - selects _node(labels={"pool": "t4"})
ONLY_P = lambda: [_pool_dict("p", {"pool": "t4"})]  # noqa: E731


def test_run_on_node_once_patches_and_returns_the_verdict(build_host):
    api = FakeCoreApi(_node(labels={"pool": "t4"}), conflicts=1)
    status = run_on_node("gpu-1", str(build_host("secureboot-unsigned")), "t4-pool", 300, once=True,
                         requirements=REQUIREMENTS, taint_failing=True, use_nvml=False, api=api, pools=ONLY_T4)
    assert status == 1 and len(api.patches) == 1
    assert api.patches[0]["spec"]["taints"] == [OUR_TAINT]
    assert json.loads(api.patches[0]["metadata"]["annotations"][ANNOTATION_REPORT])["blocking"] == ["secure-boot"]


def test_run_on_node_survives_api_errors_and_keeps_looping(build_host):
    api = FakeCoreApi(_node(labels={"pool": "t4"}), fail=RuntimeError("connection refused"))
    assert run_on_node("gpu-1", str(build_host()), "p", 60, once=True, use_nvml=False, api=api, pools=ONLY_P) == 2
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt
    healthy = FakeCoreApi(_node(labels={"pool": "t4"}))
    with pytest.raises(KeyboardInterrupt):
        run_on_node("gpu-1", str(build_host()), "p", 60, use_nvml=False, api=healthy, sleep=sleep, pools=ONLY_P)
    assert sleeps == [60, 60] and len(healthy.patches) == 2


def _pool(**spec):
    return GpuNodePool.model_validate({"metadata": {"name": "t4-pool", "generation": 3},
                                       "spec": {"nodeSelector": {"pool": "t4"}, "requirements": trees.T4_REQUIREMENTS,
                                                **spec}})


def _labelled(build_host, name, scenario, pool="t4-pool", requirements=REQUIREMENTS):
    node = _node(name)
    patch = node_patch(_report(build_host, scenario, requirements, node=name), pool, False, node)
    node["metadata"]["labels"] = {k: v for k, v in patch["metadata"]["labels"].items() if v is not None}
    node["metadata"]["annotations"] = patch["metadata"]["annotations"]
    return node


def test_pool_status_counts_and_groups_failures(build_host):
    nodes = [
        _labelled(build_host, "a", "healthy-rhel89"),
        _labelled(build_host, "b", "selinux-boolean-off"),
        _labelled(build_host, "c", "nouveau-loaded"),
        _labelled(build_host, "d", "selinux-boolean-off"),
        _node("e"),                                                        # validator not run yet
        _labelled(build_host, "f", "healthy-rhel89", requirements=NodeRequirements()),  # older requirements
        _labelled(build_host, "g", "healthy-rhel89", pool="other-pool"),
    ]
    nodes[3]["metadata"]["annotations"][ANNOTATION_REPORT] = "{not json"
    status = aggregate_pool_status(_pool(), nodes)
    assert {k: status[k] for k in ("nodes", "ready", "failing", "pending")} == \
        {"nodes": 7, "ready": 1, "failing": 2, "pending": 4}
    by_check = {entry["check"]: (entry["count"], entry["nodes"]) for entry in status["failingByCheck"]}
    assert by_check["selinux"] == (1, ["b"]) and by_check["nouveau"] == (1, ["c"])
    assert set(by_check) == {"selinux", "nouveau", "nvidia-module", "nvml", "cuda", "driver-version",
                             "gpu-product", "gpu-memory"}


def test_pool_status_is_a_valid_status_object(build_host):
    from rankops.api.gpunodepool import GpuNodePoolStatus
    from rankops.pool_status import pool_status
    status = pool_status(_pool(), [_labelled(build_host, "b", "selinux-boolean-off")], None, GpuNodePoolStatus(), 3,
                         "2024-05-01T00:00:00Z")
    assert isinstance(status, GpuNodePoolStatus) and (status.nodes, status.failing, status.observed_generation) == (1, 1, 3)
    assert [(c.type, c.status, c.reason) for c in status.conditions] == \
        [("Ready", "False", "NoReadyNodes"), ("Degraded", "True", "NodesFailing")]


def test_pool_status_shows_the_ready_nodes_drivers_and_the_newest_triton_they_run(build_host):
    # Issue 16: `kubectl get gnp` shows which Triton releases the pool's drivers run.
    from rankops.api.gpunodepool import GpuNodePool
    ready = _labelled(build_host, "a", "healthy-rhel89")            # 535.104.05
    failing = _labelled(build_host, "b", "selinux-boolean-off")     # not ready: its driver is not counted
    failing["metadata"]["labels"][LABEL_DRIVER] = "470.42.01"
    summary = aggregate_pool_status(_pool(), [ready, failing])
    # 535.104.05 runs 25.10 only through forward compatibility (535.86 or later R535).
    assert (summary["driverVersions"], summary["newestTriton"]) == ("535.104.05", "25.10")
    older = _labelled(build_host, "c", "healthy-rhel89")
    older["metadata"]["labels"][LABEL_DRIVER] = "535.54.03"
    summary = aggregate_pool_status(_pool(), [ready, older])
    assert (summary["driverVersions"], summary["newestTriton"]) == ("535.54.03, 535.104.05", "23.08")
    assert aggregate_pool_status(_pool(), [failing])["driverVersions"] is None
    columns = {c["name"]: c["jsonPath"] for c in GpuNodePool.__crd__["printerColumns"]}
    assert columns["Drivers"] == ".status.driverVersions" and columns["Newest-Triton"] == ".status.newestTriton"


def test_condition_transition_time_moves_only_on_flips():
    previous = [Condition(type="Ready", status="True", reason="NodesReady", last_transition_time="T0"),
                Condition(type="Degraded", status="False", reason="NoFailingNodes", last_transition_time="T0")]
    summary = {"nodes": 2, "ready": 1, "failing": 1, "pending": 0,
               "failingByCheck": [{"check": "selinux", "count": 1, "nodes": ["b"]}]}
    ready, degraded = pool_conditions(summary, previous, 4, "T1")
    assert ready.last_transition_time == "T0" and degraded.last_transition_time == "T1"
    assert "selinux (1)" in degraded.message
    none = pool_conditions({"nodes": 0, "ready": 0, "failing": 0, "pending": 0}, [], 1, "T1")
    assert none[0].reason == "NoNodesMatched"


def test_daemonset_runs_the_validator_read_only_on_the_pools_nodes():
    pool = _pool(taintFailingNodes=True, validator={"intervalSeconds": 120})
    [ds] = render_validator(pool, "rankops-system", "rankops-validator")
    spec = ds["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert ds["metadata"]["namespace"] == "rankops-system" and spec["serviceAccountName"] == "rankops-validator"
    assert spec["nodeSelector"] == {"pool": "t4"} and "hostPID" not in spec
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/host/etc")
    assert mount["readOnly"] is True
    assert next(v for v in spec["volumes"] if v["name"] == mount["name"])["hostPath"]["path"] == "/etc"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"] and security["capabilities"]["drop"] == ["ALL"]
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert container["env"][0] == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    args = container["args"]
    assert args[:5] == ["validate-node", "--host-root", "/host", "--node", "$(NODE_NAME)"]
    assert args[args.index("--interval") + 1] == "120" and "--taint-failing-nodes" in args
    assert NodeRequirements.model_validate_json(args[args.index("--requirements") + 1]) == pool.spec.requirements


def test_daemonset_args_parse_with_the_real_cli(build_host, monkeypatch):
    """The command the DaemonSet runs is accepted by `rankops validate-node` and reaches run_on_node."""
    [ds] = render_validator(_pool(taintFailingNodes=True), "ns", "sa")
    args = [a.replace("$(NODE_NAME)", "gpu-1").replace("/host", str(build_host())) for a in
            ds["spec"]["template"]["spec"]["containers"][0]["args"]]
    seen = {}

    def fake_run(node, host_root, pool, interval, once, **kwargs):
        seen.update(node=node, pool=pool, interval=interval, taint=kwargs["taint_failing"],
                    requirements=kwargs["requirements"])
        return 0
    monkeypatch.setattr("rankops.commands.validate_node.run_on_node", fake_run)
    assert main(args) == 0
    assert seen == {"node": "gpu-1", "pool": "t4-pool", "interval": 300, "taint": True, "requirements": REQUIREMENTS}


def test_long_pool_names_give_distinct_valid_names():
    a, b = validator_name("p" * 250 + "a"), validator_name("p" * 250 + "b")
    assert a != b and len(a) <= 63 and len(b) <= 63 and validator_name("t4") == "rankops-validator-t4"


def test_cli_exit_codes_and_outputs(build_host, tmp_path, capsys):
    healthy = str(build_host())
    assert main(["validate-node", "--host-root", healthy, "--no-nvml", "-o", "json",
                 "--nvidia-smi-xml", str(trees.NVIDIA_SMI_T4)]) == 0
    assert json.loads(capsys.readouterr().out)["gpuSource"] == "nvidia-smi -q -x"
    assert main(["validate-node", "--host-root", str(build_host("selinux-boolean-off")), "--no-nvml"]) == 1
    assert "fix: setsebool -P container_use_devices on" in capsys.readouterr().out
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(_pool().to_wire()))
    assert main(["validate-node", "--host-root", str(build_host("cuda-above-driver")), "--no-nvml",
                 "--pool", str(pool_file)]) == 0  # the pool asks for 12.2, which 535 supports


@pytest.mark.parametrize("extra, message", [
    (["--requirements", "{oops"], "--requirements is not JSON"),
    (["--requirements", '{"cudaVersion": "12"}'], "cudaVersion"),
    (["--pool", "/nonexistent.yaml"], "cannot read it"),
    (["--patch-node"], "--patch-node needs --node"),
    (["--nvidia-smi-xml", "/nonexistent.xml"], "nvidia-smi -q -x > FILE"),
])
def test_cli_bad_input_is_a_message_not_a_traceback(build_host, capsys, extra, message):
    assert main(["validate-node", "--host-root", str(build_host()), "--no-nvml", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
