"""A shared server's pods that follow its members' observed load (issue 42): the pure decision
(server_autoscale), the admission's time rule at a load (planner.shared_server.cards_for_load),
the per-member reading of a metrics page, and plan_server driven by it."""
from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from rankops import server_autoscale, serverplan
from rankops.api.sharedserver import ServerAutoscalingStatus, SharedServerSpec
from rankops.planner import inputs_from_spec
from rankops.planner.pack import ModelToPack
from rankops.planner.shared_server import cards_for_load, rounded_load, server_card
from rankops.render.serving import pool_placement
from rankops.triton import metrics
from tests.core.test_server_plan import member

T0 = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
NAMES = ("coarse", "fine", "rerank")


def server(**autoscaling) -> SharedServerSpec:
    return SharedServerSpec(gpuMemoryMiB=15360, maxReplicas=6, resources={"cpu": "4", "memory": "16Gi"},
                            autoscaling={"enabled": True, **autoscaling})


def members(failure_tolerance: int = 0):
    return [member(n, slo={"p99LatencyMs": 40, "targetQps": 3000}, planning={
        "latencyProfile": {1: 1.0, 64: 4.0}, "failureTolerance": failure_tolerance,
        "memory": {"weightsMiB": 2000, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}}) for n in NAMES]


def to_pack(views, spec=None):
    spec = spec or server()
    return [ModelToPack(v.name, inputs_from_spec(v.spec, gpu_memory_mib=spec.gpu_memory_mib)) for v in views]


def reading(at: dt.datetime, pods: dict[str, dict[str, float]]) -> dict:
    return {pod: server_autoscale.pod_reading(at, counts) for pod, counts in pods.items()}


def counters(seconds: float, qps: float, pods: int = 2, names=NAMES) -> dict[str, dict[str, float]]:
    """Each pod's counters after `seconds` of `qps` per member spread over `pods` pods."""
    return {f"p{i}": {n: qps * seconds / pods for n in names} for i in range(pods)}


def steps(spec, loads_by_time, start=2, recorded=None, views=None):
    """Run step over readings taken every 10 s at the given per-member rates; the scalings."""
    group = to_pack(views or members(), spec)
    total = {f"p{i}": {n: 0.0 for n in NAMES} for i in range(2)}
    out, previous = [], None
    for i, qps in enumerate(loads_by_time):
        at = T0 + dt.timedelta(seconds=10 * i)
        total = {pod: {n: c + qps * 10 / 2 for n, c in counts.items()} for pod, counts in total.items()}
        now = reading(at, total)
        scaled = server_autoscale.step(spec, recorded, now, group, start, at, previous=previous)
        previous = now
        out.append(scaled)
        # the status goes through the API and back, as a restart would read it
        recorded = ServerAutoscalingStatus.model_validate(scaled.status.model_dump(by_alias=True, exclude_none=True))
    return out


# --- the admission's time rule at a load -----------------------------------------------------------

def test_cards_grow_with_the_load_and_past_the_most_the_member_that_does_not_hold_is_named():
    spec = server()
    card, group = server_card(spec), to_pack(members(), spec)
    found = [cards_for_load(group, card, {n: q for n in NAMES})[0] for q in (0, 100, 3000, 6000, 12000)]
    assert found == sorted(found) and found[0] == 1 and found[-1] > found[1], found
    cards, why = cards_for_load(group, card, {n: 60000 for n in NAMES})
    assert cards is None and "not even 6 GPU(s) hold" in why and "coarse" in why


def test_each_members_failure_tolerance_holds_at_any_load():
    spec = server()
    card = server_card(spec)
    assert cards_for_load(to_pack(members(failure_tolerance=1), spec), card, {})[0] == 2
    assert cards_for_load(to_pack(members(failure_tolerance=0), spec), card, {})[0] == 1


