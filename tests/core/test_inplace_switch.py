"""Issue 41: the in-place switch machine, step by step and through each failure (pure)."""
import datetime as dt

import pytest

from rankops.planner.two_versions import SideBySide
from rankops.rollout import inplace
from rankops.rollout.inplace import (FallBack, GateVerdict, Load, Observed, PodIndex, Policy, Record, RemoveFiles,
                                     RunGate, Unload, VersionState, begin, step)

T0 = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.timezone.utc)
POLICY = Policy(replicas=3, failure_tolerance=1, max_stable_p99_ms=20.0, load_timeout_s=600)
BOTH, NEW_ONLY, OLD_ONLY = ("3", "4"), ("4",), ("3",)


def pod(name, new=None, old="READY", serving=True, uid=None, read=True, reason=""):
    versions = {}
    if old:
        versions[3] = VersionState(old, "unloaded" if old == "UNAVAILABLE" else "")
    if new:
        versions[4] = VersionState(new, reason or ("unloaded" if new == "UNAVAILABLE" else ""))
    return PodIndex(name, uid or f"{name}-1", serving, versions if read else None, "" if read else "refused")


def seen(*pods, t=0, gates=None, p99=10.0, abort=None):
    return Observed(T0 + dt.timedelta(seconds=t), tuple(pods), gates or {}, p99, abort)


def three(**new_states):
    return [pod(n, new=new_states.get(n.replace("-", "_"))) for n in ("ranker-a", "ranker-b", "ranker-c")]


def started():
    return begin("4", "3", T0, SideBySide(True, "fits")).record


def record(phase, **fields):
    return Record(version="4", from_version="3", phase=phase, since=inplace.iso(T0), **fields)


GATED = dict(gate_pod="ranker-a", gate_pod_uid="ranker-a-1", touched=("ranker-a",))
PASS = {"warmup": GateVerdict("pass", "warm P99 3 ms", "ranker-a-1"),
        "equivalence": GateVerdict("pass", "top-10 overlap 1.000", "ranker-a-1")}


def test_begin_in_place_or_pods_with_the_arithmetic():
    switch = begin("4", "3", T0, SideBySide(True, "fits"))
    assert switch.record.phase == inplace.LOADING and switch.actions == ()
    no = begin("4", "3", T0, SideBySide(False, "2 x 6000 MiB (v3) + ...: does not fit (1606 MiB short)",
                                        ("GPU memory: 2 x 6000 MiB (v3) + ...: does not fit (1606 MiB short)",)))
    assert no.record.phase == inplace.FELL_BACK
    assert no.actions == (FallBack("4 cannot be loaded beside 3: GPU memory: 2 x 6000 MiB (v3) + ...: does not "
                                   "fit (1606 MiB short)"),)
    assert begin("4", "3", T0, None).record.reason.endswith("no memory arithmetic for the two versions")


def test_loads_on_one_stable_pod_first_and_says_the_same_twice():
    switch = step(started(), seen(*three()), POLICY)
    assert switch.actions == (Load("ranker-a", "4", BOTH),)
    assert (switch.record.gate_pod, switch.record.touched) == ("ranker-a", ("ranker-a",))
    assert step(started(), seen(*three()), POLICY) == switch                   # same inputs, same answer


def test_a_load_in_flight_is_not_asked_again_and_an_operator_restart_carries_on():
    loading = step(started(), seen(*three()), POLICY).record
    assert step(loading, seen(*three(ranker_a="LOADING"), t=30), POLICY).actions == ()
    # a restarted operator: the record read back from status, the index not showing the load: asked again
    restored = Record.from_status(loading.to_status())
    assert restored == loading
    assert step(restored, seen(*three(), t=30), POLICY).actions == (Load("ranker-a", "4", BOTH),)


