"""Which watch events reconcile which model, and which models a clock still moves (issue 13)."""
from __future__ import annotations

import asyncio

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
    asyncio.run(on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "m"}, [owner])}))
    assert kicked == [("reco", "m", "u1")]
    assert handlers.CHILDREN.get("Deployment", "reco", "m-stable") is not None
    asyncio.run(on_deployment({"type": None, "object": child({"rankops.io/model": "m"}, [owner])}))   # kopf's initial listing
    asyncio.run(on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "other"}, [owner])}))   # label lies
    asyncio.run(on_deployment({"type": "MODIFIED", "object": child({"rankops.io/model": "m"}, [{**owner, "controller": False}])}))
    assert kicked == [("reco", "m", "u1")]
    asyncio.run(on_deployment({"type": "DELETED", "object": child({"rankops.io/model": "m"}, [owner])}))
    assert handlers.CHILDREN.get("Deployment", "reco", "m-stable") is None
    assert kicked[-1] == ("reco", "m", "u1")


def test_a_model_event_reconciles_only_for_what_no_spec_handler_sees(monkeypatch):
    kicked = []
    monkeypatch.setattr(handlers.KICKS, "kick", kicked.append)

    def event(rv: str, status: dict, annotations: dict | None = None, kind: str = "MODIFIED") -> dict:
        return {"type": kind, "object": {"metadata": {"namespace": "reco", "name": "m", "uid": "u9",
                                                      "resourceVersion": rv, "annotations": annotations or {}},
                                         "status": status}}

    asyncio.run(handlers.rankingmodel_event(event("1", {"phase": "Ready"}, kind=None)))   # kopf's listing: only noted
    asyncio.run(handlers.rankingmodel_event(event("2", {"phase": "Ready"}, {"rankops.io/last-handled-configuration": "x"})))
    assert kicked == [], "kopf's own bookkeeping"
    handlers._status_written["u9"] = "3"
    asyncio.run(handlers.rankingmodel_event(event("3", {"phase": "Ready", "stableVersion": "1"})))
    assert kicked == [], "the operator's own status write"
    asyncio.run(handlers.rankingmodel_event(event("4", {"phase": "Ready", "stableVersion": "2"})))   # forged by someone else
    asyncio.run(handlers.rankingmodel_event(event("5", {"phase": "Ready", "stableVersion": "2"}, {"rankops.io/retry": "2"})))
    assert kicked == [("reco", "m", "u9")] * 2
    asyncio.run(handlers.rankingmodel_event(event("6", {}, kind="DELETED")))
    assert "u9" not in handlers._inputs_seen


def test_every_event_handler_is_async_so_it_never_waits_behind_reconciles_on_kopfs_executor():
    import kopf

    registry = kopf.get_default_registry()
    found = {h.id: asyncio.iscoroutinefunction(h.fn) for h in registry._watching.get_all_handlers()}
    assert {"deployment_event", "service_event", "configmap_event", "rankingmodel_event", "node_event"} <= set(found)
    assert all(found.values()), found
