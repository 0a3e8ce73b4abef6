"""spec.autoscaling: the pure decision (rankops.autoscale) and how the plan serves it (steps, ramps,
noise, bounds, stabilization, canary weights, an operator restart mid-window, the user's HPA)."""
from __future__ import annotations

import copy
import datetime as dt

import pytest
from pydantic import ValidationError

from rankops import autoscale, modelplan
from rankops.api.rankingmodel import RankingModelSpec
from rankops.render import names
from rankops.render.desired import resolve_shape
from rankops.rollout.deadlines import after_reconcile

from tests.core.test_render_is_the_plan import SMALL, _model

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
B = autoscale.Bounds(min_replicas=1, max_replicas=10, target_utilization=1.0, failure_tolerance=0,
                     up_window_s=0, down_window_s=300)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def run(rates: list[tuple[float, float]], bounds: autoscale.Bounds = B, capacity: float = 10.0,
        start: int = 1) -> list[autoscale.Outcome]:
    """Decide at each (second, rate), carrying replicas and history as status would."""
    current, history, out = start, (), []
    for second, qps in rates:
        outcome = autoscale.decide(autoscale.Inputs(at(second), current, capacity, bounds, qps, None, history))
        current, history = outcome.desired, outcome.history
        out.append(outcome)
    return out


def test_a_step_up_scales_at_once_and_a_step_down_waits_for_the_window():
    outs = run([(0, 5), (10, 25), (20, 25), (30, 5), (200, 5), (331, 5), (340, 5)])
    assert [o.desired for o in outs] == [1, 3, 3, 3, 3, 1, 1]
    assert outs[1].reason == "ScaledUp" and "25.0 req/s needs 3" in outs[1].message
    assert outs[3].reason == "ScaleDownStabilizing" and outs[3].recommended == 1
    assert outs[5].reason == "ScaledDown", "300 s after the last recommendation of 3"


def test_a_ramp_follows_upward_one_step_at_a_time_and_never_overshoots():
    outs = run([(10 * i, 4.0 * i) for i in range(1, 11)], capacity=10)
    # 3.2 replicas' worth on 3 is within the 10% tolerance (as the HorizontalPodAutoscaler's)
    assert [o.desired for o in outs] == [1, 1, 2, 2, 2, 3, 3, 3, 4, 4]
    assert all(b.desired >= a.desired for a, b in zip(outs, outs[1:]))


def test_noise_within_the_tolerance_changes_nothing():
    outs = run([(0, 30)] + [(10 * i, 30 * (1.09 if i % 2 else 0.91)) for i in range(1, 20)], start=3)
    assert {o.desired for o in outs} == {3} and outs[-1].reason == "WithinTarget"


def test_bounds_cap_and_floor_and_say_so():
    b = autoscale.Bounds(2, 4, 1.0, 0, 0, 0)
    assert run([(0, 100)], b)[0].desired == 4
    assert run([(0, 100), (10, 100)], b)[1].reason == "AtMaxReplicas"
    low = run([(0, 0), (10, 0)], b, start=2)
    assert low[-1].desired == 2 and low[-1].reason == "AtMinReplicas"


def test_failure_tolerance_is_kept_on_top_and_target_utilization_leaves_headroom():
    b = autoscale.Bounds(1, 10, 0.5, 1, 0, 300)
    # 25 req/s at 50% of 10 per replica: 5 carry it, and one spare
    assert run([(0, 25)], b)[0].desired == 6


def test_scale_up_stabilization_takes_the_lowest_of_its_window():
    b = autoscale.Bounds(1, 10, 1.0, 0, up_window_s=30, down_window_s=300)
    outs = run([(0, 5), (10, 50), (20, 50), (45, 50)], b)
    assert [o.desired for o in outs] == [1, 1, 1, 5]
    assert outs[1].reason == "ScaleUpStabilizing"


def test_no_rate_keeps_the_replicas():
    out = autoscale.decide(autoscale.Inputs(T0, 3, 10.0, B))
    assert out.desired == 3 and out.reason == "NoReading"


def test_queue_time_over_its_bound_adds_a_replica_the_rate_does_not_ask_for():
    b = autoscale.Bounds(1, 10, 1.0, 0, 0, 300, max_avg_queue_ms=5)
    out = autoscale.decide(autoscale.Inputs(T0, 2, 10.0, b, rate_qps=19, avg_queue_ms=40))
    assert out.desired == 3 and out.reason == "QueueTimeHigh"