def test_gates_run_against_that_pod_in_order_then_promotion_loads_the_next_pod():
    loading = step(started(), seen(*three()), POLICY).record
    gating = step(loading, seen(*three(ranker_a="READY"), t=60), POLICY)
    assert gating.record.phase == inplace.GATING
    assert gating.actions == (RunGate("warmup", "ranker-a", "4"),)
    warm = step(gating.record, seen(*three(ranker_a="READY"), gates={"warmup": PASS["warmup"]}), POLICY)
    assert warm.actions == (RunGate("equivalence", "ranker-a", "4"),)
    promoting = step(gating.record, seen(*three(ranker_a="READY"), gates=PASS), POLICY)
    assert promoting.record.phase == inplace.PROMOTING
    assert promoting.actions == (Load("ranker-b", "4", BOTH),)
    assert [e.reason for e in promoting.events] == ["InPlaceGatesPassed"]


def test_a_verdict_on_another_pod_is_no_evidence():
    other = {"warmup": GateVerdict("pass", "warm", "ranker-a-0")}
    switch = step(record(inplace.GATING, **GATED), seen(*three(ranker_a="READY"), gates=other), POLICY)
    assert switch.actions == (RunGate("warmup", "ranker-a", "4"),)


@pytest.mark.parametrize("gate, outcome", [("warmup", "fail"), ("equivalence", "fail"), ("equivalence", "error")])
def test_a_failing_gate_rolls_back_and_unloads_the_new_version(gate, outcome):
    gates = dict(PASS, **{gate: GateVerdict(outcome, "top-10 overlap 0.147 (min 0.95)", "ranker-a-1")})
    switch = step(record(inplace.GATING, **GATED), seen(*three(ranker_a="READY"), gates=gates), POLICY)
    assert switch.record.phase == inplace.ROLLING_BACK and switch.record.failed_gate == gate
    assert switch.actions == (Unload("ranker-a", "4", OLD_ONLY),)
    assert "top-10 overlap 0.147" in switch.record.message
    done = step(switch.record, seen(*three(ranker_a="UNAVAILABLE")), POLICY)
    assert done.record.phase == inplace.ROLLED_BACK
    assert done.actions == (RemoveFiles("ranker-a", "4"),)
    assert step(done.record, seen(*three(ranker_a="UNAVAILABLE")), POLICY).actions == ()


def test_promotion_loads_one_pod_at_a_time():
    rec = record(inplace.PROMOTING, **GATED)
    switch = step(rec, seen(*three(ranker_a="READY", ranker_b="LOADING")), POLICY)
    assert switch.actions == ()                                                # b is loading: c waits
    switch = step(rec, seen(*three(ranker_a="READY", ranker_b="READY")), POLICY)
    assert switch.actions == (Load("ranker-c", "4", BOTH),)
    assert switch.record.touched == ("ranker-a", "ranker-c")


def test_never_below_replicas_minus_failure_tolerance_serving():
    pods = [pod("ranker-a", new="READY"), pod("ranker-b"), pod("ranker-c", serving=False)]
    assert step(record(inplace.PROMOTING, **GATED), seen(*pods), POLICY).actions == (Load("ranker-b", "4", BOTH),)
    strict = Policy(replicas=3, failure_tolerance=0, max_stable_p99_ms=20.0)
    switch = step(record(inplace.PROMOTING, **GATED), seen(*pods), strict)
    assert switch.actions == ()
    assert "2 pods serving, below replicas - failureTolerance = 3" in switch.record.message


def test_no_load_starts_without_the_stable_p99():
    switch = step(started(), seen(*three(), p99=None), POLICY)
    assert switch.actions == () and "stable P99 is not read" in switch.record.message


def test_every_pod_switched_then_the_old_version_unloaded_everywhere_and_its_files_removed():
    switch = step(record(inplace.PROMOTING, **GATED), seen(*three(ranker_a="READY", ranker_b="READY",
                                                                  ranker_c="READY")), POLICY)
    assert switch.record.phase == inplace.UNLOADING
    assert switch.actions == tuple(Unload(n, "3", NEW_ONLY) for n in ("ranker-a", "ranker-b", "ranker-c"))
    gone = [pod(n, new="READY", old="UNAVAILABLE") for n in ("ranker-a", "ranker-b", "ranker-c")]
    done = step(switch.record, seen(*gone), POLICY)
    assert done.record.phase == inplace.SWITCHED
    assert done.actions == tuple(RemoveFiles(n, "3") for n in ("ranker-a", "ranker-b", "ranker-c"))


