"""A canary is promoted on evidence, never on the clock alone (issue 24): what the machine does
when the analysis has no reading, too few requests, a policy for no verdict, a canary that
cannot be placed, and a canary that takes a stable replica's GPU."""
from __future__ import annotations

import datetime as dt

import pytest

from rankops.render.desired import ServingState
from rankops.rollout.machine import ABORT_ANNOTATION, PROMOTE_ANNOTATION, canary_size
from rankops.rollout.readiness import observe_pod
from rankops.api.rankingmodel import RankingModelStatus
from rankops.model_status import Facts, StableView, decide

from tests.core.test_rollout_machine import _counters, _serving, drive, model, pod, up

ZERO = {"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}}
QUIET = {"canary": {"c0": _counters(20)}, "stable": {"s0": _counters(80)}}          # fewer than minRequests
HEALTHY = {"canary": {"c0": _counters(500, 0, 4000)}, "stable": {"s0": _counters(2000, 0, 4000)}}
UNREAD = ("ctr-canary-0 (10.244.0.9): outside the networks the operator may read "
          "(rankops run --pod-metrics-network 127.0.0.0/8)",)


def judged(**analysis):
    return model("2", canary={"weight": 20, "durationSeconds": 300, "analysis": analysis})


def test_no_reading_extends_the_hold_then_rolls_back_by_default():
    rm = judged()
    s = _serving(rm)                                       # the hold starts at t=4
    d, s = drive(rm, s, 60, **up(), metrics_problems=UNREAD)
    assert s["rollout"]["phase"] == "Canary" and "outside the networks" in s["rollout"]["analysisProblem"]
    d, s = drive(rm, s, 4 + 300, **up(), metrics_problems=UNREAD)
    assert s["rollout"]["phase"] == "Canary", "no verdict: no promotion at the end of the hold"
    assert [e.reason for e in d.events] == ["CanaryHoldExtended"]
    assert "hold extended up to 600s" in s["rollout"]["message"] and "outside the networks" in s["rollout"]["message"]
    d, s = drive(rm, s, 4 + 899, **up(), metrics_problems=UNREAD)
    assert s["rollout"]["phase"] == "Canary" and d.events == ()
    d, s = drive(rm, s, 4 + 900, **up(), metrics_problems=UNREAD)
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "canary"
    assert "no verdict after 900s serving" in s["rollout"]["message"] and "onNoVerdict rollback" in s["rollout"]["message"]
    canary = next(g for g in s["gates"] if g["gate"] == "canary")
    assert (canary["outcome"], canary["reason"]) == ("inconclusive", "NoVerdict")
    assert canary["metrics"]["windowSeconds"] == 900
    assert d.serving == ServingState("1")


def test_too_few_requests_extend_the_hold_until_the_canary_has_served_min_requests():
    rm = judged(minRequests=100)
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics=ZERO)
    d, s = drive(rm, s, 4 + 300, **up(), track_metrics=QUIET)
    assert s["rollout"]["phase"] == "Canary" and "fewer than 100 canary requests" in s["rollout"]["message"]
    # Traffic picks up within the extension: judged, and promoted on the verdict.
    d, s = drive(rm, s, 4 + 420, **up(), track_metrics=HEALTHY)
    assert s["rollout"]["phase"] == "Promoting" and "canary analysis: canary 500 requests" in s["rollout"]["message"]
    canary = next(g for g in s["gates"] if g["gate"] == "canary")
    assert (canary["outcome"], canary["metrics"]["canary"]["requests"], canary["metrics"]["windowSeconds"]) == \
        ("pass", 500, 420)
    assert "holdExtendedSince" not in s["rollout"]


def test_on_no_verdict_promote_moves_on_and_says_it_had_no_verdict():
    rm = judged(onNoVerdict="promote", maxExtensionSeconds=60)
    s = _serving(rm)
    _, s = drive(rm, s, 4 + 300, **up(), metrics_problems=UNREAD)
    d, s = drive(rm, s, 4 + 360, **up(), metrics_problems=UNREAD)
    assert s["rollout"]["phase"] == "Promoting" and "no canary verdict" in s["rollout"]["message"]
    canary = next(g for g in s["gates"] if g["gate"] == "canary")
    assert (canary["outcome"], canary["reason"]) == ("inconclusive", "PromotedWithoutVerdict")
    assert "outside the networks" in canary["summary"]