def test_one_members_load_alone_sizes_the_server_and_others_at_no_load_add_no_time():
    spec = server()
    card, group = server_card(spec), to_pack(members(), spec)
    alone, _ = cards_for_load(group, card, {"coarse": 12000})
    together, _ = cards_for_load(group, card, {n: 12000 for n in NAMES})
    assert alone < together


def test_loads_are_rounded_up_so_close_readings_reuse_the_simulations():
    assert rounded_load(0.0) == 0.0 and rounded_load(0.01) == 0.0
    assert 100.0 <= rounded_load(100.0) < 105.0 and rounded_load(101.0) == rounded_load(102.0)


# --- the decision --------------------------------------------------------------------------------------

def test_the_first_reading_gives_no_rate_and_keeps_the_pods():
    first = steps(server(), [3000])[0]
    assert (first.replicas, first.status.reason) == (2, "NoReading")
    assert first.status.read_at and "reading" not in first.status.to_wire(), "the counters stay in memory"


def test_a_rise_scales_up_at_once_and_a_fall_waits_out_the_scale_down_window():
    spec = server(scaleDownStabilizationSeconds=60)
    rise = steps(spec, [100, 100, 12000, 12000], start=1)
    assert [s.replicas for s in rise] == [1, 1, rise[2].replicas, rise[2].replicas] and rise[2].replicas > 1
    assert rise[2].status.reason == "ScaledUp" and rise[2].events[0][1] == "Scaled"
    assert rise[2].status.observed_qps == pytest.approx({n: 12000 for n in NAMES}, rel=0.01)
    peak = rise[2].replicas
    fall = steps(spec, [12000] * 3 + [100] * 10, start=peak)
    replicas = [s.replicas for s in fall]
    first_low = replicas.index(min(replicas))
    assert replicas[3] == peak and fall[3].status.reason == "ScaleDownStabilizing"
    # 60 s of low readings after the peak's last recommendation: then down
    assert min(replicas) < peak and 8 <= first_low <= 10, replicas
    assert fall[first_low].status.reason == "ScaledDown"


def test_a_load_within_the_tolerance_of_the_pods_now_changes_nothing():
    spec = server(scaleDownStabilizationSeconds=0)
    group = to_pack(members(), spec)
    card = server_card(spec)
    # the load at which the count just changes: within 10% of it nothing moves
    for q in range(2000, 20000, 250):
        if cards_for_load(group, card, {n: q / 0.7 for n in NAMES})[0] != cards_for_load(
                group, card, {n: (q - 250) / 0.7 for n in NAMES})[0]:
            edge = q
            break
    above = cards_for_load(group, card, {n: edge / 0.7 for n in NAMES})[0]
    kept = steps(spec, [edge * 0.97, edge * 0.97], start=above)
    assert kept[-1].replicas == above and kept[-1].status.reason == "WithinTarget", kept[-1].status.message


def test_unread_pods_or_uncounted_members_hold_a_scale_down_but_not_a_scale_up():
    spec = server(scaleDownStabilizationSeconds=0)
    group = to_pack(members(), spec)
    before = reading(T0, counters(100, 100))
    recorded = ServerAutoscalingStatus(desired_replicas=5, read_at=before["p0"]["at"])
    later = T0 + dt.timedelta(seconds=10)
    now = reading(later, counters(110, 100))
    held = server_autoscale.step(spec, recorded, now, group, 5, later, previous=before,
                                 problems=["p2: metrics not read"])
    assert (held.replicas, held.status.reason) == (5, "ScaleDownHeld") and "p2: metrics not read" in held.status.message
    frozen = server_autoscale.step(spec, recorded, now, group, 5, later, previous=before, uncounted=["rerank"])
    assert (frozen.replicas, frozen.status.reason) == (5, "ScaleDownHeld") and "rerank" in frozen.status.message
    free = server_autoscale.step(spec, recorded, now, group, 5, later, previous=before)
    assert free.replicas < 5 and free.status.reason == "ScaledDown"
    recorded_low = recorded.model_copy(update={"desired_replicas": 1})
    busy = reading(later, {p: {n: c + 12000 * 10 / 2 for n, c in counts.items()}
                           for p, counts in counters(100, 100).items()})
    up = server_autoscale.step(spec, recorded_low, busy, group, 1, later, previous=before,
                               problems=["p2: metrics not read"])
    assert up.replicas > 1 and up.status.reason == "ScaledUp"