def test_a_pod_restarted_mid_switch_comes_back_with_the_old_version_and_is_loaded_again():
    pods = [pod("ranker-a", new="READY", old="UNAVAILABLE"), pod("ranker-b", uid="ranker-b-2"),
            pod("ranker-c", new="READY", old="UNAVAILABLE")]
    switch = step(record(inplace.UNLOADING, **GATED), seen(*pods), POLICY)
    assert switch.actions == (Load("ranker-b", "4", BOTH),)                    # no file removed meanwhile


def test_a_pod_not_serving_or_not_read_holds_the_end():
    pods = [pod("ranker-a", new="READY"), pod("ranker-b", new="READY"), pod("ranker-c", read=False)]
    switch = step(record(inplace.PROMOTING, **GATED), seen(*pods), POLICY)
    assert switch.record.phase == inplace.PROMOTING and switch.actions == ()
    assert "ranker-c (refused)" in switch.record.message


@pytest.mark.parametrize("phase, pods", [
    (inplace.LOADING, three(ranker_a="LOADING")),
    (inplace.GATING, three(ranker_a="READY")),
    (inplace.PROMOTING, three(ranker_a="READY", ranker_b="LOADING")),
])
def test_the_interference_bound_unloads_and_falls_back_with_the_numbers(phase, pods):
    rec = record(phase, **GATED, load_pod="ranker-b" if phase == inplace.PROMOTING else "ranker-a",
                 load_since=inplace.iso(T0))
    switch = step(rec, seen(*pods, p99=31.5), POLICY)
    assert switch.record.phase == inplace.FALLING_BACK
    assert "stable 3 P99 31.5 ms > 20 ms (maxStableP99Ms) while 4" in switch.record.reason
    loaded = [p.name for p in pods if 4 in p.versions]
    assert switch.actions == tuple(Unload(n, "4", OLD_ONLY) for n in loaded)
    clean = [pod(p.name, new="UNAVAILABLE") for p in pods]
    done = step(switch.record, seen(*clean, p99=31.5), POLICY)
    assert done.record.phase == inplace.FELL_BACK
    assert FallBack(switch.record.reason) in done.actions
    assert step(done.record, seen(*clean), POLICY).actions == (FallBack(switch.record.reason),)


def test_a_slow_stable_with_nothing_loading_is_not_interference():
    switch = step(record(inplace.PROMOTING, **GATED), seen(*three(ranker_a="READY"), p99=50.0), POLICY)
    assert switch.record.phase == inplace.PROMOTING and switch.actions == (Load("ranker-b", "4", BOTH),)


def test_a_load_triton_refused_falls_back_with_its_error():
    rec = record(inplace.LOADING, **GATED, load_pod="ranker-a", load_since=inplace.iso(T0))
    pods = three(ranker_a="UNAVAILABLE")
    pods[0] = pod("ranker-a", new="UNAVAILABLE", reason="failed to allocate memory")
    switch = step(rec, seen(*pods, t=20), POLICY)
    assert switch.record.reason == "4 failed to load in ranker-a: failed to allocate memory"
    assert switch.record.phase == inplace.FELL_BACK        # nothing held the new version: clean at once


def test_a_load_past_its_deadline_falls_back():
    rec = record(inplace.LOADING, **GATED, load_pod="ranker-a", load_since=inplace.iso(T0))
    switch = step(rec, seen(*three(ranker_a="LOADING"), t=601), POLICY)
    assert switch.record.phase == inplace.FALLING_BACK
    assert switch.record.reason == "4 not READY in ranker-a after 601s (loadTimeout 600s; index: LOADING)"
    assert switch.actions == (Unload("ranker-a", "4", OLD_ONLY),)


