"""Which watch events reconcile which model, and which models a clock still moves (issue 13)."""
from __future__ import annotations

from rankops.controller import handlers


def model(phase: str | None, rollout_phase: str | None = None, generation: int = 1, observed: int = 1) -> dict:
    status = {"phase": phase, "observedGeneration": observed}
    if rollout_phase:
        status["rollout"] = {"phase": rollout_phase, "version": "2"}
    return {"metadata": {"generation": generation}, "status": status}


def test_only_unsettled_models_tick():
    assert not handlers._unsettled(model("Ready"))
    assert not handlers._unsettled(model("RolledBack", "RolledBack"))
    assert not handlers._unsettled(model("Ready", "Promoted"))
    for unsettled in (model("Warming", "Warming"), model("Canary", "Canary"), model("Pending"), model("Degraded"),
                      model("Ready", generation=2), {"metadata": {"generation": 1}}):
        assert handlers._unsettled(unsettled), unsettled


def child(labels: dict, owners: list) -> dict:
    return {"kind": "Deployment", "metadata": {"name": "m-stable", "namespace": "reco", "resourceVersion": "3",
                                               "labels": labels, "ownerReferences": owners}}


def test_a_child_event_reconciles_its_controlling_model_and_is_cached(monkeypatch):
    kicked = []
    monkeypatch.setattr(handlers.KICKS, "kick", kicked.append)
    on_deployment = handlers._child_event("Deployment")
    owner = {"kind": "RankingModel", "name": "m", "uid": "u1", "controller": True}
    on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "m"}, [owner])})
    assert kicked == [("reco", "m", "u1")]
    assert handlers.CHILDREN.get("Deployment", "reco", "m-stable") is not None
    on_deployment({"type": None, "object": child({"rankops.io/model": "m"}, [owner])})   # kopf's initial listing
    on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "other"}, [owner])})   # label lies
    on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "m"}, [{**owner, "controller": False}])})
    assert kicked == [("reco", "m", "u1")]
    on_deployment({"type": "DELETED", "object": child({"rankops.io/model": "m"}, [owner])})
    assert handlers.CHILDREN.get("Deployment", "reco", "m-stable") is None
    assert kicked[-1] == ("reco", "m", "u1")
