"""A deleted GpuNodePool's end (controller/pools.py): validators stopped first, then the marks
cleared from its nodes only, against a fake Kube that behaves like the API server where it matters
(foreground deletion, merge patches, resourceVersion preconditions)."""
from __future__ import annotations

import copy
import types

import pytest

from rankops.controller.patching import apply_merge_patch
from rankops.controller import pools
from rankops.controller.kube import ApiError
from rankops.validator import sample_hosts as trees
from rankops.validator.daemonset import validator_name
from rankops.validator.node import ANNOTATION_REPORT, LABEL_POOL, LABEL_READY, TAINT_KEY, label_value

NS = "rankops-system"
OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}




class FakeKube:
    """Nodes, pools and DaemonSets; a DaemonSet deleted in the foreground disappears after
    `ds_lingers` more reads (its pods stopping)."""

    def __init__(self, nodes=(), pools_=(), daemonsets=(), ds_lingers=1):
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pools = list(pools_)
        self.daemonsets = {d: {"metadata": {"name": d, "namespace": NS}} for d in daemonsets}
        self.ds_lingers = ds_lingers
        self.deletes, self.patches, self.applied = [], [], []
        self.before_patch = None  # a hook: another writer changes the node between read and patch

    def get(self, kind, namespace, name):
        if kind == "DaemonSet":
            ds = self.daemonsets.get(name)
            if ds and "foregroundDeletion" in ds["metadata"].get("finalizers", []):
                if self.ds_lingers <= 0:  # its pods are gone: so is it
                    del self.daemonsets[name]
                    return None
                self.ds_lingers -= 1
            return copy.deepcopy(ds)
        if kind == "Node":
            return copy.deepcopy(self.nodes.get(name))
        raise AssertionError(kind)

    def list(self, kind, namespace=None, labels=None, label_selector=None):
        if kind == "GpuNodePool":
            return copy.deepcopy(self.pools)
        assert kind == "Node"
        if label_selector:
            labels = dict(term.split("=", 1) for term in label_selector.split(","))
        return [copy.deepcopy(n) for n in self.nodes.values()
                if all((n["metadata"].get("labels") or {}).get(k) == v for k, v in (labels or {}).items())]

    def delete(self, kind, namespace, name, propagation="Background"):
        assert (kind, namespace, propagation) == ("DaemonSet", NS, "Foreground")
        self.deletes.append(name)
        self.daemonsets[name]["metadata"]["finalizers"] = ["foregroundDeletion"]
        return True

    def merge_patch(self, kind, namespace, name, patch, subresource=None):
        assert kind == "Node" and namespace is None
        if self.before_patch:
            hook, self.before_patch = self.before_patch, None
            hook(self)
        node = self.nodes.get(name)
        if node is None:
            return None
        version = patch.get("metadata", {}).get("resourceVersion")
        if version and version != node["metadata"]["resourceVersion"]:
            raise ApiError(status=409, reason="Conflict")
        self.patches.append((name, patch))
        body = copy.deepcopy(patch)
        body.get("metadata", {}).pop("resourceVersion", None)
        self.nodes[name] = apply_merge_patch(node, body)
        self.nodes[name]["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        return self.nodes[name]

    def apply(self, obj):
        self.applied.append(obj)
        return obj


def _marked(name, pool, taints=(OURS, OTHER), extra=None):
    return {"metadata": {"name": name, "resourceVersion": "7",
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
    return {"metadata": meta}


def test_validators_stop_first_then_only_the_pools_nodes_are_cleared():
    kube = FakeKube(nodes=[_marked("gpu-1", "t4"), _marked("gpu-2", "t4", taints=[OTHER]),
                           _marked("gpu-3", "l4")],
                    pools_=[_pool("t4", deleting=True), _pool("l4")], daemonsets=[validator_name("t4")],
                    ds_lingers=2)
    sleeps = []
    result = pools.release(kube, "t4", NS, sleep=sleeps.append)
    assert result.validators_stopped and result.shared_with is None
    assert kube.deletes == [validator_name("t4")], "deleted once, in the foreground"
    assert len(sleeps) == 3, "waited while the DaemonSet (its pods stopping) was there"
    assert sorted(result.cleared) == ["gpu-1", "gpu-2"]
    for name in ("gpu-1", "gpu-2"):
        node = kube.nodes[name]
        assert _clean(node) and node["metadata"]["labels"] == {"zone": "a"}
        assert node["metadata"]["annotations"] == {"keep": "me"} and node["spec"]["taints"] == [OTHER]
    assert kube.nodes["gpu-3"]["metadata"]["labels"][LABEL_POOL] == "l4", "another pool's node is untouched"
    assert [p for n, p in kube.patches if n == "gpu-2"][0].get("spec") is None, "no taint list to send"


def test_a_validator_that_will_not_stop_is_waited_for_then_the_marks_go_anyway():
    kube = FakeKube(nodes=[_marked("gpu-1", "t4")], daemonsets=[validator_name("t4")], ds_lingers=10**6)
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
    result = pools.release(kube, "t4", NS, wait_s=5, sleep=sleep, clock=lambda: now[0])
    assert not result.validators_stopped and result.cleared == ["gpu-1"]
    assert 5 <= now[0] <= 6 and kube.deletes == [validator_name("t4")]


def test_no_daemonset_and_no_nodes_is_a_quiet_success():
    result = pools.release(FakeKube(), "t4", NS, sleep=lambda s: pytest.fail("nothing to wait for"))
    assert (result.validators_stopped, result.cleared, result.shared_with) == (True, [], None)


def test_a_node_relabelled_by_another_pool_meanwhile_is_left_alone():
    kube = FakeKube(nodes=[_marked("gpu-1", "t4")])

    def relabel(k):  # another pool's validator wins the node between our list and our patch
        node = k.nodes["gpu-1"]
        node["metadata"]["labels"][LABEL_POOL] = "a100"
        node["metadata"]["resourceVersion"] = "8"
    kube.before_patch = relabel
    result = pools.release(kube, "t4", NS)
    assert result.cleared == [] and kube.patches == []
    assert kube.nodes["gpu-1"]["metadata"]["labels"][LABEL_POOL] == "a100"
    assert OURS in kube.nodes["gpu-1"]["spec"]["taints"], "that pool's taint stays"


def test_a_concurrent_taint_change_is_kept_on_the_retry():
    kube = FakeKube(nodes=[_marked("gpu-1", "t4")])
    added = {"key": "maintenance", "effect": "NoSchedule"}

    def taint(k):
        node = k.nodes["gpu-1"]
        node["spec"]["taints"].append(added)
        node["metadata"]["resourceVersion"] = "8"
    kube.before_patch = taint
    assert pools.release(kube, "t4", NS).cleared == ["gpu-1"]
    assert kube.nodes["gpu-1"]["spec"]["taints"] == [OTHER, added]


def test_a_node_deleted_meanwhile_is_skipped():
    kube = FakeKube(nodes=[_marked("gpu-1", "t4")])
    kube.before_patch = lambda k: k.nodes.pop("gpu-1")
    assert pools.release(kube, "t4", NS).cleared == []


def test_a_live_pool_with_the_same_label_value_keeps_the_nodes_marked():
    long_a, long_b = "p" * 63 + "-a", "p" * 63 + "-b"  # both label as "ppp...p"
    assert label_value(long_a) == label_value(long_b)
    kube = FakeKube(nodes=[_marked("gpu-1", long_a)], pools_=[_pool(long_a, deleting=True), _pool(long_b)])
    result = pools.release(kube, long_a, NS)
    assert result.shared_with == long_b and result.cleared == [] and kube.patches == []
    # Both being deleted: whichever goes clears.
    kube.pools = [_pool(long_a, deleting=True), _pool(long_b, deleting=True)]
    assert pools.release(kube, long_a, NS).cleared == ["gpu-1"]


def test_other_api_errors_propagate():
    kube = FakeKube(nodes=[_marked("gpu-1", "t4")])

    def forbid(*_, **__):
        raise ApiError(status=403, reason="Forbidden")
    kube.merge_patch = forbid
    with pytest.raises(ApiError) as caught:
        pools.release(kube, "t4", NS)
    assert caught.value.status == 403


def test_a_pool_being_deleted_gets_no_validator_back_but_keeps_its_status():
    operator = types.SimpleNamespace(namespace=NS, validator_service_account="sa", validator_image=None)
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
            "metadata": {"name": "t4", "uid": "u1", "generation": 1},
            "spec": {"nodeSelector": {"pool": "t4"}, "requirements": trees.T4_REQUIREMENTS}}
    kube = FakeKube(nodes=[_marked("gpu-1", "t4", extra={"pool": "t4"})])
    live = pools.reconcile(kube, body, operator)
    assert [o["kind"] for o in kube.applied] == ["DaemonSet"] and live.status["nodes"] == 1
    kube.applied.clear()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting = pools.reconcile(kube, body, operator)
    assert kube.applied == [] and deleting.status["nodes"] == 1
