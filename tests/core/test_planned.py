"""Plan only when the plan's inputs change: status.plan.inputsDigest, and the shape it gives back.

The digest covers what the plan is computed from, and nothing else (a version change or a new
rollout knob does not plan again); a matching status.plan is served without planning, also in a
restarted operator whose in-memory cache is empty.
"""
from __future__ import annotations

import copy
import datetime as dt

import pytest

from rankops.api.rankingmodel import RankingModel
from rankops import model_status as sd
from rankops.controller import models
from rankops.controller import plans as plans_module
from rankops.render import planned
from rankops.render.desired import resolve_shape

from tests.core.test_rollout_controller import gpu_cluster

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def auto_spec(**changes) -> dict:
    spec = {
        "replicas": 1, "version": "1",
        "versions": [{"name": v, "modelUri": f"s3://m/{v}", "format": "onnx"} for v in ("1", "2")],
        "candidates": {"layout": "padded"},
        "inputs": [{"name": "items", "dataType": "FP32", "dims": [100, 16]}],
        "outputs": [{"name": "scores", "dataType": "FP32", "dims": [100]}],
        "batching": "auto",
        "slo": {"p99LatencyMs": 10, "targetQps": 2000},
        "planning": {"headroom": 0.5, "latencyProfile": {1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}},
    }
    spec.pop("replicas")   # under batching: auto, the plan chooses the replicas
    spec.update(changes)
    return spec


def parsed(spec: dict):
    return RankingModel.model_validate({"metadata": {"name": "ctr", "namespace": "reco"}, "spec": spec}).spec


def digest(**changes) -> str | None:
    return planned.inputs_digest(parsed(auto_spec(**changes)))


def test_the_digest_follows_the_plans_inputs_and_nothing_else():
    base = digest()
    assert base and len(base) == 64 and digest() == base
    same = [digest(version="2"), digest(rollout={"canary": {"weight": 30}}), digest(tritonImage="nvcr.io/nvidia/tritonserver:24.05-py3")]
    assert same == [base] * 3, "what the plan does not read does not plan again"
    other = {
        "target QPS": digest(slo={"p99LatencyMs": 10, "targetQps": 4000}),
        "P99 budget": digest(slo={"p99LatencyMs": 8, "targetQps": 2000}),
        "profile": digest(planning={"headroom": 0.5, "latencyProfile": {1: 2.0, 4: 2.3, 8: 3.0, 16: 5.0}}),
        "headroom": digest(planning={"headroom": 0.3, "latencyProfile": {1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}}),
        "replicas set": digest(replicas=3),
        "tensors": digest(inputs=[{"name": "items", "dataType": "FP32", "dims": [200, 16]}]),
    }
    assert all(d != base for d in other.values()), other
    assert len(set(other.values())) == len(other)


def test_no_digest_where_nothing_is_planned():
    explicit = auto_spec(batching={"maxBatchSize": 8}, replicas=2)
    del explicit["slo"]
    assert planned.inputs_digest(parsed(explicit)) is None
    assert planned.inputs_digest(parsed(auto_spec(batching={"maxBatchSize": 8}))) is not None, "evaluated: a plan"


@pytest.mark.parametrize("changes", [{}, {"batching": {"maxBatchSize": 8, "preferredBatchSizes": [4, 8]}}])
def test_a_recorded_plan_gives_back_the_shape_it_was_planned_with(changes):
    spec = parsed(auto_spec(**changes))
    fresh = resolve_shape(spec)
    key = planned.inputs_digest(spec)
    back = planned.from_status(spec, planned.plan_status(fresh, key), key)
    assert (back.shape, back.replicas, back.problems, back.unbatched) == \
        (fresh.shape, fresh.replicas, fresh.problems, fresh.unbatched)


def test_a_record_of_other_inputs_or_out_of_bounds_is_planned_again():
    spec = parsed(auto_spec())
    key = planned.inputs_digest(spec)
    recorded = planned.plan_status(resolve_shape(spec), key)
    assert planned.from_status(spec, recorded, digest(replicas=3)) is None, "other inputs"
    assert planned.from_status(spec, recorded.model_copy(update={"inputs_digest": None}), key) is None, \
        "no digest recorded"
    assert planned.from_status(spec, recorded.model_copy(update={"max_batch_size": 0}), key) is None
    assert planned.from_status(spec, recorded.model_copy(update={"mode": "explicit"}), key) is None
    assert planned.from_status(spec, recorded.model_copy(update={"max_batch_size": 10**7}), key) is None, \
        "tensors too big"
    # A stored record that does not parse never gets here: model_status.known_status drops it
    # ("plan=invalid"), and the model is planned again.
    stored, dropped = sd.known_status({"plan": {"mode": "auto", "inputsDigest": key}})
    assert stored.plan is None and dropped == ["plan=invalid"]


