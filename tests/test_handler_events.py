"""Which watch events reconcile which model (issue 13)."""
from __future__ import annotations

import asyncio

from rankops.controller import runtime
from rankops.controller.context import OperatorContext


def child(labels: dict, owners: list) -> dict:
    return {"kind": "Deployment", "metadata": {"name": "m-stable", "namespace": "reco", "resourceVersion": "3",
                                               "labels": labels, "ownerReferences": owners}}


def test_a_child_event_reconciles_its_controlling_model_and_is_cached(monkeypatch):
    kicked = []
    controller = runtime.ModelController(OperatorContext())
    monkeypatch.setattr(controller.queue, "kick", lambda key, *_, **__: kicked.append(key))
    on_deployment = lambda event: controller.child_event("Deployment", event)   # noqa: E731
    owner = {"kind": "RankingModel", "name": "m", "uid": "u1", "controller": True}
    on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "m"}, [owner])})
    assert kicked == [("reco", "m", "u1")]
    assert controller.children.get("Deployment", "reco", "m-stable") is not None
    on_deployment({"type": None, "object": child({"rankops.io/model": "m"}, [owner])})   # kopf's initial listing
    on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "other"}, [owner])})   # label lies
    on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "m"}, [{**owner, "controller": False}])})
    assert kicked == [("reco", "m", "u1")]
    on_deployment({"type": "DELETED", "object": child({"rankops.io/model": "m"}, [owner])})
    assert controller.children.get("Deployment", "reco", "m-stable") is None
    assert kicked[-1] == ("reco", "m", "u1")


def test_the_echo_of_the_operators_own_write_wakes_no_one_even_before_its_answer_is_recorded(monkeypatch):
    """The operator's watch streams (controller/watches.py) often hand on a write's echo before the
    reconcile that wrote it has recorded the answer: at N=1000 that was one more reconcile per model,
    which changed nothing."""
    kicked = []
    controller = runtime.ModelController(OperatorContext())
    monkeypatch.setattr(controller.queue, "kick", lambda key, *_, **__: kicked.append(key))
    owner = {"kind": "RankingModel", "name": "m", "uid": "u1", "controller": True}

    def event(rv: int, fields: list[dict], kind: str = "MODIFIED", **meta) -> None:
        obj = {"kind": "Service", "metadata": {"name": "m-svc", "namespace": "reco", "resourceVersion": str(rv),
                                               "labels": {"rankops.io/model": "m"}, "ownerReferences": [owner],
                                               "managedFields": fields, **meta}, "spec": {"rv": rv}}
        controller.child_event("Service", {"type": kind, "object": obj})

    ours = {"manager": "rankops", "operation": "Apply", "time": "2026-12-07T04:00:01Z"}
    event(1, [ours], kind="ADDED")
    assert kicked == [], "created by this operator: its reconcile knows"
    edit = {"manager": "kubectl-edit", "operation": "Update", "time": "2026-12-07T04:00:05Z"}
    event(2, [ours, edit])
    assert len(kicked) == 1, "a hand edit after it: drift, repaired"
    event(3, [{**ours, "time": "2026-12-07T04:00:09Z"}, edit])
    assert len(kicked) == 1, "the repair's echo"
    event(4, [{**ours, "time": "2026-12-07T04:00:09Z"}, {**edit, "time": "2026-12-07T04:00:09Z"}])
    assert len(kicked) == 2, "a tie within the second is not taken for an echo"
    status = {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
              "time": "2026-12-07T04:00:09Z"}
    event(5, [{**ours, "time": "2026-12-07T04:00:10Z"}, status], deletionTimestamp="2026-12-07T04:00:10Z")
    assert len(kicked) == 3, "being deleted: always told"
    event(5, [ours], kind="DELETED")
    assert len(kicked) == 4, "deleted: always told"


