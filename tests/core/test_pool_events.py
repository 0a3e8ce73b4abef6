"""Pools follow node events: which pools a node's change may move, and which changes count."""
from __future__ import annotations

import json

from rankops.controller import pools
from rankops.validator.node import ANNOTATION_REPORT, LABEL_POOL, LABEL_READY, label_value

T4 = {"nvidia.com/gpu.product": "Tesla-T4"}
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4"}


def node(labels=None, report=None, gpus="1", **meta):
    annotations = {ANNOTATION_REPORT: json.dumps(report)} if report is not None else {}
    return {"metadata": {"name": "gpu-1", "labels": dict(labels or {}), "annotations": annotations, **meta},
            "status": {"capacity": {"nvidia.com/gpu": gpus}, "conditions": [{"type": "Ready", "status": "True",
                                                                              "lastHeartbeatTime": "12:00"}]}}


def report(ready=True, at="2026-12-01T12:00:00Z", blocking=()):
    return {"requirementsDigest": "d1", "ready": ready, "generatedAt": at, "blocking": list(blocking),
            "checks": [{"id": "driver", "required": True, "status": "pass" if ready else "fail", "took": at}]}


def test_a_node_event_moves_the_pools_that_select_it_and_the_one_it_is_marked_for():
    selectors = {"t4-pool": T4, "l4-pool": L4, "other": {"zone": "b"}}
    assert pools.pools_of_node(node(T4), selectors) == ["t4-pool"]
    assert pools.pools_of_node(node({**T4, "zone": "b"}), selectors) == ["other", "t4-pool"]
    # Relabelled out of t4-pool's selector but still carrying its mark: t4-pool counts it no more.
    assert pools.pools_of_node(node({LABEL_POOL: label_value("t4-pool")}), selectors) == ["t4-pool"]
    assert pools.pools_of_node(node({"zone": "a"}), selectors) == []


def test_only_what_a_pools_status_reads_of_a_node_wakes_it():
    base = pools.node_inputs(node({**T4, LABEL_READY: "true"}, report()))
    heartbeat = node({**T4, LABEL_READY: "true"}, report())
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "12:05"
    assert pools.node_inputs(heartbeat) == base
    assert pools.node_inputs(node({**T4, LABEL_READY: "true"}, report(at="2026-12-01T12:05:00Z"))) == base, \
        "a re-validation with the same verdict"
    moved = [node({**T4, LABEL_READY: "false"}, report()),                       # the validator's mark
             node({**T4, LABEL_READY: "true"}, report(ready=False, blocking=["driver"])),   # its verdict
             node({**T4, LABEL_READY: "true"}, report(), gpus="0"),              # no GPUs any more
             node({**L4, LABEL_READY: "true"}, report()),                        # relabelled
             node({**T4, LABEL_READY: "true"})]                                  # report removed
    assert all(pools.node_inputs(n) != base for n in moved)
    garbled = node({**T4, LABEL_READY: "true"})
    garbled["metadata"]["annotations"] = {ANNOTATION_REPORT: "{not json"}
    assert pools.node_inputs(garbled) == pools.node_inputs(node({**T4, LABEL_READY: "true"}))


def test_a_validator_daemonset_applied_and_then_not_listed_reconciles_its_pool_once():
    from rankops.controller import pools

    validators = pools.Validators()
    validators.applied[("rankops-system", "rankops-validator-t4")] = ("t4", "uid-t4")
    validators.applied[("rankops-system", "rankops-validator-l4")] = ("l4", "uid-l4")
    listed = {("rankops-system", "rankops-validator-l4")}
    assert validators.gone(listed) == [("t4", "uid-t4")]
    assert validators.gone(listed) == [], "forgotten until the pool's reconcile applies it again"
