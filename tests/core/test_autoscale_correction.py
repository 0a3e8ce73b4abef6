"""Capacity that corrects itself (planner/correction.py) and shed requests as demand
(rankops.autoscale): the pure rules, then a closed loop where the offline profile is wrong by 30%
in each direction and the "true" server is the plan's simulator on the true profile."""
from __future__ import annotations

import copy
import datetime as dt

import pytest

from rankops import autoscale
from rankops.api.autoscaling import CapacityCorrection
from rankops.api.rankingmodel import RankingModelSpec
from rankops.planner import correction
from rankops.planner.profile import LatencyProfile
from rankops.planner.simulator import simulate
from rankops.render.desired import resolve_shape

from tests.core.test_render_is_the_plan import SMALL

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
CURVE = ((10.0, 10.0), (100.0, 20.0))     # per-replica req/s -> predicted mean ms
CAP = 100.0
PROFILE = {1: 7.0, 4: 13.0, 8: 21.0, 16: 37.0}   # t(b) ~ 5 + 2b ms, as in issue 40
BUDGET = 60.0


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def seen(second: float, observed_ms: float, qps: float = 55.0, requests: float = 1000) -> correction.Evidence:
    return correction.Evidence(at(second), qps, requests, observed_ms)   # predicted at 55 req/s: 15 ms


def feed(observed: list[float], recorded: CapacityCorrection | None = None, basis: str = "plan-a"
         ) -> list[CapacityCorrection]:
    out = []
    for i, ms in enumerate(observed):
        recorded = correction.correct(recorded, basis, CAP, CURVE, seen(15 * (i + 1), ms))
        out.append(recorded)
    return out


def test_a_slower_replica_lowers_the_factor_at_once():
    first = feed([30.0])[0]                       # k = 2: factor 0.5 x 1/2 + 0.5 x 1
    assert first.slowdown == 2.0 and first.factor == pytest.approx(0.75) and first.readings == 1
    assert "lowered" in first.message and "observed 30.00 ms mean vs predicted 15.00 ms" in first.evidence


def test_a_faster_replica_raises_it_only_after_three_readings_in_a_row():
    steps = feed([10.0, 10.0, 10.0])              # k = 2/3: wanted 0.5 x 1.5 + 0.5 = 1.25
    assert [c.factor for c in steps] == [1.0, 1.0, pytest.approx(1.25)]
    assert [c.raise_streak for c in steps] == [1, 2, 0]
    broken = feed([10.0, 10.0, 15.0, 10.0])       # a reading within the deadband breaks the run
    assert [c.raise_streak for c in broken] == [1, 2, 0, 1] and broken[-1].factor == 1.0


def test_the_factor_stays_within_its_bounds():
    down = [c.factor for c in feed([15.0 * 100] * 6)]
    up = [c.factor for c in feed([15.0 / 100] * 12)]
    assert min(down) >= correction.LOWEST and down[-1] == pytest.approx(correction.LOWEST, abs=0.01)
    assert max(up) == correction.HIGHEST


@pytest.mark.parametrize("qps, requests, why", [
    (55.0, 50, "fewer than 100 requests"),
    (20.0, 1000, "per-replica rate under 30% of the capacity (75.0 req/s)"),
    (150.0, 9000, "beyond the plan's predicted curve"),
])
def test_too_little_evidence_is_recorded_and_the_factor_kept(qps, requests, why):
    before = feed([30.0])[0]                      # factor 0.75: 30% of 75 req/s is the floor
    after = correction.correct(before, "plan-a", CAP, CURVE, correction.Evidence(at(30), qps, requests, 300.0))
    assert after.factor == before.factor and after.readings == before.readings
    assert after.message.startswith("not enough evidence") and why in after.message
    assert after.updated_at == "2026-12-01T12:00:30Z", "recorded: the same reading again changes nothing"


def test_a_new_plan_basis_starts_over():
    lowered = feed([30.0])[0]
    fresh = correction.correct(lowered, "plan-b", CAP, CURVE, None)
    assert (fresh.factor, fresh.readings, fresh.plan_basis) == (1.0, 0, "plan-b")


def test_the_same_reading_twice_changes_nothing():
    once = feed([30.0])[0]
    again = correction.correct(once, "plan-a", CAP, CURVE, seen(15, 30.0))
    assert again == once
    older = correction.correct(once, "plan-a", CAP, CURVE, seen(5, 60.0))
    assert older == once, "a reading older than the one counted is not counted"


def test_the_predicted_curve_interpolates_and_stops_at_saturation():
    assert correction.predicted_ms(CURVE, 55.0) == pytest.approx(15.0)
    assert correction.predicted_ms(CURVE, 1.0) == 10.0
    assert correction.predicted_ms(CURVE, 101.0) is None