def test_the_history_keeps_a_run_of_equal_recommendations_once_and_forgets_past_the_window():
    outs = run([(i * 5, 25) for i in range(100)])
    assert len(outs[-1].history) == 1
    outs = run([(0, 25), (10, 5), (400, 5)])
    assert [r for _, r in outs[-1].history] == [1]


def test_the_rate_is_the_counter_difference_per_pod_over_its_own_interval():
    before = {"a": autoscale.pod_reading(100, 1000, at(0)), "b": autoscale.pod_reading(50, 0, at(0))}
    after = {"a": autoscale.pod_reading(200, 51000, at(10)), "b": autoscale.pod_reading(150, 49000, at(5)),
             "new": autoscale.pod_reading(999, 0, at(10))}
    qps, queue_ms, counted = autoscale.rate(before, after)[:3]
    assert counted == 2 and qps == pytest.approx(10 + 20)
    assert queue_ms == pytest.approx(99_000 / 200 / 1000)
    restarted = {"a": autoscale.pod_reading(3, 0, at(10))}
    assert autoscale.rate(before, restarted) == autoscale.NO_RATE, "a restarted pod counts from its next reading"
    assert autoscale.rate(None, after).qps is None


# -- the spec -------------------------------------------------------------------------------------

def spec(**autoscaling) -> RankingModelSpec:
    return RankingModelSpec.model_validate({**copy.deepcopy(SMALL), "autoscaling": autoscaling})


def test_without_a_plan_the_capacity_per_replica_is_required_and_named():
    with pytest.raises(ValidationError, match="autoscaling.capacityPerReplicaQps is required"):
        spec(enabled=True, maxReplicas=4)
    with pytest.raises(ValidationError, match="autoscaling.maxReplicas is required"):
        spec(enabled=True, capacityPerReplicaQps=10)
    with pytest.raises(ValidationError, match="minReplicas 5 exceeds"):
        spec(enabled=True, capacityPerReplicaQps=10, minReplicas=5, maxReplicas=4)
    assert spec(enabled=True, mode="external").autoscaling.external
    s = spec(enabled=True, maxReplicas=4, capacityPerReplicaQps=10)
    assert s.autoscaling.scale_up_stabilization_seconds == 0 and s.autoscaling.scale_down_stabilization_seconds == 300


# -- the plan -------------------------------------------------------------------------------------

AUTOSCALED = {"enabled": True, "minReplicas": 1, "maxReplicas": 5, "capacityPerReplicaQps": 10,
              "targetUtilization": 1.0, "scaleDownStabilizationSeconds": 60}


def body(status=None, **extra) -> dict:
    b = _model("scaled", replicas=1, planning={"failureTolerance": 0}, autoscaling=dict(AUTOSCALED), **extra)
    b["metadata"].update(uid="u1", generation=1)
    if status is not None:
        b["status"] = status
    return b


def stable_dep(replicas: int, version: str = "1") -> dict:
    return {"metadata": {"name": "scaled-stable", "generation": 1},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": {names.LABEL_VERSION: version}}}},
            "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": replicas,
                       "updatedReplicas": replicas}}


def plan_at(b: dict, second: float, per_pod_requests: dict[str, float], dep: dict | None = None):
    rm, _ = modelplan.parse(b)
    reading = {pod: autoscale.pod_reading(n, 0, at(second)) for pod, n in per_pod_requests.items()}
    return modelplan.plan(b, modelplan.ModelObserved(now=at(second), resolved=resolve_shape(rm.spec),
                                                     stable_dep=dep, autoscale_reading=reading))


def stable_replicas(done: modelplan.ModelPlan) -> int:
    return next(o for o in done.applies if o["kind"] == "Deployment"
                and o["metadata"]["name"] == "scaled-stable")["spec"]["replicas"]


def test_the_plan_serves_the_decided_replicas_says_why_and_posts_an_event():
    first = plan_at(body(), 0, {"p1": 0}, stable_dep(1))
    assert first.status.to_wire()["autoscaling"]["reason"] == "NoReading" and stable_replicas(first) == 1
    assert first.polls, "the load is read every --interval"
    second = plan_at(body(first.status), 10, {"p1": 250}, stable_dep(1))
    scaled = second.status.to_wire()["autoscaling"]
    assert scaled["desiredReplicas"] == 3 and scaled["observedQps"] == 25.0 and scaled["capacitySource"] == "spec"
    assert stable_replicas(second) == 3 and second.status.to_wire()["replicas"] == 3 and second.status.to_wire()["ready"] == "1/3"
    assert [e.reason for e in second.events if e.reason == autoscale.SCALED] == ["Scaled"]
    assert "1 -> 3" in next(e.message for e in second.events if e.reason == "Scaled")
    pdb = next(o for o in second.applies if o["kind"] == "PodDisruptionBudget" and "stable" in o["metadata"]["name"])
    assert pdb["spec"]["minAvailable"] == 3, "failureTolerance 0: the budget follows the scaled replicas"