def test_the_pods_are_bounded_by_min_replicas_and_max_replicas():
    low = steps(server(minReplicas=3, scaleDownStabilizationSeconds=0), [1, 1], start=3)[-1]
    assert (low.replicas, low.status.reason) == (3, "AtMinReplicas")
    high = steps(server(), [60000, 60000], start=6)[-1]
    assert (high.replicas, high.status.reason) == (6, "AtMaxReplicas") and "not even 6" in high.status.message
    with pytest.raises(ValueError, match="autoscaling.minReplicas 7 exceeds maxReplicas 6"):
        server(minReplicas=7)


def test_not_read_this_round_the_decision_stands_and_off_there_is_none():
    spec = server()
    first = steps(spec, [100, 100])[-1]
    again = server_autoscale.step(spec, first.status, None, to_pack(members(), spec), 2, T0 + dt.timedelta(seconds=12))
    assert again.replicas == first.replicas and again.status == first.status and not again.events
    assert server_autoscale.step(SharedServerSpec(gpuMemoryMiB=15360), None, None, [], 1, T0) is None
    assert not server_autoscale.reading_due(spec, first.status, T0 + dt.timedelta(seconds=12))
    assert server_autoscale.reading_due(spec, first.status, T0 + dt.timedelta(seconds=20))


# --- counters to rates ---------------------------------------------------------------------------------

def test_a_pod_counts_for_a_member_from_its_second_reading_and_a_restart_is_left_out():
    before = reading(T0, {"a": {"coarse": 1000, "fine": 500}, "b": {"coarse": 1000}})
    after = reading(T0 + dt.timedelta(seconds=10), {"a": {"coarse": 2000, "fine": 600},
                                                    "b": {"coarse": 10, "fine": 9999}})   # b restarted
    rates, implausible, guessed = server_autoscale.member_rates(before, after, ["coarse", "fine"])
    # b restarted: its count is left out and a carries the mean for both; fine was not on b before
    assert {m: r.qps for m, r in rates.items()} == {"coarse": 200.0, "fine": 20.0} and not implausible
    assert guessed == ["coarse", "fine"], "a pod serving them was not counted: their rate is a guess"
    assert server_autoscale.member_rates(None, after, ["coarse"]) == (None, [], [])
    tripled, _, _ = server_autoscale.member_rates(before, after, ["coarse", "fine"], not_asked=1)
    assert {m: r.qps for m, r in tripled.items()} == {"coarse": 300.0, "fine": 30.0}   # 1 counted of 2 + 1 not asked
    stale = reading(T0 - dt.timedelta(seconds=server_autoscale.STALE_S), {"a": {"coarse": 0}})
    assert server_autoscale.member_rates(stale, after, ["coarse"])[0] is None, "the operator was away: no rate"


def test_a_pod_whose_counters_moved_more_than_a_pod_can_serve_is_left_out_and_named():
    before = reading(T0, {"a": {"coarse": 0}, "b": {"coarse": 0}})
    after = reading(T0 + dt.timedelta(seconds=10), {"a": {"coarse": 1000}, "b": {"coarse": 1e15}})
    rates, implausible, _ = server_autoscale.member_rates(before, after, ["coarse"])
    assert {m: r.qps for m, r in rates.items()} == {"coarse": 200.0}, "b is counted at a's rate"
    assert implausible and implausible[0].startswith("b: ")


PAGE = """# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="coarse",version="1"} 120
nv_inference_request_success{model="fine",version="1"} 30
nv_inference_request_success{model="other",version="1"} 7
nv_inference_request_failure{model="coarse",reason="REJECTED",version="1"} 5
nv_inference_queue_duration_us{model="fine",version="1"} 900
"""