# -- shed requests are demand -----------------------------------------------------------------------

B = autoscale.Bounds(min_replicas=1, max_replicas=10, target_utilization=1.0, failure_tolerance=0,
                     up_window_s=0, down_window_s=300)


def test_shed_requests_count_in_the_rate_and_the_shed_ratio():
    before = {"a": autoscale.pod_reading(1000, 0, at(0), rejected=0, served=1000)}
    after = {"a": autoscale.pod_reading(2000, 0, at(10), rejected=100, served=900 + 1000)}
    seen_rate = autoscale.rate(before, after)
    assert seen_rate.qps == 100.0, "asked for: served and shed alike"
    assert seen_rate.served_qps == 90.0 and seen_rate.rejected_qps == 10.0 and seen_rate.shed_ratio == 0.1


def test_shedding_adds_a_replica_when_the_rate_says_they_suffice():
    out = autoscale.decide(autoscale.Inputs(at(0), 3, 10.0, B, rate_qps=29.0, shed_ratio=0.05))
    assert (out.desired, out.reason) == (4, "Shedding") and "shed 5.0% of 29.0 req/s" in out.message
    calm = autoscale.decide(autoscale.Inputs(at(0), 3, 10.0, B, rate_qps=29.0, shed_ratio=0.005))
    assert (calm.desired, calm.reason) == (3, "WithinTarget"), "under 1%: what a P99 lets be late anyway"


def _two_pods(second: float, requests: float, rejected: float, canary_rejected: float = 0.0) -> dict:
    """Two stable pods and a canary pod, each asked `requests` since the start."""
    def pod(rejected: float, track: str) -> dict:
        return autoscale.pod_reading(requests, 0, at(second), rejected=rejected, served=requests - rejected,
                                     track=track)
    return {"a": pod(rejected, "stable"), "b": pod(rejected, "stable"), "c": pod(canary_rejected, "canary")}


def test_status_carries_the_shed_ratio_and_stable_shedding_adds_a_replica():
    s = spec(correct=False, capacity=10.0)
    first = autoscale.step(s, None, _two_pods(0, 0, 0), 2, 0, at(0))
    second = autoscale.step(s, first.status, _two_pods(10, 60, 6), 2, 0, at(10))
    assert second.status.shed_ratio == round(12 / 180, 4) and second.status.observed_qps == 18.0
    assert second.status.reason == "Shedding" and second.replicas == 3
    assert second.status.capacity_correction is None, "no plan, correction off: nothing to record"


def test_a_shedding_canary_adds_no_stable_replica():
    s = spec(correct=False, capacity=10.0)
    first = autoscale.step(s, None, _two_pods(0, 0, 0), 2, 0, at(0))
    second = autoscale.step(s, first.status, _two_pods(10, 60, 0, canary_rejected=24), 2, 0, at(10))
    assert second.status.shed_ratio > 0.1, "status shows the model's shedding, canary included"
    assert (second.status.reason, second.replicas) == ("WithinTarget", 2), "the rollout judges the canary"


def test_shedding_waits_for_the_replica_it_added():
    """A new replica counts from its second reading: until then the shedding it is meant to end
    adds no other (3 -> 4 -> 5 ... while it starts)."""
    s = spec(correct=False, capacity=10.0)
    first = autoscale.step(s, None, _two_pods(0, 0, 0), 2, 0, at(0))
    added = autoscale.step(s, first.status, _two_pods(10, 60, 6), 2, 0, at(10))
    assert added.replicas == 3
    starting = _two_pods(20, 120, 12)
    starting["d"] = autoscale.pod_reading(5, 0, at(20))     # read once: not counted yet
    held = autoscale.step(s, added.status, starting, 2, 0, at(20))
    assert held.replicas == 3 and held.status.reason != "Shedding"


# -- the closed loop ----------------------------------------------------------------------------------

def spec(correct: bool = True, capacity: float | None = None) -> RankingModelSpec:
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 30, "targetUtilization": 0.9,
               "scaleDownStabilizationSeconds": 30, "correctCapacity": correct}
    if capacity is not None:
        scaling["capacityPerReplicaQps"] = capacity
    return RankingModelSpec.model_validate({
        **copy.deepcopy(SMALL), "batching": "auto", "slo": {"p99LatencyMs": BUDGET, "targetQps": 400},
        "planning": {"latencyProfile": PROFILE, "failureTolerance": 0}, "autoscaling": scaling})


