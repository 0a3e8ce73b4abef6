"""Read -> plan -> execute, once (issue 39): the spec admitted once, one list of blocking reads in
the precedence order, the core saying what else to read, the wake filters derived from what it
declares it reads, and shapes cached by the plan pool."""
from __future__ import annotations

import dataclasses
import datetime as dt

from rankops import modelplan
from rankops.api.phases import DEGRADED_PRECEDENCE, DegradedReason
from rankops.api.rankingmodel import RankingModelStatus
from rankops.controller import cache, models, runtime
from rankops.controller.plans import Plans
from rankops.rollout.machine import ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION

from tests.core.test_render_is_the_plan import _model
from tests.core.test_rollout_controller import gpu_cluster

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def _body(**spec) -> dict:
    body = _model("seam", **spec)
    body["metadata"].update(uid="u", generation=1)
    return body


def test_the_spec_is_parsed_and_checked_once_per_reconcile(monkeypatch):
    parsed, refused = [], []
    real_parse, real_refusal = modelplan.parse, modelplan.refusal
    monkeypatch.setattr(modelplan, "parse", lambda body: parsed.append(1) or real_parse(body))
    monkeypatch.setattr(modelplan, "refusal", lambda rm, s: refused.append(1) or real_refusal(rm, s))
    result = models.reconcile(gpu_cluster(), _body(), now=T0)
    assert result.status.phase is not None
    assert parsed == [1] and refused == [1], "admitted once, the shell and plan() share it"


def test_admit_says_why_before_anything_is_read():
    admitted = modelplan.admit(_body())
    assert admitted.rm is not None and admitted.refused is None
    invalid = modelplan.admit({**_body(), "spec": {"versions": "nope"}})
    assert invalid.rm is None and invalid.refused[0] == DegradedReason.INVALID_SPEC


def test_the_blocking_reads_are_in_the_precedence_order_and_each_has_a_reader():
    assert [read.name for read in modelplan.BLOCKING_READS] == ["credentials", "pool", "shape"]
    assert set(models.BLOCKING_READERS) == {read.name for read in modelplan.BLOCKING_READS}
    rm = modelplan.parse(_body(nodePool="t4", modelCredentialsSecret="s"))[0]
    everything = modelplan.ModelObserved(now=T0, credentials_secret_exists=False,
                                         pool=modelplan.PoolView(exists=False), plan_failed="no plan")
    reasons = [read.blocks(everything, rm)[0] for read in modelplan.BLOCKING_READS]
    assert reasons == sorted(reasons, key=DEGRADED_PRECEDENCE.index), "the list's order is the precedence's"
    assert modelplan.blocker(everything, rm)[0] == DegradedReason.CREDENTIALS_SECRET_NOT_FOUND
    no_secret_problem = dataclasses.replace(everything, credentials_secret_exists=True)
    assert modelplan.blocker(no_secret_problem, rm)[0] == DegradedReason.NODE_POOL_NOT_FOUND
    assert modelplan.blocker(modelplan.ModelObserved(now=T0, plan_failed="x"), rm)[0] == DegradedReason.PLAN_FAILED


def test_the_shell_stops_reading_at_the_first_blocker(monkeypatch):
    rm = modelplan.parse(_body(nodePool="absent"))[0]
    monkeypatch.setitem(models.BLOCKING_READERS, "shape", lambda r: (_ for _ in ()).throw(AssertionError("read")))
    observed = models.observe(gpu_cluster(), rm, RankingModelStatus(), T0)
    assert observed.pool is not None and not observed.pool.exists and observed.resolved is None


