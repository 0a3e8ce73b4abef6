"""A deleted GpuNodePool's end (controller/pools.py): validators stopped first, then the marks
cleared from its nodes only, against the shared fake API server (tests/fakecluster.py), which
behaves like one where it matters (foreground deletion, merge patches, resourceVersion
preconditions)."""
from __future__ import annotations

import types

import pytest

from rankops.controller import pools
from rankops.controller.kube import ApiError
from rankops.validator.daemonset import validator_name
from rankops.validator.node import ANNOTATION_REPORT, LABEL_POOL, LABEL_READY, TAINT_KEY, label_value
from rankops_dev import sample_hosts as trees
from tests.fakecluster import FakeCluster

NS = "rankops-system"
OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def cluster(nodes=(), pools_=(), daemonsets=(), ds_lingers=1) -> FakeCluster:
    """Nodes, pools and validator DaemonSets; a DaemonSet deleted in the foreground is gone after
    `ds_lingers` more reads (its pods stopping: then the garbage collector lets it go)."""
    kube = FakeCluster(*nodes, *daemonsets)
    for pool in pools_:
        deleting = pool["metadata"].get("deletionTimestamp")
        kube.put({**pool, "metadata": {k: v for k, v in pool["metadata"].items() if k != "deletionTimestamp"}})
        if deleting:
            kube.delete("GpuNodePool", None, pool["metadata"]["name"])
    lingers = [ds_lingers]

    def read(call):
        ds = kube.stored("DaemonSet", call.namespace, call.name)
        if ds and ds["metadata"].get("deletionTimestamp"):
            if lingers[0] <= 0:
                kube.finish_deletion("DaemonSet", call.namespace, call.name)
            lingers[0] -= 1
    kube.before("get", "DaemonSet", read, times=None)
    kube.calls.clear()
    return kube


def _daemonset(name):
    return {"kind": "DaemonSet", "metadata": {"name": name, "namespace": NS}}


def _deletes(kube):
    """The DaemonSets deleted, each as it was deleted: in the foreground or not."""
    return [(c.name, c.options["propagation"]) for c in kube.requests("delete", "DaemonSet")]


def _patches(kube):
    """The merge patches the API server took: (node, patch)."""
    return [(c.name, c.body) for c in kube.requests("merge_patch", "Node") if c.status == 200]


def _node(kube, name):
    return kube.stored("Node", None, name)


def _marked(name, pool, taints=(OURS, OTHER), extra=None):
    return {"kind": "Node",
            "metadata": {"name": name,
                         "labels": {LABEL_READY: "false", LABEL_POOL: label_value(pool), "zone": "a", **(extra or {})},
                         "annotations": {ANNOTATION_REPORT: "{}", "keep": "me"}},
            "spec": {"taints": list(taints)}, "status": {"capacity": {"nvidia.com/gpu": "1"}}}


def _clean(node):
    meta = node["metadata"]
    return ({k: v for k, v in meta["labels"].items() if not k.startswith("rankops.io/")} == meta["labels"]
            and ANNOTATION_REPORT not in meta.get("annotations", {})
            and OURS not in node.get("spec", {}).get("taints", []))