def test_one_pass_over_a_page_reads_every_member_as_reading_each_alone_would():
    together = metrics.parse_models(PAGE, ["coarse", "fine", "absent"])
    for name in ("coarse", "fine", "absent"):
        alone = metrics.parse(PAGE, name)
        assert (together[name].values, together[name].quantiles_us, together[name].seen) == \
            (alone.values, alone.quantiles_us, alone.seen)
    assert together["coarse"].values["success"] + together["coarse"].values["failure"] == 125
    assert not together["absent"].seen
    with pytest.raises(metrics.MetricsRejected):
        metrics.parse_models(PAGE + 'nv_inference_request_success{model="fine",version="1"} 31\n', ["fine"])


# --- plan_server driven by the reading -------------------------------------------------------------------

def test_the_plan_runs_the_pods_the_reading_decides_and_looks_again_at_the_next_reading():
    spec = server()
    views = [dataclass_held(v) for v in members()]
    before = reading(T0, counters(100, 100, names=NAMES))
    recorded = ServerAutoscalingStatus(desired_replicas=1, read_at=before["p0"]["at"])
    later = T0 + dt.timedelta(seconds=10)
    busy = reading(later, {p: {n: c + 12000 * 10 / 2 for n, c in counts.items()}
                           for p, counts in counters(100, 100).items()})
    planned = serverplan.plan_server("ranking", "reco", spec, views, (), {}, pool_placement(None, None),
                                     replicas_now=1, load=serverplan.LoadSeen(later, recorded, busy, before))
    assert planned.replicas == planned.scaling.replicas > 1
    deployment = next(o for o in planned.objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == planned.replicas
    assert serverplan.next_look_s(planned, False, None) == server_autoscale.READ_EVERY_S
    off = serverplan.plan_server("ranking", "reco", server().model_copy(update={"autoscaling": type(
        spec.autoscaling)()}), views, (), {}, pool_placement(None, None), replicas_now=1,
        load=serverplan.LoadSeen(later, recorded, busy, before))
    assert off.scaling is None and off.replicas == off.admission.cards


def dataclass_held(view):
    return dataclasses.replace(view, held_version="1")


def test_a_member_whose_plan_cannot_be_made_keeps_the_pods_and_says_why():
    spec = server()
    broken = [member("coarse", replicas=1, planning={
        "latencyProfile": {1: 1.0, 64: 4.0}, "failureTolerance": 1,
        "memory": {"weightsMiB": 2000, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}})]
    before = reading(T0, {"p0": {"coarse": 0}})
    recorded = ServerAutoscalingStatus(desired_replicas=3, read_at=before["p0"]["at"])
    later = T0 + dt.timedelta(seconds=10)
    kept = server_autoscale.step(spec, recorded, reading(later, {"p0": {"coarse": 1000}}), to_pack(broken, spec), 3,
                                 later, previous=before)
    assert (kept.replicas, kept.status.reason) == (3, "CannotCount") and "failure tolerance" in kept.status.message


def test_a_member_triton_sheds_for_adds_a_pod_the_rule_did_not_ask_for():
    """The rule says the pods hold, but Triton shed 5% of fine's requests (its queue policy sheds what
    would miss the budget): the pods do not hold it, so one more, said with the share."""
    spec = server(scaleDownStabilizationSeconds=0)
    group = to_pack(members(), spec)
    at0, at1 = T0, T0 + dt.timedelta(seconds=10)
    before = {p: server_autoscale.pod_reading(at0, {n: 0 for n in NAMES}) for p in ("p0", "p1")}
    calm = {p: server_autoscale.pod_reading(at1, {n: 500 for n in NAMES}) for p in ("p0", "p1")}
    shed = {p: server_autoscale.pod_reading(at1, {n: 500 for n in NAMES}, {"fine": 25}) for p in ("p0", "p1")}
    recorded = ServerAutoscalingStatus(desired_replicas=2, read_at=before["p0"]["at"])
    assert server_autoscale.step(spec, recorded, calm, group, 2, at1, previous=before).replicas <= 2
    up = server_autoscale.step(spec, recorded, shed, group, 2, at1, previous=before)
    assert (up.replicas, up.status.reason) == (3, "Shedding"), up.status.message
    assert "Triton shed 5.0% of fine's requests" in up.status.message
    # a member the rule cannot size (frozen: its spec unreadable) is not sized, but its shed requests count
    counted = [m for m in group if m.name != "fine"]
    frozen = server_autoscale.step(spec, recorded, shed, counted, 2, at1, previous=before, uncounted=["fine"])
    assert (frozen.replicas, frozen.status.reason) == (3, "Shedding"), frozen.status.message
    assert "Triton shed 5.0% of fine's requests" in frozen.status.message
    quiet = server_autoscale.step(spec, recorded, calm, counted, 2, at1, previous=before, uncounted=["fine"])
    assert quiet.replicas == 2 and quiet.status.reason != "Shedding"


def test_a_member_whose_requests_queue_over_its_max_avg_queue_adds_a_pod_and_one_without_a_bound_does_not():
    """fine's requests waited 30 ms on average in Triton's queue (nv_inference_queue_duration_us over
    the requests served), over its own autoscaling.maxAvgQueueMs 20: the pods do not hold it. A
    member without the bound, and a reading without queue counters (an older operator's), add nothing."""
    spec = server(scaleDownStabilizationSeconds=0)
    group = to_pack(members(), spec)
    at0, at1 = T0, T0 + dt.timedelta(seconds=10)

    def pods(at, n, queue_ms=None):
        served = {m: n for m in NAMES}
        queue = {m: n * (queue_ms if m == "fine" else 1.0) * 1000 for m in NAMES} if queue_ms is not None else None
        return {p: server_autoscale.pod_reading(at, {m: n for m in NAMES}, None, served if queue else None, queue)
                for p in ("p0", "p1")}
    before, queued = pods(at0, 0, 0.0), pods(at1, 500, 30.0)

    def decide(desired, after=queued, previous=before, bounds={"fine": 20.0}):
        recorded = ServerAutoscalingStatus(desired_replicas=desired, read_at=previous["p0"]["at"])
        return server_autoscale.step(spec, recorded, after, group, desired, at1, previous=previous,
                                     max_queue_ms=bounds)
    up = decide(1)          # the rule asks 1 pod here
    assert (up.replicas, up.status.reason) == (2, "Queueing"), up.status.message
    assert "fine's requests queued 30.0 ms on average (over its autoscaling.maxAvgQueueMs 20)" in up.status.message
    assert (decide(2).replicas, decide(2).status.reason) == (2, "Queueing"), "it holds the pod it added"
    assert decide(4).replicas < 4, "never more than one pod above the rule: one tenant's bound sizes no one else's"
    assert decide(1, bounds={"coarse": 20.0}).replicas == 1, "a member without the bound adds nothing"
    assert decide(1, pods(at1, 500), pods(at0, 0)).replicas == 1, "a reading without queue counters times nothing"
    few = decide(1, pods(at1, 40, 30.0))        # 80 requests served: too few to judge a mean
    assert few.replicas == 1, few.status.message


def test_a_queue_counter_missing_from_one_page_measures_no_window_across_it():
    """A page without fine's queue series (parse_models reads 0) while it served: that reading holds no
    queue for fine, so neither window touching it is judged; its request rate stands."""
    at = [T0 + dt.timedelta(seconds=10 * i) for i in range(3)]
    full = lambda t, n, q: {"p0": server_autoscale.pod_reading(t, {"fine": n}, None, {"fine": n}, {"fine": q})}  # noqa: E731
    first, dip, back = full(at[0], 1000, 5e5), full(at[1], 1100, 0.0), full(at[2], 1200, 6e5)
    assert "fine" not in dip["p0"].get("queueUs", {}), "served with no queue time at all: untimed"
    assert server_autoscale.queue_ms(first, dip, "fine") == (None, 0.0)
    assert server_autoscale.queue_ms(dip, back, "fine") == (None, 0.0), "no window across the gap"
    rates, _, _ = server_autoscale.member_rates(dip, back, ["fine"])
    assert rates["fine"].qps == pytest.approx(10.0)
    jumped = full(at[2], 1200, 5e5 + 200 * 120e6)        # 120 s a request served in a 20 s window: no reading
    assert server_autoscale.queue_ms(first, jumped, "fine")[0] is None


def test_held_members_none_of_which_can_be_counted_keep_the_pods_they_run():
    """Every held member's planning removed: nothing of the load can be sized, so the pods stay
    (never the one pod an empty admission would give), said in status.autoscaling."""
    spec = server()
    unplanned = [dataclass_held(member(n, planning=None)) for n in ("coarse", "fine")]
    planned = serverplan.plan_server("ranking", "reco", spec, unplanned, (), {}, pool_placement(None, None),
                                     replicas_now=5, load=serverplan.LoadSeen(T0))
    assert planned.replicas == 5 and planned.scaling.status.reason == "CannotCount"
    assert "coarse, fine" in planned.scaling.status.message
    # none can be sized, but Triton sheds 5% of fine's requests: one pod more than the pods running
    at0, at1 = T0, T0 + dt.timedelta(seconds=10)
    before = {p: server_autoscale.pod_reading(at0, {n: 0 for n in NAMES}) for p in ("p0", "p1")}
    shed = {p: server_autoscale.pod_reading(at1, {n: 500 for n in NAMES}, {"fine": 25}) for p in ("p0", "p1")}
    shedding = serverplan.plan_server("ranking", "reco", spec, unplanned, (), {}, pool_placement(None, None),
                                      replicas_now=5, load=serverplan.LoadSeen(at1, None, shed, before))
    assert (shedding.replicas, shedding.scaling.status.reason) == (6, "Shedding"), shedding.scaling.status.message
    assert "Triton shed 5.0% of fine's requests" in shedding.scaling.status.message


def test_a_pod_whose_members_together_moved_more_than_one_triton_serves_is_left_out():
    """Each member's count within one pod's bound, their sum over it: one Triton serves them all."""
    names = [f"m{i}" for i in range(4)]
    before = reading(T0, {"a": {n: 0 for n in names}, "b": {n: 0 for n in names}})
    after = reading(T0 + dt.timedelta(seconds=10), {"a": {n: 1000 for n in names}, "b": {n: 400_000 for n in names}})
    rates, implausible, _ = server_autoscale.member_rates(before, after, names)
    assert implausible == ["b: 1.6e+06 requests in 10s, over 100000/s: not a reading (all members)"], implausible
    assert {m: r.qps for m, r in rates.items()} == {n: 200.0 for n in names}, "b carries a's rate"


def test_a_member_over_the_room_is_counted_with_its_new_needs_and_holds_a_scale_down():
    from tests.core.test_server_plan import grown_past_the_room

    first, pod, views = grown_past_the_room()
    before = reading(T0, {"ranking-shared-a": {"a": 0, "b": 0}})
    later = T0 + dt.timedelta(seconds=10)
    now = reading(later, {"ranking-shared-a": {"a": 10, "b": 10}})
    recorded = ServerAutoscalingStatus(desired_replicas=4, read_at=before["ranking-shared-a"]["at"])
    spec = server(scaleDownStabilizationSeconds=0)
    planned = serverplan.plan_server("ranking", "reco", spec, views, [pod], first.ports, pool_placement(None, None),
                                     replicas_now=4, load=serverplan.LoadSeen(later, recorded, now, before))
    assert [n for n, _ in planned.admission.over] == ["a"]
    assert set(planned.scaling.status.observed_qps) == {"a", "b"}, "a's load is in the rule"
    assert (planned.replicas, planned.scaling.status.reason) == (4, "ScaleDownHeld")
    assert "a: load not counted now" in planned.scaling.status.message
