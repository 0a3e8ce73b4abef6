"""GpuNodePools run on the models' reconcile model (issue 27, item 3): their own watch events on
the PoolController's queue, pools and nodes read from those watches, `--resync` by the clock,
and deletion held by the controller's own finalizer until the nodes' marks are cleared. No kopf
change handler, timer or finalizer is left for them."""
from __future__ import annotations

import logging

import pytest

from rankops.controller import handlers, pools, runtime
from rankops.controller.context import OperatorContext
from rankops.controller.kube import ApiError
from rankops.nodelabels import LABEL_POOL, LABEL_READY
from tests.fakecluster import FakeCluster
from rankops_dev import sample_hosts as trees

POOL = {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
        "metadata": {"name": "t4", "generation": 1},
        "spec": {"nodeSelector": {"pool": "t4"}, "requirements": trees.T4_REQUIREMENTS}}


class Kicked:
    """Stands in for a controller's queue: records what was asked for, and, as the queue does,
    drops what is asked while the replica is paused."""

    def __init__(self, paused=lambda: False):
        self.keys: list = []
        self.paused = paused

    def kick(self, key, urgent=False):
        if not self.paused():
            self.keys.append(key)


def _node(name: str, **labels: str) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"pool": "t4", **labels}},
            "status": {"capacity": {"nvidia.com/gpu": "1"}}}


@pytest.fixture(autouse=True)
def posted(monkeypatch):
    """The Events posted, by reason (kopf posts only inside its own handlers' context)."""
    import kopf

    seen: list[str] = []
    monkeypatch.setattr(kopf, "event", lambda body, **kw: seen.append(kw["reason"]))
    return seen


@pytest.fixture
def cluster():
    kube = FakeCluster()
    for name in ("gpu-t4-1", "gpu-t4-2"):
        kube.put(_node(name))
    return kube


def _controller(kube, **kwargs):
    models_, _ = runtime.build(OperatorContext(kube=kube, namespace="rankops-system",
                                               validator_service_account="validator"))
    pools_ = runtime.PoolController(models_.settings, models_, **kwargs)
    pools_.queue = Kicked(lambda: pools_.pause.paused)
    return pools_


def _settled(cluster):
    """A pool reconciled once by a controller that has listed pools and nodes: (controller, uid)."""
    uid = cluster.put(POOL)["metadata"]["uid"]
    controller = _controller(cluster)
    _listed(controller, cluster)
    controller.kicked(("t4", uid))
    controller.queue.keys.clear()
    return controller, uid


def _listed(controller, kube):
    """kopf's first listing of pools and nodes, as its handlers pass them on."""
    for kind in ("Node", "GpuNodePool"):
        for obj in kube.list(kind):
            event = {"type": None, "object": obj}
            if kind == "Node":
                controller.node_event(event, {})
            else:
                controller.pool_event(event, {}, {})


def test_a_pool_is_reconciled_from_its_listing_holds_its_finalizer_first_and_reads_from_the_watch(cluster):
    pool = cluster.put(POOL)
    uid = pool["metadata"]["uid"]
    controller = _controller(cluster)
    _listed(controller, cluster)
    assert controller.queue.keys == [("t4", uid)], "the listing reconciles every pool, as kopf's resume did"

    controller.kicked(("t4", uid))
    writes = [c for c in cluster.calls if c.method in ("merge_patch", "apply")]
    assert (writes[0].method, writes[0].kind) == ("merge_patch", "GpuNodePool"), \
        "the finalizer before the validator marks any node"
    stored = cluster.stored("GpuNodePool", None, "t4")
    assert pools.POOL_FINALIZER in stored["metadata"]["finalizers"]
    assert stored["status"]["nodes"] == 2
    assert cluster.requests("get") == [], "the pool and its nodes come from the watch"
    assert [c.kind for c in cluster.requests("list_versioned")] == ["GpuNodePool", "Node"], "each listed once"

    # Its own writes come back as watch events: they wake nothing.
    controller.queue.keys.clear()
    controller.pool_event({"type": "MODIFIED", "object": stored}, {}, {})
    assert controller.queue.keys == []
    # A settled pool reconciled again (--resync) lists nothing: nodes and pools come from the watch.
    cluster.calls.clear()
    controller.kicked(("t4", uid))
    assert [c for c in cluster.calls if c.method in ("get", "list", "list_versioned")] == []