def test_a_child_event_that_changes_nothing_a_reconcile_reads_wakes_no_one(monkeypatch):
    """At N=1000 the watch's echo of the operator's own applies and the disruption controller's
    budget counts were ~0.6 reconciles per model that changed nothing."""
    kicked = []
    controller = runtime.ModelController(OperatorContext())
    monkeypatch.setattr(controller.queue, "kick", lambda key, *_, **__: kicked.append(key))
    owner = {"kind": "RankingModel", "name": "m", "uid": "u1", "controller": True}

    def event(kind: str, rv: int, spec: dict, status: dict) -> None:
        obj = {"kind": kind, "metadata": {"name": "m-stable", "namespace": "reco", "resourceVersion": str(rv),
                                          "labels": {"rankops.io/model": "m"}, "ownerReferences": [owner],
                                          "managedFields": [{"manager": f"writer-{rv}"}]},
               "spec": spec, "status": status}
        controller.child_event(kind, {"type": "MODIFIED", "object": obj})

    controller.children.observe("Deployment", {"kind": "Deployment", "metadata": {
        "name": "m-stable", "namespace": "reco", "resourceVersion": "3", "labels": {"rankops.io/model": "m"},
        "ownerReferences": [owner]}, "spec": {"replicas": 2}, "status": {}})   # the operator's own apply
    event("Deployment", 3, {"replicas": 2}, {})
    assert kicked == [], "the echo of the operator's own write"
    event("Deployment", 4, {"replicas": 2}, {})
    assert kicked == [], "a new resourceVersion or managedFields alone (an apply that changed nothing)"
    event("Deployment", 5, {"replicas": 2}, {"availableReplicas": 2})
    assert kicked == [("reco", "m", "u1")], "a Deployment's status is read (Available -> Ready)"
    event("Deployment", 4, {"replicas": 3}, {})
    assert len(kicked) == 1, "older than what is known"

    event("PodDisruptionBudget", 10, {"minAvailable": 1}, {})
    assert len(kicked) == 2, "first seen"
    event("PodDisruptionBudget", 11, {"minAvailable": 1}, {"disruptionsAllowed": 1, "currentHealthy": 2})
    assert len(kicked) == 2, "a budget's counts: no reconcile reads them"
    event("PodDisruptionBudget", 12, {"minAvailable": 2}, {"disruptionsAllowed": 1, "currentHealthy": 2})
    assert len(kicked) == 3, "its spec edited by someone: the reconcile puts it back"
    assert controller.children.get("PodDisruptionBudget", "reco", "m-stable")["status"]["currentHealthy"] == 2


def test_a_model_is_reconciled_from_its_own_events(monkeypatch):
    kicked = []
    controller = runtime.ModelController(OperatorContext())
    monkeypatch.setattr(controller.queue, "kick", lambda key, *_, **__: kicked.append(key))
    key = ("reco", "m", "u9")

    def event(rv: str, status: dict, annotations: dict | None = None, kind: str | None = "MODIFIED",
              generation: int = 1) -> dict:
        return {"type": kind, "object": {"metadata": {"namespace": "reco", "name": "m", "uid": "u9",
                                                      "resourceVersion": rv, "generation": generation,
                                                      "annotations": annotations or {}},
                                         "status": status}}

    controller.model_event(event("1", {"phase": "Ready"}, kind=None))
    assert kicked == [key], "kopf's listing at start-up reconciles every model (a resume)"
    controller.model_event(event("2", {"phase": "Ready"}, {"rankops.io/last-handled-configuration": "x"}))
    assert kicked == [key], "a metadata edit the reconcile does not read"
    controller.status_written["u9"] = "3"
    controller.model_event(event("3", {"phase": "Ready", "stableVersion": "1"}))
    assert kicked == [key], "the operator's own status write"
    controller.model_event(event("4", {"phase": "Ready", "stableVersion": "2"}))   # forged by someone else
    controller.model_event(event("5", {"phase": "Ready", "stableVersion": "2"}, {"rankops.io/retry": "2"}))
    controller.model_event(event("6", {"phase": "Ready", "stableVersion": "2"}, {"rankops.io/retry": "2"},
                                        generation=2))   # a new spec
    assert kicked == [key] * 4
    controller.model_event(event("7", {}, kind="DELETED"))
    assert "u9" not in controller.inputs_seen
    controller.model_event(event("8", {}, kind="ADDED"))
    assert kicked == [key] * 5, "created (again)"


def test_no_kopf_change_handler_or_timer_touches_a_model():
    """They cost a finalizer and two annotations per new model (and a model that cannot be
    deleted while the operator is down); the clock and the model's own events do their work."""
    import kopf

    import rankops.controller.handlers  # noqa: F401  (registers them)

    registry = kopf.get_default_registry()
    for handlers_of in (registry._changing, registry._spawning):
        kinds = {h.selector.plural for h in handlers_of.get_all_handlers()}
        assert "rankingmodels" not in kinds, kinds


def test_every_event_handler_is_async_so_it_never_waits_behind_reconciles_on_kopfs_executor():
    import kopf

    import rankops.controller.handlers  # noqa: F401  (registers them)

    registry = kopf.get_default_registry()
    found = {h.id: asyncio.iscoroutinefunction(h.fn) for h in registry._watching.get_all_handlers()}
    assert {"configmap_event", "rankingmodel_event", "node_event"} <= set(found)
    assert all(found.values()), found


def test_kopf_watches_no_kind_the_operators_own_streams_watch():
    """kopf watches every object of a kind it has a handler for: a handler left on a streamed kind
    would bring back its per-event cost for every Deployment or pod of the cluster."""
    import kopf

    import rankops.controller.handlers  # noqa: F401  (registers them)
    from rankops.controller.kube import KINDS

    registry = kopf.get_default_registry()
    by_kopf = {h.selector.plural for h in registry._watching.get_all_handlers()}
    models, _ = runtime.build(OperatorContext())
    streamed = {KINDS[stream.kind].plural for stream in runtime.watch_streams(models)}
    assert streamed == {"deployments", "services", "jobs", "poddisruptionbudgets", "pods"}
    assert not by_kopf & streamed, by_kopf & streamed
