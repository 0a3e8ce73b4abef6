"""A reconcile reads its RankingModel from the watch (ModelController.watched), not with a GET, unless
the watch has not yet brought back the status this process last wrote (issue 13)."""
from __future__ import annotations

import pytest

from rankops.controller import runtime
from rankops.controller.context import OperatorContext
from tests import wire
from tests.fakecluster import FakeCluster


def _model(rv: int, uid: str = "uid-m") -> dict:
    return {"kind": "RankingModel",
            "metadata": {"name": "m", "namespace": "ns", "uid": uid, "resourceVersion": str(rv)},
            "spec": {}, "status": {"phase": f"seen-at-{rv}"}}


@pytest.fixture
def kube():
    return FakeCluster()


def gets(kube: FakeCluster) -> int:
    return len(kube.requests("get", "RankingModel"))


@pytest.fixture
def controller(kube):
    """A controller whose watch of the namespace listed it before the model was made (the model is
    in the API, not in the watch's cache)."""
    controller = runtime.ModelController(OperatorContext(kube=kube))
    controller.watched.fill(kube, "RankingModel", "ns")
    kube.put(_model(99))
    kube.calls.clear()
    return controller


def test_a_watched_model_is_read_without_a_request(controller, kube):
    controller.watched.observe("RankingModel", _model(10))
    assert controller.current(_model(10)["metadata"])["status"]["phase"] == "seen-at-10"
    assert gets(kube) == 0


def test_a_watch_behind_this_processs_own_status_write_is_not_trusted(controller, kube):
    controller.watched.observe("RankingModel", _model(10))
    controller.status_written["uid-m"] = "12"
    assert controller.current(_model(10)["metadata"])["status"]["phase"] == "seen-at-99"
    assert gets(kube) == 1
    controller.watched.observe("RankingModel", _model(12))   # the write's answer, or its watch event
    assert controller.current(_model(12)["metadata"])["status"]["phase"] == "seen-at-12"
    assert gets(kube) == 1


def test_an_unseen_or_recreated_model_is_read_from_the_api(controller, kube):
    assert controller.current(_model(1)["metadata"])["status"]["phase"] == "seen-at-99"
    controller.watched.observe("RankingModel", _model(20, uid="uid-old"))   # the same name, another object
    assert controller.current(_model(21)["metadata"])["status"]["phase"] == "seen-at-99"
    controller.watched.observe("RankingModel", _model(30), deleted=True)
    controller.current(_model(31)["metadata"])
    assert gets(kube) == 3


def test_a_namespace_is_asked_whether_it_goes_at_most_every_few_seconds(monkeypatch):
    now = {"t": 100.0}
    kube = FakeCluster({"kind": "Namespace", "metadata": {"name": "reco"}},
                       {"kind": "Namespace", "metadata": {"name": "going", "finalizers": ["kubernetes"]}})
    kube.delete("Namespace", None, "going")
    kube.calls.clear()

    def asked():
        return [c.name for c in kube.requests("get", "Namespace")]

    controller = runtime.ModelController(OperatorContext(kube=kube), monotonic=lambda: now["t"])
    assert [controller.namespace_going("reco") for _ in range(3)] == [False] * 3
    assert controller.namespace_going("going") is True
    assert asked() == ["reco", "going"], "one GET per namespace for a burst of Events"
    now["t"] += runtime.NAMESPACE_ALIVE_S
    assert controller.namespace_going("reco") is False and controller.namespace_going("going") is True
    assert asked() == ["reco", "going", "reco"], "a namespace alive is asked again soon: it may begin to go"


def test_a_model_whose_deleted_event_was_missed_is_dropped_by_the_next_listing(controller):
    controller.watched.observe("RankingModel", _model(10))
    controller.watched.listed("RankingModel", "ns", [], 12)   # listed after it went
    assert controller.watched.get("RankingModel", "ns", "m") is None


def test_a_status_write_that_finds_the_model_gone_forgets_it(monkeypatch):
    from rankops.controller import models

    kube = FakeCluster()   # the model is gone from the API; the watch has not said so yet
    scheduled = []
    controller = runtime.ModelController(OperatorContext(kube=kube))
    monkeypatch.setattr(controller.clock, "reconciled", lambda key, needs: scheduled.append(key))
    monkeypatch.setattr(models, "reconcile", lambda kube, b, **_: models.Result(wire.status({"phase": "Pending"})))
    controller.watched.observe("RankingModel", _model(5))
    controller.reconciled_generation["uid-m"] = None   # not new here: its Pending is written
    controller.kicked(("ns", "m", "uid-m"))
    assert [c.status for c in kube.requests("merge_patch")] == [404], "its status write found it gone"
    assert scheduled == [], "not put back on the clock"
    assert controller.watched.get("RankingModel", "ns", "m") is None


def test_a_paused_replica_forgets_what_its_stopped_watches_told_it():
    from rankops.controller.peering import PauseState
    state = PauseState()
    controller = runtime.ModelController(OperatorContext(), state)
    controller.inputs_seen["uid-m"] = "digest"
    controller.watched.observe("RankingModel", _model(7, uid="uid-paused"))
    controller.children.listed("Deployment", "ns", [], 1)
    state.set(True)
    assert controller.inputs_seen == {}, "on resume, kopf's listing reconciles every model again"
    assert controller.watched.get("RankingModel", "ns", "m") is None
    assert controller.children.needs_listing("Deployment", "ns")


def test_a_new_models_pending_is_left_unwritten_once_and_its_first_ready_is_said(controller):
    from rankops.controller import models

    pending = wire.status({"phase": "Pending", "conditions": [
        {"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": "0/1"},
        {"type": "Degraded", "status": "False", "reason": "AsExpected"}]})
    ready = wire.status({"phase": "Ready", "conditions": [
        {"type": "Ready", "status": "True", "reason": "ReplicasReady", "message": "1/1 Ready"},
        {"type": "Degraded", "status": "False", "reason": "AsExpected"}]})
    first = controller.first_status("u", {}, models.Result(pending))
    assert not first.write and first.events == [], "nothing written or said"
    controller.reconciled_generation["u"] = 1
    second = controller.first_status("u", {}, models.Result(ready))
    assert second.status == ready and [(e.reason, e.message) for e in second.events] == [("Ready", "1/1 Ready")]
    controller.reconciled_generation["v"] = 1   # reconciled here before: a Pending is written as it comes
    assert controller.first_status("v", {}, models.Result(pending)).status == pending