def test_a_node_event_is_read_from_the_watch_by_the_reconcile_it_asks_for(cluster):
    controller, uid = _settled(cluster)
    cluster.calls.clear()
    node = cluster.merge_patch("Node", None, "gpu-t4-2", {"metadata": {"labels": {"pool": "a10"}}})   # out of its selector
    controller.node_event({"type": "MODIFIED", "object": node}, {"t4": [(uid, {"pool": "t4"})]})
    assert controller.queue.keys == [("t4", uid)]
    controller.kicked(("t4", uid))
    assert cluster.stored("GpuNodePool", None, "t4")["status"]["nodes"] == 1
    assert [c for c in cluster.calls if c.method in ("get", "list", "list_versioned")] == [], \
        "the node as its event showed it: no LIST of the nodes"


def test_a_status_someone_else_wrote_reconciles_the_pool(cluster):
    controller, uid = _settled(cluster)
    cleared = cluster.merge_patch("GpuNodePool", None, "t4", {"status": {"nodes": None}}, subresource="status")
    controller.pool_event({"type": "MODIFIED", "object": cleared}, {}, {})
    assert controller.queue.keys == [("t4", uid)]
    controller.kicked(("t4", uid))
    assert cluster.stored("GpuNodePool", None, "t4")["status"]["nodes"] == 2, "what someone else wrote is repaired"


def test_a_deleted_pool_is_released_then_let_go(cluster):
    cluster.merge_patch("Node", None, "gpu-t4-1", {"metadata": {"labels": {LABEL_POOL: "t4", LABEL_READY: "false"}}})
    # An older operator's pool: kopf's deletion handler put kopf's finalizer on it.
    pool = cluster.put({**POOL, "metadata": {**POOL["metadata"], "finalizers": [pools.KOPF_FINALIZER]}})
    uid = pool["metadata"]["uid"]
    controller = _controller(cluster)
    _listed(controller, cluster)
    controller.kicked(("t4", uid))
    assert cluster.stored("DaemonSet", "rankops-system", "rankops-validator-t4") is not None
    assert cluster.stored("GpuNodePool", None, "t4")["metadata"]["finalizers"] == \
        [pools.KOPF_FINALIZER, pools.POOL_FINALIZER]

    # The garbage collector removes the DaemonSet once its pods have stopped.
    cluster.after("delete", "DaemonSet", lambda call: cluster.finish_deletion("DaemonSet", call.namespace, call.name))
    cluster.delete("GpuNodePool", None, "t4")
    deleting = cluster.stored("GpuNodePool", None, "t4")
    assert deleting["metadata"]["deletionTimestamp"], "held by the finalizer"
    controller.pool_event({"type": "MODIFIED", "object": deleting}, {}, {})
    controller.kicked(("t4", uid))
    assert cluster.stored("GpuNodePool", None, "t4") is None, "released, the finalizer taken off, gone"
    assert cluster.stored("DaemonSet", "rankops-system", "rankops-validator-t4") is None
    assert LABEL_POOL not in cluster.stored("Node", None, "gpu-t4-1")["metadata"]["labels"]