def test_a_reconcile_plans_once_and_a_restarted_operator_not_at_all(monkeypatch):
    cluster = gpu_cluster()
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": "ctr", "namespace": "reco", "uid": "u1", "generation": 1}, "spec": auto_spec()}
    memory = models.ModelMemory()
    calls = []
    real = plans_module.resolve_shape
    monkeypatch.setattr(plans_module, "resolve_shape", lambda *a, **k: calls.append(1) or real(*a, **k))

    status = models.reconcile(cluster, copy.deepcopy(body), now=T0, memory=memory).status.to_wire()
    assert calls == [1] and status["plan"]["inputsDigest"] == planned.inputs_digest(parsed(auto_spec()))
    body["status"] = status
    models.reconcile(cluster, copy.deepcopy(body), now=T0, memory=memory)
    assert calls == [1], "the same inputs: not planned again"

    memory = models.ModelMemory()   # a restarted operator: only the status remembers
    again = models.reconcile(cluster, copy.deepcopy(body), now=T0, memory=memory).status.to_wire()
    assert calls == [1] and again["plan"] == status["plan"] and again["replicas"] == status["replicas"]
    deployment = cluster.get("Deployment", "reco", "ctr-stable")
    assert deployment["spec"]["replicas"] == status["plan"]["replicas"]

    body["spec"] = auto_spec(version="2", versions=body["spec"]["versions"])   # a rollout: same plan
    models.reconcile(cluster, copy.deepcopy(body), now=T0, memory=memory)
    assert calls == [1]
    body["spec"] = auto_spec(slo={"p99LatencyMs": 10, "targetQps": 8000})
    replanned = models.reconcile(cluster, copy.deepcopy(body), now=T0, memory=memory).status.to_wire()
    assert calls == [1, 1] and replanned["plan"]["inputsDigest"] != status["plan"]["inputsDigest"]
    assert replanned["plan"]["replicas"] > status["plan"]["replicas"]


def test_with_a_planner_thread_a_reconcile_asks_for_its_plan_and_is_kicked_when_it_is_made(monkeypatch):
    import threading

    from rankops.controller.plans import Plans

    cluster = gpu_cluster()
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": "ctr", "namespace": "reco", "uid": "u1", "generation": 1},
            "spec": auto_spec(slo={"p99LatencyMs": 10, "targetQps": 3000})}
    memory = models.ModelMemory()
    threads, kicked = [], threading.Event()
    real = plans_module.resolve_shape
    monkeypatch.setattr(plans_module, "resolve_shape",
                        lambda *a, **k: threads.append(threading.current_thread().name) or real(*a, **k))
    plans = Plans(done=lambda who: (kicked_who.append(who), kicked.set()))
    kicked_who: list = []

    first = models.reconcile(cluster, copy.deepcopy(body), now=T0, plans=plans, memory=memory)
    assert not first.write and first.events == [], "nothing written before the plan is made"
    assert cluster.get("Deployment", "reco", "ctr-stable") is None
    assert kicked.wait(10) and kicked_who == [("reco", "ctr", "u1")]
    assert threads and all(t.startswith("rankops-plan") for t in threads), threads
    second = models.reconcile(cluster, copy.deepcopy(body), now=T0, plans=plans, memory=memory).status.to_wire()
    assert second["plan"]["inputsDigest"] and cluster.get("Deployment", "reco", "ctr-stable") is not None
    assert len(threads) == 1, "planned once"


def test_a_plan_that_fails_is_said_and_not_made_again_for_the_same_inputs(monkeypatch):
    cluster = gpu_cluster()
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": "ctr", "namespace": "reco", "uid": "u1", "generation": 1},
            "spec": auto_spec(slo={"p99LatencyMs": 1, "targetQps": 2000})}   # below the profile's 2 ms
    memory = models.ModelMemory()
    calls = []
    real = plans_module.resolve_shape
    monkeypatch.setattr(plans_module, "resolve_shape", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(3):
        status = models.reconcile(cluster, copy.deepcopy(body), now=T0, memory=memory).status.to_wire()
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "PlanFailed")
        body["status"] = status
    assert calls == [1]


def test_the_queue_policy_is_derived_again_when_overload_changes_and_comes_back_from_status():
    shed = {"p99LatencyMs": 10, "targetQps": 2000, "overload": "shed"}
    keys = {digest(), digest(slo=shed), digest(slo={**shed, "queuePolicy": {"maxQueueSize": 50}})}
    assert len(keys) == 3, "slo.overload and slo.queuePolicy are part of what status.plan records"
    spec = parsed(auto_spec(slo=shed))
    fresh = resolve_shape(spec)
    key = planned.inputs_digest(spec)
    recorded = planned.plan_status(fresh, key)
    assert recorded.queue_policy.shed and recorded.queue_policy.timeout_microseconds > 0
    back = planned.from_status(spec, recorded, key)
    assert back.shape == fresh.shape and back.shape.queue_policy.timeout_us == recorded.queue_policy.timeout_microseconds
    # a record without the policy the spec asks for (an older operator's) is planned again
    assert planned.from_status(spec, recorded.model_copy(update={"queue_policy": None}), key) is None


def test_a_reconcile_records_the_queue_policy_and_serves_it():
    cluster = gpu_cluster()
    spec = auto_spec(slo={"p99LatencyMs": 10, "targetQps": 2000, "overload": "shed"})
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": "ctr", "namespace": "reco", "uid": "u1", "generation": 1}, "spec": spec}
    status = models.reconcile(cluster, copy.deepcopy(body), now=T0, memory=models.ModelMemory()).status.to_wire()
    policy = status["plan"]["queuePolicy"]
    assert policy["shed"] and policy["explanation"][0].startswith(f"timeout {policy['timeoutMicroseconds']} us")
    config = cluster.get("ConfigMap", "reco", "ctr-stable-triton")["data"]["config.pbtxt"]
    assert f"default_timeout_microseconds: {policy['timeoutMicroseconds']}" in config
    assert f"max_queue_size: {policy['maxQueueSize']}" in config
