"""Reconciles of RankingModels that are going away are quiet: a model being deleted is not
reconciled, and a write refused because its namespace is being deleted is not an error (kopf
logs every TemporaryError at ERROR: a namespace deletion logged hundreds of them)."""
from __future__ import annotations

import json
import logging

from rankops import metrics
from rankops.controller import models, runtime
from rankops.controller.context import OperatorContext
from rankops.controller.kube import ApiError, namespace_terminating
from tests import wire
from tests.fakecluster import FakeCluster


def _refused(status: int, body: dict) -> ApiError:
    exc = ApiError(status=status, reason="Forbidden" if status == 403 else "Conflict")
    exc.body = json.dumps(body)
    return exc


TERMINATING = _refused(403, {
    "kind": "Status", "code": 403, "reason": "Forbidden",
    "message": 'configmaps "m-stable" is forbidden: unable to create new content in namespace e2e-x because it '
               "is being terminated",
    "details": {"name": "m-stable", "kind": "configmaps",
                "causes": [{"reason": "NamespaceTerminating", "message": "namespace e2e-x is being terminated",
                            "field": "metadata.namespace"}]}})
RBAC = _refused(403, {"kind": "Status", "code": 403, "reason": "Forbidden",
                      "message": 'configmaps "m-stable" is forbidden: User "system:serviceaccount:x:y" cannot patch'})


def cluster(body: dict, namespace: str | None = "alive") -> FakeCluster:
    """The model `body` in its namespace: "alive", "going" (being deleted) or None (no such namespace)."""
    kube = FakeCluster()
    if namespace:
        kube.put({"kind": "Namespace", "metadata": {"name": body["metadata"]["namespace"],
                                                    "finalizers": ["kubernetes"]}})
    if namespace == "going":
        kube.delete("Namespace", None, body["metadata"]["namespace"])
    deleting = body["metadata"].get("deletionTimestamp")
    kube.put({**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "deletionTimestamp"}})
    if deleting:
        kube.delete("RankingModel", body["metadata"]["namespace"], body["metadata"]["name"])
    kube.calls.clear()
    return kube


def _model(**meta) -> dict:
    return {"kind": "RankingModel", "metadata": {"name": "m", "namespace": "e2e-x", "uid": "uid-m", **meta},
            "spec": {}}


def _skipped() -> float:
    return metrics.REGISTRY.get_sample_value("rankops_reconciles_total",
                                             {"kind": "RankingModel", "result": "skipped"}) or 0


def test_namespace_terminating_is_told_apart_from_other_refusals():
    assert namespace_terminating(TERMINATING)
    assert namespace_terminating(_refused(409, {"kind": "Status", "code": 409,
                                                "message": "operation cannot be fulfilled: namespace is being terminated"}))
    assert not namespace_terminating(RBAC)
    assert not namespace_terminating(_refused(422, json.loads(TERMINATING.body)))
    assert not namespace_terminating(_refused(403, {})) and not namespace_terminating(ApiError(status=403))


def test_a_write_refused_by_a_terminating_namespace_is_not_an_error(monkeypatch, caplog):
    body = _model()
    kube = cluster(body, "going")
    controller = runtime.ModelController(OperatorContext(kube=kube))

    def refuse(kube, b, **_):
        raise TERMINATING
    monkeypatch.setattr(models, "reconcile", refuse)
    before = _skipped()
    with caplog.at_level(logging.DEBUG):
        controller.kicked((body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"]))   # before: kopf.TemporaryError, logged at ERROR
    assert _skipped() == before + 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not kube.requests("merge_patch"), "no status write"


def test_other_refusals_still_raise(monkeypatch):
    import kopf
    import pytest

    body = _model()
    kube = cluster(body)
    controller = runtime.ModelController(OperatorContext(kube=kube))

    def refuse(kube, b, **_):
        raise RBAC
    monkeypatch.setattr(models, "reconcile", refuse)
    with pytest.raises(kopf.TemporaryError, match="403"):
        controller.kicked((body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"]))
    assert not kube.requests("merge_patch"), "no status write"


def test_a_model_being_deleted_is_not_reconciled(monkeypatch):
    body = _model(deletionTimestamp="2026-12-01T00:00:00Z", finalizers=["rankops.io/finalizer"])
    kube = cluster(body)
    assert kube.stored("RankingModel", "e2e-x", "m")["metadata"]["deletionTimestamp"]
    controller = runtime.ModelController(OperatorContext(kube=kube))
    called = []
    monkeypatch.setattr(models, "reconcile", lambda kube, b, **_: called.append(b))
    controller.kicked((body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"]))
    assert called == [] and not kube.requests("merge_patch")


def test_events_are_not_posted_into_a_namespace_being_deleted(monkeypatch):
    """kopf retries a refused Event nine times, each logged at ERROR ("Request attempt #1/9
    failed"): a model whose pods go with its namespace would say NotReady into a closed door."""
    import kopf

    from rankops.rollout.machine import Event

    posted = []
    monkeypatch.setattr(kopf, "event", lambda body, **kw: posted.append(kw["reason"]))
    monkeypatch.setattr(models, "reconcile", lambda kube, b, **_: models.Result(
        wire.status({"phase": "Pending"}), [Event("Warning", "NotReady", "0/2 replicas Ready")]))
    body = _model()
    for namespace, expected in (("alive", ["NotReady"]), ("going", []), (None, [])):
        posted.clear()
        controller = runtime.ModelController(OperatorContext(kube=cluster(body, namespace)))
        controller.reconciled_generation[body["metadata"]["uid"]] = None   # not new here: its Pending is said
        controller.kicked((body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"]))
        assert posted == expected, namespace