def _pool(name, deleting=False):
    meta = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"kind": "GpuNodePool", "metadata": {**meta, "finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]}}


def test_validators_stop_first_then_only_the_pools_nodes_are_cleared():
    kube = cluster(nodes=[_marked("gpu-1", "t4"), _marked("gpu-2", "t4", taints=[OTHER]),
                          _marked("gpu-3", "l4")],
                   pools_=[_pool("t4", deleting=True), _pool("l4")], daemonsets=[_daemonset(validator_name("t4"))],
                   ds_lingers=2)
    sleeps = []
    result = pools.release(kube, "t4", NS, sleep=sleeps.append)
    assert result.validators_stopped and result.shared_with is None
    assert _deletes(kube) == [(validator_name("t4"), "Foreground")], "deleted once, in the foreground"
    assert kube.stored("DaemonSet", NS, validator_name("t4")) is None
    assert len(sleeps) == 3, "waited while the DaemonSet (its pods stopping) was there"
    assert sorted(result.cleared) == ["gpu-1", "gpu-2"]
    for name in ("gpu-1", "gpu-2"):
        node = _node(kube, name)
        assert _clean(node) and node["metadata"]["labels"] == {"zone": "a"}
        assert node["metadata"]["annotations"] == {"keep": "me"} and node["spec"]["taints"] == [OTHER]
    assert _node(kube, "gpu-3")["metadata"]["labels"][LABEL_POOL] == "l4", "another pool's node is untouched"
    assert [n for n, _ in _patches(kube)] == ["gpu-1", "gpu-2"]
    assert [p for n, p in _patches(kube) if n == "gpu-2"][0].get("spec") is None, "no taint list to send"


def test_a_validator_that_will_not_stop_is_waited_for_then_the_marks_go_anyway():
    kube = cluster(nodes=[_marked("gpu-1", "t4")], daemonsets=[_daemonset(validator_name("t4"))], ds_lingers=10**6)
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
    result = pools.release(kube, "t4", NS, wait_s=5, sleep=sleep, clock=lambda: now[0])
    assert not result.validators_stopped and result.cleared == ["gpu-1"]
    assert 5 <= now[0] <= 6 and _deletes(kube) == [(validator_name("t4"), "Foreground")]


def test_no_daemonset_and_no_nodes_is_a_quiet_success():
    result = pools.release(cluster(), "t4", NS, sleep=lambda s: pytest.fail("nothing to wait for"))
    assert (result.validators_stopped, result.cleared, result.shared_with) == (True, [], None)


def test_a_node_relabelled_by_another_pool_meanwhile_is_left_alone():
    kube = cluster(nodes=[_marked("gpu-1", "t4")])

    def relabel(call):  # another pool's validator wins the node between our list and our patch
        node = kube.stored("Node", None, "gpu-1")
        node["metadata"]["labels"][LABEL_POOL] = "a100"
        kube.put(node)
    kube.before("merge_patch", "Node", relabel)
    result = pools.release(kube, "t4", NS)
    assert result.cleared == [] and _patches(kube) == []
    assert [c.status for c in kube.requests("merge_patch")] == [409], "the patch was made against the old node"
    assert _node(kube, "gpu-1")["metadata"]["labels"][LABEL_POOL] == "a100"
    assert OURS in _node(kube, "gpu-1")["spec"]["taints"], "that pool's taint stays"


def test_a_concurrent_taint_change_is_kept_on_the_retry():
    kube = cluster(nodes=[_marked("gpu-1", "t4")])
    added = {"key": "maintenance", "effect": "NoSchedule"}

    def taint(call):
        node = kube.stored("Node", None, "gpu-1")
        node["spec"]["taints"].append(added)
        kube.put(node)
    kube.before("merge_patch", "Node", taint)
    assert pools.release(kube, "t4", NS).cleared == ["gpu-1"]
    assert [c.status for c in kube.requests("merge_patch")] == [409, 200]
    assert _node(kube, "gpu-1")["spec"]["taints"] == [OTHER, added]


def test_a_node_deleted_meanwhile_is_skipped():
    kube = cluster(nodes=[_marked("gpu-1", "t4")])
    kube.before("merge_patch", "Node", lambda call: kube.delete("Node", None, "gpu-1"))
    assert pools.release(kube, "t4", NS).cleared == []


def test_a_live_pool_with_the_same_label_value_keeps_the_nodes_marked():
    long_a, long_b = "p" * 63 + "-a", "p" * 63 + "-b"  # both label as "ppp...p"
    assert label_value(long_a) == label_value(long_b)
    kube = cluster(nodes=[_marked("gpu-1", long_a)], pools_=[_pool(long_a, deleting=True), _pool(long_b)])
    result = pools.release(kube, long_a, NS)
    assert result.shared_with == long_b and result.cleared == [] and _patches(kube) == []
    # Both being deleted: whichever goes clears.
    kube.delete("GpuNodePool", None, long_b)
    assert pools.release(kube, long_a, NS).cleared == ["gpu-1"]


def test_other_api_errors_propagate():
    kube = cluster(nodes=[_marked("gpu-1", "t4")])
    kube.fail("merge_patch", "Node", 403)
    with pytest.raises(ApiError) as caught:
        pools.release(kube, "t4", NS)
    assert caught.value.status == 403


def test_a_pool_being_deleted_gets_no_validator_back_but_keeps_its_status():
    operator = types.SimpleNamespace(namespace=NS, validator_service_account="sa", validator_image=None)
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
            "metadata": {"name": "t4", "uid": "u1", "generation": 1},
            "spec": {"nodeSelector": {"pool": "t4"}, "requirements": trees.T4_REQUIREMENTS}}
    kube = cluster(nodes=[_marked("gpu-1", "t4", extra={"pool": "t4"})])
    live = pools.reconcile(kube, body, operator)
    assert [o["kind"] for o in kube.applied] == ["DaemonSet"] and live.status.to_wire()["nodes"] == 1
    kube.applied.clear()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting = pools.reconcile(kube, body, operator)
    assert kube.applied == [] and deleting.status.to_wire()["nodes"] == 1