def test_on_no_verdict_hold_waits_for_a_person_who_may_promote_or_abort():
    rm = judged(onNoVerdict="hold", maxExtensionSeconds=0)
    s = _serving(rm)
    d, s = drive(rm, s, 4 + 300, **up(), metrics_problems=UNREAD)
    assert s["rollout"]["phase"] == "Canary" and "annotate rankops.io/promote=2" in s["rollout"]["awaitingDecision"]
    assert [e.reason for e in d.events] == ["CanaryAwaitingDecision"]
    d, s = drive(rm, s, 4 + 5000, **up(), metrics_problems=UNREAD)
    assert s["rollout"]["phase"] == "Canary" and d.events == (), "it waits, and says it once"
    held = s
    d, s = drive(rm, held, 4 + 5010, **up(), metrics_problems=UNREAD, annotations={PROMOTE_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "Promoting"
    canary = next(g for g in s["gates"] if g["gate"] == "canary")
    assert canary["reason"] == "PromotedByAnnotation" and "without a verdict" in canary["summary"]
    d, s = drive(rm, held, 4 + 5010, **up(), metrics_problems=UNREAD, annotations={ABORT_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "manual"


def test_a_held_rollout_still_moves_on_when_evidence_arrives():
    rm = judged(onNoVerdict="hold", maxExtensionSeconds=0)
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics=ZERO)
    _, s = drive(rm, s, 4 + 300, **up(), track_metrics=QUIET)
    assert s["rollout"].get("awaitingDecision")
    _, s = drive(rm, s, 4 + 900, **up(), track_metrics=HEALTHY)
    assert s["rollout"]["phase"] == "Promoting" and "awaitingDecision" not in s["rollout"]


def test_a_failing_canary_is_rolled_back_while_it_waits_for_its_pods():
    # Step 2 needs 4 canary pods; one serves while the others start. Its failures count.
    rm = model("2", canary={"steps": [{"weight": 10, "durationSeconds": 60}, {"weight": 50, "durationSeconds": 60}],
                            "analysis": {}})
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics=ZERO)
    _, s = drive(rm, s, 64, **up(), track_metrics={"canary": {"c0": _counters(200, 0, 4000)},
                                                   "stable": {"s0": _counters(2000, 0, 4000)}})
    assert s["rollout"]["step"] == 2
    d, s = drive(rm, s, 70, **up(), track_metrics={"canary": {"c0": _counters(300, 40, 4000)},
                                                   "stable": {"s0": _counters(2500, 0, 4000)}})
    assert s["rollout"]["phase"] == "RolledBack" and "failure ratio" in s["rollout"]["message"]


def test_an_operator_restart_mid_window_judges_the_same_window():
    # All the machine knows lives in status: a fresh process given the same status decides the same.
    rm = judged()
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics=ZERO)
    restarted = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v) for k, v in s.items()}
    d1, a = drive(rm, s, 4 + 300, **up(), track_metrics=HEALTHY)
    d2, b = drive(rm, restarted, 4 + 300, **up(), track_metrics=HEALTHY)
    assert a == b and a["rollout"]["phase"] == "Promoting"
    assert a["rollout"]["message"] == b["rollout"]["message"]


@pytest.mark.parametrize("phase_seconds", [60, 4 + 300, 4 + 900, 4 + 5000])
def test_paused_makes_no_phase_change_in_canary_whatever_the_evidence(phase_seconds):
    s = _serving(judged())
    paused = model("2", paused=True, canary={"weight": 20, "durationSeconds": 300, "analysis": {}})
    d, s2 = drive(paused, s, phase_seconds, **up(), metrics_problems=UNREAD)
    assert s2["rollout"]["phase"] == "Canary" and "awaitingDecision" not in s2["rollout"]
    d, s2 = drive(paused, s, phase_seconds, canary_pods=(), canary_desired=1)   # nor when it stops serving
    assert s2["rollout"]["phase"] == "Canary"


def test_a_hold_longer_than_the_gate_timeout_promotes_without_timing_out_its_promotion():
    # Promoting's deadline counts from Promoting, not from the Canary phase the same step left.
    rm = model("2", canary={"weight": 20, "durationSeconds": 3600, "analysis": {}})
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics=ZERO)
    _, s = drive(rm, s, 4 + 3600, **up(), track_metrics=HEALTHY)
    assert s["rollout"]["phase"] == "Promoting", s["rollout"]["message"]