def test_an_operator_restart_mid_window_keeps_the_window_from_status():
    status = plan_at(body(), 0, {"p1": 0}, stable_dep(1)).status
    status = plan_at(body(status), 10, {"p1": 250}, stable_dep(1)).status           # up to 3
    status = plan_at(body(status), 20, {"p1": 300, "p2": 50, "p3": 50}, stable_dep(3)).status   # 5 req/s now
    assert status.autoscaling.desired_replicas == 3
    # A new operator process: nothing but the status it reads back (as the API server stores it).
    restarted = copy.deepcopy(status.to_wire())
    held = plan_at(body(restarted), 50, {"p1": 450, "p2": 50, "p3": 50}, stable_dep(3))
    assert held.status.to_wire()["autoscaling"]["reason"] == "ScaleDownStabilizing" and stable_replicas(held) == 3
    down = plan_at(body(held.status), 80, {"p1": 600, "p2": 50, "p3": 50}, stable_dep(3))
    assert down.status.to_wire()["autoscaling"]["desiredReplicas"] == 1, "60 s after the last recommendation of 3"
    assert stable_replicas(down) == 1


def test_a_reconcile_that_reads_nothing_keeps_what_was_decided():
    status = plan_at(body(), 0, {"p1": 0}, stable_dep(1)).status
    status = plan_at(body(status), 10, {"p1": 250}, stable_dep(1)).status
    rm, _ = modelplan.parse(body(status))
    again = modelplan.plan(body(status), modelplan.ModelObserved(now=at(11), resolved=resolve_shape(rm.spec),
                                                                 stable_dep=stable_dep(3)))
    assert stable_replicas(again) == 3 and not [e for e in again.events if e.reason == "Scaled"]
    assert again.status.autoscaling == status.autoscaling
    assert not autoscale.reading_due(rm.spec, status.autoscaling, at(12))
    assert autoscale.reading_due(rm.spec, status.autoscaling, at(16))


@pytest.mark.parametrize("traffic, weight, stable, canary", [("replicas", 25, 3, 1), ("replicas", 50, 4, 4),
                                                             ("gatewayAPI", 50, 4, 2)])
def test_during_canary_the_canary_follows_the_scaled_stable(traffic, weight, stable, canary):
    from rankops.rollout.canary_hold import canary_size

    s = RankingModelSpec.model_validate({**copy.deepcopy(SMALL), "rollout": {"canary": {
        "traffic": traffic, "weight": weight, **({"parentRef": "gw"} if traffic == "gatewayAPI" else {})}}})
    assert canary_size(s, stable, weight)[0] == canary


def test_the_rollout_step_sees_the_scaled_size_and_promotion_keeps_it():
    status = plan_at(body(), 0, {"p1": 0}, stable_dep(1)).status
    status = plan_at(body(status), 10, {"p1": 250}, stable_dep(1)).status
    b = body(status)
    b["spec"]["versions"].append({**b["spec"]["versions"][0], "name": "2"})
    b["spec"]["version"] = "2"
    done = plan_at(b, 11, {"p1": 260}, stable_dep(3))
    deployments = {o["metadata"]["name"]: o["spec"]["replicas"] for o in done.applies if o["kind"] == "Deployment"}
    assert deployments["scaled-stable"] == 3, "a rollout starts beside the scaled stable"
    assert done.status.to_wire()["replicas"] == 3