def closed_loop(truth: float, correct: bool, load_x: float = 5.0, readings: int = 30, interval: float = 15.0):
    """Drive autoscale.step with the counters of a server whose compute is `truth` x the profile's,
    at a fixed load of `load_x` plan capacities; the server's latency is the simulator's on the true
    profile. Returns (replicas, simulated P99 there, status) once settled."""
    s = spec(correct)
    plan = resolve_shape(s).plan
    true_profile = LatencyProfile(tuple((b, ms * truth) for b, ms in plan.inputs.profile.points))
    load = load_x * plan.qps_per_gpu
    recorded, replicas, counters, p99 = None, 1, {}, None
    for i in range(readings):
        now = at(interval * i)
        per_replica = load / replicas
        sim = simulate(true_profile, plan.config, rate_qps=per_replica, requests=4000,
                       slowdown=plan.inputs.shared_gpu_slowdown)
        counters = {f"p{p}": counters.get(f"p{p}", (0.0, 0.0)) for p in range(replicas)}
        counters = {pod: (n + per_replica * interval, us + per_replica * interval * sim.mean_ms * 1000)
                    for pod, (n, us) in counters.items()}
        reading = {pod: autoscale.pod_reading(n, 0, now, request_us=us) for pod, (n, us) in counters.items()}
        out = autoscale.step(s, recorded, reading, plan.replicas, 0, now, plan=plan)
        recorded, replicas, p99 = out.status, out.replicas, sim.p99_ms
    return replicas, p99, recorded


def test_a_profile_30_percent_optimistic_breaks_the_budget_uncorrected_and_holds_it_corrected():
    plain, plain_p99, _ = closed_loop(1.3, correct=False)
    fixed, fixed_p99, status = closed_loop(1.3, correct=True)
    assert plain_p99 > BUDGET, f"uncorrected: {plain} replicas, P99 {plain_p99:.1f} ms"
    assert fixed_p99 <= BUDGET and fixed > plain, f"corrected: {fixed} replicas, P99 {fixed_p99:.1f} ms"
    c = status.capacity_correction
    assert c.factor < 0.8 and c.slowdown > 1.0 and c.readings > 3 and c.applied
    assert status.capacity_per_replica_qps == pytest.approx(
        resolve_shape(spec()).plan.qps_per_gpu * c.factor, rel=1e-3)


def test_a_profile_30_percent_pessimistic_frees_replicas_and_still_holds_the_budget():
    plain, plain_p99, _ = closed_loop(0.7, correct=False)
    fixed, fixed_p99, status = closed_loop(0.7, correct=True)
    assert plain_p99 <= BUDGET and fixed_p99 <= BUDGET
    assert fixed < plain, f"{fixed} replicas corrected vs {plain} uncorrected"
    assert status.capacity_correction.factor > 1.2


def test_a_spec_capacity_is_measured_against_the_plan_but_not_corrected():
    s = spec(capacity=300.0)
    plan = resolve_shape(s).plan
    first = autoscale.step(s, None, {"a": autoscale.pod_reading(0, 0, at(0), request_us=0)}, 1, 0, at(0), plan=plan)
    slow = autoscale.step(s, first.status, {"a": autoscale.pod_reading(3000, 0, at(15), request_us=3000 * 500e3)},
                          1, 0, at(15), plan=plan)
    c = slow.status.capacity_correction
    assert c is not None and not c.applied and c.factor < 1.0 and "not applied" in c.message
    assert slow.status.capacity_per_replica_qps == 300.0


def test_a_forged_request_time_is_not_a_reading_and_an_older_reading_moves_nothing():
    implausible: list[str] = []
    before = {"a": autoscale.pod_reading(0, 0, at(0)), "b": autoscale.pod_reading(0, 0, at(0))}
    after = {"a": autoscale.pod_reading(1000, 0, at(10), request_us=1000 * 20e3),
             "b": autoscale.pod_reading(1000, 0, at(10), request_us=1e18)}
    seen_rate = autoscale.rate(before, after, implausible)
    assert seen_rate.pods == 1 and seen_rate.mean_request_ms == pytest.approx(20.0)
    assert implausible and "request time" in implausible[0]
    old = {"a": {"requests": 0, "queueUs": 0, "at": "2026-12-01T12:00:00Z"}}   # before shed and latency keys
    upgraded = autoscale.rate(old, {"a": autoscale.pod_reading(100, 0, at(10), rejected=40, request_us=9e9)})
    assert upgraded.qps == 10.0 and upgraded.shed_ratio == 0.0 and upgraded.mean_request_ms is None