def _deployment(replicas: int, ready: int) -> dict:
    return {"metadata": {"name": "seam-stable", "generation": 1}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": 1, "readyReplicas": ready, "updatedReplicas": ready}}


def test_reads_says_what_else_a_reconcile_reads():
    rm = modelplan.parse(_body())[0]
    settled = modelplan.reads(rm, RankingModelStatus(), T0, _deployment(2, 2), None, 2, False)
    assert settled == modelplan.Reads(), "a settled model reads nothing more"
    assert modelplan.reads(rm, RankingModelStatus(), T0, _deployment(2, 2), {"x": 1}, 2, False).canary_pods
    assert modelplan.reads(rm, RankingModelStatus(), T0, _deployment(3, 3), None, 2, False).stable_pods, "a surge"
    assert modelplan.reads(rm, RankingModelStatus(), T0, _deployment(2, 2), None, 2, True).stable_pods
    external = modelplan.parse(_body(autoscaling={"enabled": True, "mode": "external"}))[0]
    assert modelplan.reads(external, RankingModelStatus(), T0, None, None, 2, False).external_scaler


def test_the_wake_filters_derive_from_what_the_plan_reads():
    assert modelplan.MODEL_ANNOTATIONS_READ == (PROMOTE_ANNOTATION, ABORT_ANNOTATION, RETRY_ANNOTATION)
    model = {"metadata": {"generation": 1, "annotations": {}}, "status": {}}
    for annotation in modelplan.MODEL_ANNOTATIONS_READ:
        woken = {"metadata": {"generation": 1, "annotations": {annotation: "v2"}}, "status": {}}
        assert runtime.model_inputs(woken) != runtime.model_inputs(model), annotation
    other = {"metadata": {"generation": 1, "annotations": {"team": "x"}}, "status": {}}
    assert runtime.model_inputs(other) == runtime.model_inputs(model), "an annotation no plan reads wakes nothing"
    assert cache.STATUS_UNREAD == frozenset(cache.CACHED_KINDS) - modelplan.CHILD_STATUS_READ
    assert {"Deployment", "Job"} <= modelplan.CHILD_STATUS_READ and "PodDisruptionBudget" in cache.STATUS_UNREAD


def test_plan_sees_only_the_annotations_it_declares():
    body = _body()
    body["metadata"]["annotations"] = {"team": "x", PROMOTE_ANNOTATION: "1"}
    assert modelplan._annotations_read(body["metadata"]) == {PROMOTE_ANNOTATION: "1"}


def test_the_plan_pool_caches_shapes(monkeypatch):
    from rankops.controller import plans as plans_module
    from tests.core.test_planned import auto_spec, parsed

    calls = []
    real = plans_module.resolve_shape
    monkeypatch.setattr(plans_module, "resolve_shape", lambda *a, **k: calls.append(1) or real(*a, **k))
    pool = Plans()
    spec = parsed(auto_spec())
    first = pool.resolve(spec, None)
    assert pool.resolve(spec, None) == first and calls == [1], "the same inputs: planned once"
    assert Plans().resolve(spec, None, first[1])[0].shape == first[0].shape and calls == [1], \
        "a new pool (a restart) takes the recorded status.plan"


def test_a_deployment_is_all_ready_by_the_one_definition():
    ready = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
             "status": {"observedGeneration": 2, "readyReplicas": 2, "updatedReplicas": 2, "replicas": 2}}
    assert runtime.all_ready(ready) and modelplan.deployment_view(ready)[2] == 2
    for stale in ({"observedGeneration": 1}, {"readyReplicas": 1}, {"updatedReplicas": 1}, {"replicas": 3}):
        dep = {**ready, "status": {**ready["status"], **stale}}
        assert not runtime.all_ready(dep), stale
        assert modelplan.deployment_view(dep)[2] < 2, stale


def test_the_planners_simulation_memo_is_safe_across_threads():
    import threading

    from rankops.planner import search

    assert isinstance(search._MEMO_LOCK, type(threading.Lock()))
    search.clear_caches()
    assert search._MEMO == {}


def test_the_pool_view_is_pure_and_asks_for_the_ready_nodes_only_when_it_needs_them():
    rm = modelplan.parse(_body(nodePool="t4"))[0]
    assert not modelplan.pool_view(rm, None).exists
    pool = {"metadata": {"name": "t4"}, "spec": {"nodeSelector": {"a": "b"}}, "status": {"ready": 0, "nodes": 2}}
    empty = modelplan.pool_view(rm, pool)
    assert "no validated ready node" in empty.note and not empty.reads_ready_nodes
    ready = {**pool, "status": {"ready": 1, "nodes": 2}}
    asks = modelplan.pool_view(rm, ready)
    assert asks.reads_ready_nodes and asks.placement is None
    assert not modelplan.pool_view(rm, ready, []).reads_ready_nodes


def test_the_external_autoscaler_is_found_by_its_target():
    from rankops import autoscale

    hpa = {"metadata": {"name": "h"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "m-stable"}}}
    keda = {**hpa, "metadata": {"name": "k", "labels": {"scaledobject.keda.sh/name": "so"}}}
    assert autoscale.scaler_of([hpa], "m-stable") == "HorizontalPodAutoscaler/h"
    assert autoscale.scaler_of([keda], "m-stable") == "ScaledObject/so"
    assert autoscale.scaler_of([hpa], "other") is None