# Triton (2.51) loads nothing for a version whose directory is not on the volume yet: the load
# answers 200 and the index does not list the version (tests/triton/test_inplace_staged_by_pod.py).
@pytest.mark.parametrize("phase, load_pod", [(inplace.LOADING, "ranker-a"), (inplace.PROMOTING, "ranker-b")])
def test_a_version_not_staged_yet_is_asked_again_and_waited_for_until_the_load_timeout(phase, load_pod):
    rec = record(phase, **dict(GATED, touched=tuple(sorted({"ranker-a", load_pod}))), load_pod=load_pod,
                 load_since=inplace.iso(T0))
    pods = three(ranker_a="READY") if phase == inplace.PROMOTING else three()
    waiting = step(rec, seen(*pods, t=590), POLICY)
    assert waiting.record.phase == phase and waiting.record.load_since == inplace.iso(T0)
    assert waiting.actions == (Load(load_pod, "4", BOTH),)                     # asked again: it may be there now
    assert f"not in its index yet: waiting for its files on {load_pod}'s volume" in waiting.record.message
    late = step(waiting.record, seen(*pods, t=601), POLICY)
    assert late.record.reason == (f"4 not READY in {load_pod} after 601s (loadTimeout 600s; index: not in its "
                                  "index: its files not on its volume)")
    assert late.record.phase == (inplace.FALLING_BACK if phase == inplace.PROMOTING else inplace.FELL_BACK)


def test_a_load_just_asked_says_nothing_of_files_and_a_load_under_way_is_not_asked_again():
    first = step(started(), seen(*three()), POLICY)
    assert first.record.message == "loading 4 beside 3 in ranker-a"
    under_way = step(first.record, seen(*three(ranker_a="LOADING"), t=30), POLICY)
    assert under_way.actions == () and under_way.record.message == "loading 4 beside 3 in ranker-a"


@pytest.mark.parametrize("phase, load_pod", [(inplace.LOADING, "ranker-a"), (inplace.PROMOTING, "ranker-b")])
def test_a_load_that_failed_with_its_files_there_still_falls_back_at_once(phase, load_pod):
    error = "Internal: TritonModelException: onnxruntime stand-in: /models/ranker/4/model.onnx not found"
    rec = record(phase, **GATED, load_pod=load_pod, load_since=inplace.iso(T0))
    pods = three(ranker_a="READY") if phase == inplace.PROMOTING else three()
    pods = [pod(p.name, new="UNAVAILABLE", reason=error) if p.name == load_pod else p for p in pods]
    switch = step(rec, seen(*pods, t=5), POLICY)
    assert switch.record.reason == f"4 failed to load in {load_pod}: {error}"
    assert switch.record.phase in (inplace.FALLING_BACK, inplace.FELL_BACK)
    assert not any(isinstance(a, Load) and a.version == "4" for a in switch.actions)


def test_a_load_pod_whose_index_is_not_read_falls_back_at_the_load_timeout_saying_so():
    rec = record(inplace.LOADING, **GATED, load_pod="ranker-a", load_since=inplace.iso(T0))
    pods = [pod("ranker-a", read=False), pod("ranker-b"), pod("ranker-c")]
    assert step(rec, seen(*pods, t=300), POLICY).record.phase == inplace.LOADING
    late = step(rec, seen(*pods, t=601), POLICY)
    assert late.record.reason == "4 not READY in ranker-a after 601s (loadTimeout 600s; index: not read: refused)"


def test_a_gate_pod_lost_while_it_loads_falls_back_instead_of_trying_another():
    # restarted (a new uid, the old version only) or gone: the load may be what killed it (host
    # memory is not in the arithmetic), and would kill the next pod too
    for lost in (pod("ranker-a", uid="ranker-a-2"), None):
        pods = ([lost] if lost else []) + [pod("ranker-b"), pod("ranker-c")]
        rec = record(inplace.LOADING, **GATED, load_pod="ranker-a", load_since=inplace.iso(T0))
        switch = step(rec, seen(*pods), POLICY)
        assert switch.record.phase in (inplace.FALLING_BACK, inplace.FELL_BACK), switch.record
        assert "while loading 4" in switch.record.reason
        assert not [a for a in switch.actions if isinstance(a, Load)]