@pytest.mark.parametrize("status, tried_for_s, goes", [(403, 0, True), (500, 0, False), (500, 601, True)])
def test_api_errors_while_releasing(cluster, caplog, posted, status, tried_for_s, goes):
    """403 (RBAC without node patch): retrying cannot help, so the pool goes and says what it
    leaves behind; any other error is retried by the queue, for up to pools.RELEASE_TIMEOUT_S from
    this process's first try (a pool deleted while the operator was down gets the whole time)."""
    cluster.merge_patch("Node", None, "gpu-t4-1", {"metadata": {"labels": {LABEL_POOL: "t4", LABEL_READY: "false"}}})
    pool = cluster.put({**POOL, "metadata": {**POOL["metadata"], "finalizers": [pools.POOL_FINALIZER]}})
    uid = pool["metadata"]["uid"]
    cluster.delete("GpuNodePool", None, "t4")   # asked long ago (the fake's deletionTimestamp is a day old)
    cluster.fail("merge_patch", "Node", status)
    now = [1000.0]
    controller = _controller(cluster, monotonic=lambda: now[0])
    _listed(controller, cluster)
    if tried_for_s:
        with pytest.raises(ApiError):
            controller.kicked(("t4", uid))   # the first try
        now[0] += tried_for_s
    with caplog.at_level(logging.WARNING, "rankops"):
        if goes:
            controller.kicked(("t4", uid))
        else:
            with pytest.raises(ApiError):
                controller.kicked(("t4", uid))
    assert (cluster.stored("GpuNodePool", None, "t4") is None) == goes
    if goes:
        assert posted[-1] == "NodeMarksLeft" and "rankops.io labels and taint" in caplog.text


def test_events_while_paused_are_forgotten_so_the_relisting_after_resuming_reconciles(cluster):
    """A standby replica (kopf peering) drops its kicks: what it saw meanwhile must not count as
    seen, or the listing on resuming would look unchanged and wake nothing."""
    controller, uid = _settled(cluster)
    controller.pause.set(True)   # forgets what the watches showed
    cluster.delete("GpuNodePool", None, "t4")
    deleting = cluster.stored("GpuNodePool", None, "t4")
    controller.pool_event({"type": "MODIFIED", "object": deleting}, {}, {})   # still in kopf's queue
    controller.pause.set(False)
    controller.pool_event({"type": None, "object": deleting}, {}, {})
    assert controller.queue.keys == [("t4", uid)]


def test_a_relisting_that_shows_this_processs_own_last_write_still_reconciles_what_changed(cluster):
    """A broken watch is relisted by kopf: changes missed in between are seen as the listing shows
    them, even when the listed version is this process's own last write, and nodes changed meanwhile
    wake their pools."""
    controller, uid = _settled(cluster)
    stored = cluster.stored("GpuNodePool", None, "t4")
    stored["metadata"]["generation"] = 2   # a spec change the watch missed, as the listing shows it
    controller.status_written[uid] = stored["metadata"]["resourceVersion"]
    controller.pool_event({"type": None, "object": stored}, {}, {})
    assert controller.queue.keys == [("t4", uid)]
    controller.queue.keys.clear()
    node = cluster.merge_patch("Node", None, "gpu-t4-2", {"metadata": {"labels": {"pool": "a10"}}})
    controller.node_event({"type": None, "object": node}, {"t4": [(uid, {"pool": "t4"})]})
    assert controller.queue.keys == [("t4", uid)]


def test_no_kopf_change_handler_timer_or_finalizer_is_left_for_pools():
    import kopf

    registry = kopf.get_default_registry()
    for handler_registry in (registry._changing, registry._spawning):
        for handler in handler_registry.get_all_handlers():
            assert "gpunodepools" not in str(handler.selector), handler.id
    assert hasattr(handlers, "gpunodepool_event")


def test_a_new_spec_reconciles_the_pool_and_the_pools_it_may_overlap(cluster):
    controller, uid = _settled(cluster)
    other = cluster.put({**POOL, "metadata": {"name": "a10"}, "spec": {"nodeSelector": {"pool": "a10"}}})
    changed = cluster.merge_patch("GpuNodePool", None, "t4", {"spec": {"taintFailingNodes": True}})
    assert changed["metadata"]["generation"] == 2
    selectors = {"t4": [(uid, {"pool": "t4"})], "a10": [(other["metadata"]["uid"], {"pool": "a10"})]}
    controller.pool_event({"type": "MODIFIED", "object": changed}, {}, selectors)
    assert sorted(controller.queue.keys) == sorted([("t4", uid), ("a10", other["metadata"]["uid"])])