def test_unschedulable_canary_pods_are_said_with_the_schedulers_reason():
    message = "0/3 nodes are available: 1 node(s) had untolerated taint, 2 Insufficient nvidia.com/gpu."
    pending = observe_pod({"metadata": {"name": "ctr-canary-0", "labels": {"rankops.io/version": "2"}},
                           "spec": {}, "status": {"phase": "Pending", "conditions": [
                               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                "message": message}]}}, None)
    assert pending.unschedulable == message
    rm = model("2")
    d, s = drive(rm, {"stableVersion": "1"})
    d, s = drive(rm, s, 10, canary_pods=(pending,), canary_desired=1)
    assert s["rollout"]["phase"] == "CanaryStarting"
    assert s["rollout"]["unschedulable"] == f"1 pod unschedulable: {message}"
    assert "waiting for canary 2 (0/1 pods Ready): 1 pod unschedulable: 0/3 nodes" in s["rollout"]["message"]
    assert "capacity: replace" in s["rollout"]["message"]
    status = decide(rm.spec, RankingModelStatus(), d, Facts(now="2026-11-30T12:00:10Z", generation=2,
                                          stable=StableView(True, 4, 4, 4, "1")))
    degraded = next(c for c in status.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "PodsUnschedulable" and "Insufficient nvidia.com/gpu" in degraded["message"]
    assert [e.reason for e in status.events] == ["PodsUnschedulable"]
    # Once placed and Ready: the record forgets it, and the rollout goes on.
    d, s = drive(rm, s, 20, **up())
    assert "unschedulable" not in s["rollout"] and s["rollout"]["phase"] == "Warming"


def test_canary_metrics_unreadable_is_degraded_canary_not_judged():
    rm = judged()
    s = _serving(rm)
    d, s = drive(rm, s, 60, **up(), metrics_problems=UNREAD)
    status = decide(rm.spec, RankingModelStatus(), d, Facts(now="2026-11-30T12:01:00Z", generation=2,
                                          stable=StableView(True, 4, 4, 4, "1"), canary_ready=1))
    degraded = next(c for c in status.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "CanaryNotJudged" and "10.244.0.9" in degraded["message"]
    # Read again: the problem clears.
    d, s = drive(rm, s, 70, **up(), track_metrics=ZERO)
    assert "analysisProblem" not in s["rollout"]


@pytest.mark.parametrize("capacity, traffic, stable, weight, tolerance, expected", [
    ("surge", "replicas", 2, 33, None, (1, 0)),       # 1 of 3 Ready pods
    ("surge", "gatewayAPI", 4, 50, None, (2, 0)),
    ("replace", "replicas", 2, 33, None, (1, 1)),     # the canary takes one stable GPU: 1 of 2 pods
    ("replace", "replicas", 4, 50, 1, (1, 1)),        # at most failureTolerance (1) lent
    ("replace", "replicas", 4, 50, 3, (2, 2)),
    ("replace", "replicas", 1, 50, None, (1, 0)),     # never the last stable replica: surge
    ("replace", "gatewayAPI", 6, 10, 0, (1, 0)),      # nothing to lend: surge
])
def test_canary_size_by_capacity_mode(capacity, traffic, stable, weight, tolerance, expected):
    canary = {"weight": weight, "durationSeconds": 60, "capacity": capacity, "traffic": traffic}
    if traffic == "gatewayAPI":
        canary["parentRef"] = "gw"
    rm = model("2", canary=canary)
    spec = rm.spec
    if tolerance is not None:
        spec = spec.model_copy(update={"planning": spec.planning.model_copy(update={"failure_tolerance": tolerance})
                                       if spec.planning else _planning(tolerance)})
    assert canary_size(spec, stable, weight) == expected


def _planning(tolerance):
    from rankops.api.planning import Planning
    return Planning(failure_tolerance=tolerance)


def test_a_replacing_canary_shrinks_the_stable_from_its_start_and_gives_it_back_after():
    rm = model("2", canary={"weight": 33, "durationSeconds": 60, "capacity": "replace"})
    d, s = drive(rm, {"stableVersion": "1"}, replicas=2, stable_desired=2)
    assert (d.serving.canary_replicas, d.serving.stable_lent) == (1, 1)
    # The Deployment now runs 1: the lending is sized on the model's 2 replicas, not on that.
    d, s = drive(rm, s, 10, replicas=2, stable_desired=1, **up())
    assert (d.serving.canary_replicas, d.serving.stable_lent) == (1, 1)
    from rankops.api.rankingmodel import RankingModel
    from rankops.render.desired import ResolvedShape, desired_objects
    from rankops.render.tritonconfig import ServingShape
    objects = desired_objects(RankingModel.model_validate({**rm.model_dump(by_alias=True),
                                                           "metadata": {"name": "ctr", "namespace": "reco"}}),
                              d.serving, ResolvedShape(ServingShape(8, (), 0, 1), 2))
    replicas = {o["metadata"]["labels"]["rankops.io/track"]: o["spec"]["replicas"]
                for o in objects if o["kind"] == "Deployment"}
    assert replicas == {"stable": 1, "canary": 1}
    # Rolled back: nothing lent.
    d, s = drive(rm, s, 20, replicas=2, stable_desired=1, annotations={ABORT_ANNOTATION: "2"}, **up())
    assert d.serving == ServingState("1")


def test_a_canary_failing_its_warm_requests_is_rolled_back_at_once_not_at_the_deadline():
    rm = model("2")
    d, s = drive(rm, {"stableVersion": "1"})
    failing = ("pod ctr-canary-0: 75% of 600 warm requests failed in the last 3 rounds (at most 1% may): "
               "HTTP 400: unknown id",)
    d, s = drive(rm, s, 40, canary_pods=(pod(ready=False),), canary_desired=1, canary_warm_failing=failing)
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "canary"
    assert "fails its warm-up requests: pod ctr-canary-0: 75% of 600" in s["rollout"]["message"]
    assert d.serving == ServingState("1")


def test_stable_pods_the_scheduler_cannot_place_are_summed_up_with_its_reason():
    from rankops.rollout.readiness import unschedulable_summary

    def pending(name, message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", deleting=False):
        return {"metadata": {"name": name, **({"deletionTimestamp": "2026-11-30T12:00:00Z"} if deleting else {})},
                "spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                                        "reason": "Unschedulable", "message": message}]}}
    bound = {"metadata": {"name": "ok"}, "spec": {"nodeName": "gpu-1"}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "True"}]}}
    assert unschedulable_summary([bound], "stable") is None
    assert unschedulable_summary([bound, pending("a"), pending("b"), pending("c", deleting=True)], "stable") == \
        "2 stable pods unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    status = decide(model("1").spec, RankingModelStatus(), drive(model("1"), {})[0], Facts(
        now="2026-11-30T12:00:10Z", generation=1, stable=StableView(True, 4, 2, 2, "1"), replicas=4,
        unschedulable=unschedulable_summary([pending("a")], "stable")))
    degraded = next(c for c in status.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert (degraded["reason"], degraded["message"]) == (
        "PodsUnschedulable", "1 stable pod unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")


def test_the_controller_says_why_stable_pods_are_not_scheduled():
    import copy

    from rankops.controller import models
    from tests.core.test_rollout_controller import MODEL, T0, Model, gpu_cluster, unavailable_stable

    cluster = gpu_cluster()
    model = Model(cluster, version="1")
    model.reconcile()
    labels = unavailable_stable(cluster, model)
    cluster.put({"kind": "Pod", "metadata": {"name": f"{MODEL}-stable-0", "namespace": "reco", "labels": labels},
                 "spec": {}, "status": {"phase": "Pending", "conditions": [
                     {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]}})
    later = models.reconcile(cluster, copy.deepcopy(model.body), now=T0 + dt.timedelta(seconds=model.t + 20),
                             memory=model.memory)
    degraded = next(c for c in later.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PodsUnschedulable")
    assert degraded["message"] == "1 stable pod unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    assert [e.reason for e in later.events if e.type == "Warning"] == ["PodsUnschedulable"]


def test_a_stable_that_scales_up_mid_hold_does_not_restart_the_canarys_hold():
    # spec.autoscaling grows the stable; the canary's share then asks for more pods. The pods that
    # served still serve: no canary was lost, the hold goes on (and the new pod joins when Ready).
    rm = model("2", canary={"weight": 20, "durationSeconds": 300, "analysis": {"onNoVerdict": "promote",
                                                                           "maxExtensionSeconds": 0}})
    s = _serving(rm)                                       # 4 stable replicas, 1 canary pod, hold from t=4
    assert s["rollout"]["stepPods"] == 1
    d, s = drive(rm, s, 100, replicas=12, **up())          # the stable scaled to 12: 3 canary pods wanted
    assert s["rollout"]["stepSince"].endswith("12:00:04Z") and d.events == ()
    assert d.serving.canary_replicas == 3
    d, s = drive(rm, s, 4 + 300, replicas=12, **up())
    assert s["rollout"]["phase"] == "Promoting"
    # Losing the pod that served does stop it.
    s = _serving(rm)
    d, s = drive(rm, s, 100, replicas=12, canary_pods=(pod(ready=False),), canary_desired=3)
    assert "stepSince" not in s["rollout"] and [e.reason for e in d.events] == ["CanaryNotServing"]