def test_mode_external_applies_the_stable_without_replicas_and_reports_the_deployments_count():
    b = _model("scaled", autoscaling={"enabled": True, "mode": "external"})
    b["metadata"].update(uid="u1", generation=1)
    rm, _ = modelplan.parse(b)
    done = modelplan.plan(b, modelplan.ModelObserved(now=T0, resolved=resolve_shape(rm.spec), stable_dep=stable_dep(7),
                                                     external_scaler="HorizontalPodAutoscaler/scaled"))
    dep = next(o for o in done.applies if o["kind"] == "Deployment")
    assert "replicas" not in dep["spec"], "server-side apply leaves spec.replicas to the HPA"
    assert done.status.to_wire()["autoscaling"] == {
        "mode": "external", "external": "HorizontalPodAutoscaler/scaled", "desiredReplicas": 7, "reason": "External",
        "message": "HorizontalPodAutoscaler/scaled owns the stable Deployment's replicas (7 now): rankops applies it "
                   "without spec.replicas", "recommendations": []}
    assert done.status.to_wire()["replicas"] == 7
    ready = done.status.model_copy(update={"phase": "Ready", "observed_generation": 1})
    assert not after_reconcile(rm.spec, ready, ready, 1, T0).polls, "nothing to read: no --interval visits"


def test_turning_autoscaling_off_goes_back_to_the_spec_and_drops_the_status():
    status = plan_at(body(), 0, {"p1": 0}, stable_dep(1)).status
    status = plan_at(body(status), 10, {"p1": 250}, stable_dep(1)).status
    b = body(status)
    b["spec"]["autoscaling"]["enabled"] = False
    done = plan_at(b, 20, {}, stable_dep(3))
    assert stable_replicas(done) == 1 and "autoscaling" not in done.status


def test_the_plans_sustainable_rate_is_the_capacity_with_batching_auto():
    from rankops.api.rankingmodel import RankingModelSpec as Spec

    planned = {**copy.deepcopy(SMALL), "batching": "auto", "slo": {"p99LatencyMs": 50, "targetQps": 200},
               "planning": {"latencyProfile": {1: 2.0, 8: 3.0, 32: 6.0}, "failureTolerance": 1},
               "autoscaling": {"enabled": True, "maxReplicas": 8}}
    s = Spec.model_validate(planned)
    resolved = resolve_shape(s)
    cap, source = autoscale.capacity(s, resolved.plan)
    assert source == "plan" and cap == pytest.approx(resolved.plan.qps_per_gpu * s.gpus_per_replica)


def test_mode_external_hands_spec_replicas_over_once_before_leaving_it_out():
    from rankops.controller import writes
    from tests.fakecluster import FakeCluster

    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "hpa-stable", "namespace": "reco"}}
    cluster = FakeCluster()
    cluster.apply({**deployment, "spec": {"replicas": 4, "template": {}}})   # rankops owned spec.replicas
    cluster.calls.clear()

    def applies():
        return [(c.options["field_manager"], c.body) for c in cluster.requests("apply")]

    applied = [{"kind": "Deployment", "metadata": {"name": "hpa-stable"}, "spec": {"template": {}}}]
    memory = writes.Writes()
    memory.hand_over_replicas(cluster, "reco", "hpa-stable", applied)
    assert applies() == [(writes.HANDOVER_MANAGER, {**deployment, "spec": {"replicas": 4}})]
    memory.hand_over_replicas(cluster, "reco", "hpa-stable", applied)
    assert len(applies()) == 1, "checked once per process"
    # rankops applies without spec.replicas: the value stays, the handover's manager applied it too.
    cluster.apply({**deployment, "spec": {"template": {}}})
    assert cluster.stored("Deployment", "reco", "hpa-stable")["spec"]["replicas"] == 4
    cluster.calls.clear()
    memory = writes.Writes()   # another process
    memory.hand_over_replicas(cluster, "reco", "hpa-stable", applied)
    assert applies() == [], "rankops no longer owns it: nothing to hand over"


def test_lowered_bounds_apply_at_once_and_say_so():
    status = plan_at(body(), 0, {"p1": 0}, stable_dep(1)).status
    status = plan_at(body(status), 10, {"p1": 250}, stable_dep(1)).status
    b = body(status)
    b["spec"]["autoscaling"]["maxReplicas"] = 2
    rm, _ = modelplan.parse(b)
    done = modelplan.plan(b, modelplan.ModelObserved(now=at(11), resolved=resolve_shape(rm.spec), stable_dep=stable_dep(3)))
    assert stable_replicas(done) == 2
    assert [e.message.split(":")[0] for e in done.events if e.reason == "Scaled"] == ["stable replicas 3 -> 2"]


def test_switched_on_it_starts_from_what_runs():
    done = plan_at(body(), 0, {"p1": 0}, stable_dep(4))
    assert done.status.to_wire()["autoscaling"]["desiredReplicas"] == 4 and stable_replicas(done) == 4
    assert not [e for e in done.events if e.reason == "Scaled"]