def test_a_restart_goes_on_from_status_and_the_same_reading_twice_changes_nothing():
    from rankops.api.autoscaling import AutoscalingStatus

    s = spec()
    plan = resolve_shape(s).plan
    per = plan.qps_per_gpu * 0.8
    first = autoscale.step(s, None, {"a": autoscale.pod_reading(0, 0, at(0))}, 1, 0, at(0), plan=plan)
    reading = {"a": autoscale.pod_reading(per * 15, 0, at(15), request_us=per * 15 * 200e3)}   # 200 ms: slow
    slow = autoscale.step(s, first.status, reading, 1, 0, at(15), plan=plan)
    assert slow.status.capacity_correction.factor < 1.0
    wire = slow.status.model_dump(by_alias=True, exclude_none=True)
    assert "capacityCorrection" in wire and wire["capacityCorrection"]["raiseStreak"] == 0
    restarted = AutoscalingStatus.model_validate(wire)
    again = autoscale.step(s, restarted, reading, 1, 0, at(16), plan=plan)
    assert again.status.capacity_correction == slow.status.capacity_correction
    assert again.status.capacity_per_replica_qps == slow.status.capacity_per_replica_qps


def test_a_restarted_operator_that_takes_the_plan_from_status_keeps_correcting():
    """After a restart the shape comes from status.plan unsimulated (render/planned.from_status:
    no PlanResult): the factor stands and the recorded curve keeps judging new readings."""
    from rankops.api.autoscaling import AutoscalingStatus
    from rankops.render import planned

    s = spec()
    resolved = resolve_shape(s)
    status_plan = planned.plan_status(resolved, planned.inputs_digest(s))
    after_restart = planned.from_status(s, status_plan, status_plan.inputs_digest)
    assert after_restart is not None and after_restart.plan is None
    per = resolved.plan.qps_per_gpu * 0.8

    def reading(second: float, ms: float) -> dict:
        n = per * second
        return {"a": autoscale.pod_reading(n, 0, at(second), request_us=n * ms * 1000)}

    first = autoscale.step(s, None, reading(0, 0), 1, 0, at(0), plan=resolved.plan, plan_status=status_plan)
    slow = autoscale.step(s, first.status, reading(15, 200), 1, 0, at(15), plan=resolved.plan, plan_status=status_plan)
    assert slow.status.capacity_correction.factor < 1.0 and len(slow.status.capacity_correction.curve) == 14
    restarted = AutoscalingStatus.model_validate(slow.status.model_dump(by_alias=True, exclude_none=True))
    kept = autoscale.step(s, restarted, None, 1, 0, at(20), plan=None, plan_status=status_plan)
    assert kept.status.capacity_correction.factor == slow.status.capacity_correction.factor
    assert kept.status.capacity_per_replica_qps == pytest.approx(slow.status.capacity_per_replica_qps, rel=1e-3)
    slower = autoscale.step(s, restarted, reading(30, 400), 1, 0, at(30), plan=None, plan_status=status_plan)
    assert slower.status.capacity_correction.factor < slow.status.capacity_correction.factor, \
        "the recorded curve judges the reading after the restart"


def test_pods_whose_request_time_does_not_move_are_left_out_of_the_evidence_and_named():
    s = spec()
    plan = resolve_shape(s).plan
    per = plan.qps_per_gpu * 0.6
    predicted = correction.predicted_ms(correction.curve(plan), per)
    pods = ("honest", "liar-1", "liar-2", "liar-3")
    start = {p: autoscale.pod_reading(0, 0, at(0)) for p in pods}
    first = autoscale.step(s, None, start, 4, 0, at(0), plan=plan)
    readings, recorded = [], first.status
    for i in range(1, 5):
        n = per * 15 * i
        reading = {p: autoscale.pod_reading(n, 0, at(15 * i), request_us=n * predicted * 1000 if p == "honest" else 0)
                   for p in pods}
        recorded = autoscale.step(s, recorded, reading, 4, 0, at(15 * i), plan=plan).status
        readings.append(recorded.capacity_correction)
    assert all(abs(c.factor - 1.0) < 0.05 for c in readings), [c.factor for c in readings]
    assert "left out, request time did not move: liar-1" in readings[-1].evidence


@pytest.mark.parametrize("stored", [0.0, 1e-6, 50.0])
def test_a_factor_read_from_status_stays_within_its_bounds(stored):
    from rankops.api.autoscaling import AutoscalingStatus

    s = spec()
    plan = resolve_shape(s).plan
    first = autoscale.step(s, None, {"a": autoscale.pod_reading(0, 0, at(0))}, 1, 0, at(0), plan=plan)
    wire = first.status.model_dump(by_alias=True, exclude_none=True)
    wire["capacityCorrection"]["factor"] = stored
    out = autoscale.step(s, AutoscalingStatus.model_validate(wire), None, 1, 0, at(5), plan=plan)
    cap = plan.qps_per_gpu * s.gpus_per_replica
    assert 0.5 * cap - 1e-6 <= out.status.capacity_per_replica_qps <= 2.0 * cap + 1e-6