@pytest.mark.parametrize("phase, lost", [
    (inplace.GATING, pod("ranker-a", uid="ranker-a-2")),
    (inplace.GATING, None),                                      # its node died: the pod is gone
])
def test_a_lost_gate_pod_means_another_gate_pod_and_gates_of_its_own(phase, lost):
    rest = [pod("ranker-b"), pod("ranker-c")]
    pods = ([lost] if lost else []) + rest
    rec = record(phase, **GATED, load_pod="ranker-a" if phase == inplace.LOADING else None,
                 load_since=inplace.iso(T0) if phase == inplace.LOADING else None)
    switch = step(rec, seen(*pods, gates=PASS), POLICY)
    chosen = pods[0]
    assert switch.record.phase == inplace.LOADING
    assert (switch.record.gate_pod, switch.record.gate_pod_uid) == (chosen.name, chosen.uid)
    assert switch.actions == (Load(chosen.name, "4", BOTH),)
    assert "InPlaceGatePodLost" in [e.reason for e in switch.events]


@pytest.mark.parametrize("phase, pods, actions", [
    (inplace.LOADING, three(ranker_a="LOADING"), (Unload("ranker-a", "4", OLD_ONLY),)),
    (inplace.GATING, three(ranker_a="READY"), (Unload("ranker-a", "4", OLD_ONLY),)),
    (inplace.PROMOTING, three(ranker_a="READY", ranker_b="READY"),
     (Unload("ranker-a", "4", OLD_ONLY), Unload("ranker-b", "4", OLD_ONLY))),
    # the old version already unloaded in a: loaded again first, then the new one goes
    (inplace.UNLOADING, [pod("ranker-a", new="READY", old="UNAVAILABLE"), pod("ranker-b", new="READY"),
                         pod("ranker-c", new="READY")],
     (Load("ranker-a", "3", BOTH), Unload("ranker-b", "4", OLD_ONLY), Unload("ranker-c", "4", OLD_ONLY))),
])
def test_abort_rolls_back_from_any_step(phase, pods, actions):
    rec = record(phase, **dict(GATED, touched=tuple(p.name for p in pods if 4 in p.versions)))
    switch = step(rec, seen(*pods, abort="rankops.io/abort=4"), POLICY)
    assert switch.record.phase == inplace.ROLLING_BACK and switch.record.failed_gate == "manual"
    assert switch.actions == actions


def test_rollback_waits_for_a_pod_it_cannot_read_and_forgets_a_pod_that_is_gone():
    rec = record(inplace.ROLLING_BACK, **dict(GATED, touched=("ranker-a", "ranker-b", "ranker-x")),
                 reason="aborted")
    pods = [pod("ranker-a", new="UNAVAILABLE"), pod("ranker-b", read=False), pod("ranker-c")]
    switch = step(rec, seen(*pods), POLICY)
    assert switch.record.phase == inplace.ROLLING_BACK and "index not read: ranker-b" in switch.record.message
    pods[1] = pod("ranker-b", new="UNAVAILABLE")
    done = step(rec, seen(*pods), POLICY)
    assert done.record.phase == inplace.ROLLED_BACK
    assert done.actions == (RemoveFiles("ranker-a", "4"), RemoveFiles("ranker-b", "4"))


def test_status_round_trip_keeps_every_field():
    rec = record(inplace.ROLLING_BACK, **GATED, load_pod="ranker-a", load_since=inplace.iso(T0),
                 failed_gate="warmup", reason="warmup gate fail", message="m")
    data = rec.to_status()
    assert data["gatePod"] == "ranker-a" and data["touched"] == ["ranker-a"] and data["failedGate"] == "warmup"
    assert Record.from_status(data) == rec


def test_no_p99_reading_waits_then_falls_back_at_the_load_timeout():
    waiting = step(started(), seen(*three(), p99=None, t=30), POLICY)
    assert waiting.actions == () and "the stable P99 is not read" in waiting.record.message
    late = step(started(), seen(*three(), p99=None, t=601), POLICY)
    assert late.record.phase in (inplace.FALLING_BACK, inplace.FELL_BACK)
    assert "no P99 of 3 read for 601s" in late.record.reason
