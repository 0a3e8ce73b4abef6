"""The rollout state machine, step by step, as the operator would drive it."""
from __future__ import annotations

import datetime as dt

import pytest

from rankops.api.rankingmodel import RankingModel
from rankops.rollout.machine import (ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION, GateObservation,
                                     Observed, attempt_id, step)
from rankops.render.desired import ServingState
from rankops.rollout.readiness import PodObservation
from tests import wire

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


# The clock-only analysis policy for tests about the hold's mechanics (no metrics read): each
# step moves on at the end of its duration, recorded as PromotedWithoutVerdict. Tests of the
# analysis itself give their own `analysis`.
CLOCK_ONLY = {"onNoVerdict": "promote", "maxExtensionSeconds": 0}


def model(version="2", **rollout) -> RankingModel:
    canary = rollout.pop("canary", {"weight": 20, "durationSeconds": 300})
    rollout["canary"] = {**canary, "analysis": canary.get("analysis", CLOCK_ONLY)}
    return RankingModel.model_validate({
        "metadata": {"name": "ctr", "namespace": "reco"},
        "spec": {
            "replicas": 4, "version": version,
            "versions": [{"name": v, "modelUri": f"s3://m/{v}", "format": "onnx"} for v in ("1", "2", "3")],
            "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}],
            "batching": {"maxBatchSize": 8},
            "rollout": rollout,
        }})


def passed(gate, **metrics):
    return GateObservation(True, True, True, None, {"gate": gate, "outcome": "pass", "reason": "Passed",
                                                    "summary": f"{gate} ok", "metrics": metrics})


def failed(gate, summary):
    return GateObservation(True, True, False, "BackoffLimitExceeded",
                           {"gate": gate, "outcome": "fail", "reason": "RankingDisagrees", "summary": summary,
                            "metrics": {"rankCorrelation": 0.41}})


def pod(version="2", ready=True, node_ready=True, deleting=False, name="ctr-canary-0"):
    return PodObservation(name, version, ready, deleting, "gpu-1", node_ready)


def up(count=1, version="2", **kwargs):
    """Observations of a canary Deployment of `count` pods, all of `version`, Ready on live nodes."""
    return {"canary_pods": tuple(pod(version, name=f"ctr-canary-{i}", **kwargs) for i in range(count)),
            "canary_desired": count}


def drive(rm, status, seconds=0, **observed):
    """One step from a status as stored, and the status stored after it (what a restarted operator reads)."""
    decision = step(rm.spec, wire.status(status), Observed(now=T0 + dt.timedelta(seconds=seconds), **observed))
    new_status = {"stableVersion": decision.stable_version, "rollout": wire.stored(decision.rollout),
                  "gates": wire.stored(decision.gates)}
    return decision, new_status


def test_first_version_serves_directly_without_gates():
    decision, status = drive(model("1"), {})
    assert decision.stable_version == "1" and decision.serving.canary_version is None
    assert decision.rollout is None and decision.gate_jobs == ()


def test_a_version_change_walks_every_gate_then_promotes():
    rm = model("2")
    d, s = drive(rm, {"stableVersion": "1"})
    assert s["rollout"]["phase"] == "CanaryStarting" and s["rollout"]["fromVersion"] == "1"
    # weight 20% of 4 stable replicas -> 1 canary pod (1/5 = 20%)
    assert d.serving.canary_version == "2" and d.serving.canary_replicas == 1 and not d.serving.canary_traffic
    assert [e.reason for e in d.events] == ["CanaryStarting"]

    d, s = drive(rm, s, 10, canary_desired=1)
    assert s["rollout"]["phase"] == "CanaryStarting"
    d, s = drive(rm, s, 20, **up())
    assert s["rollout"]["phase"] == "Warming" and d.gate_jobs == ("warmup",)
    d, s = drive(rm, s, 30, **up(), gates={"warmup": GateObservation(job_exists=True)})
    assert s["rollout"]["phase"] == "Warming" and d.gate_jobs == ("warmup",)
    d, s = drive(rm, s, 40, **up(), gates={"warmup": passed("warmup", p99Ms=9.5)})
    assert s["rollout"]["phase"] == "Verifying" and d.gate_jobs == ("equivalence",)
    assert s["gates"][0]["outcome"] == "pass" and s["gates"][0]["metrics"] == {"p99Ms": 9.5}
    assert not d.serving.canary_traffic, "no traffic before the equivalence gate"
    d, s = drive(rm, s, 50, **up(), gates={"equivalence": passed("equivalence")})
    assert s["rollout"]["phase"] == "Canary" and d.gate_jobs == ()
    assert not d.serving.canary_traffic, "traffic follows the record: status says Canary first"
    assert [g["gate"] for g in s["gates"]] == ["warmup", "equivalence"]
    d, s = drive(rm, s, 51, **up())
    assert s["rollout"]["phase"] == "Canary" and d.serving.canary_traffic
    # The hold counts from the step traffic was switched on (51), not from the record (50).
    d, s = drive(rm, s, 51 + 299, **up())
    assert s["rollout"]["phase"] == "Canary"
    d, s = drive(rm, s, 51 + 300, **up())
    assert s["rollout"]["phase"] == "Promoting"
    assert d.serving.stable_version == "2" and d.serving.canary_version == "2" and d.serving.canary_traffic
    assert s["stableVersion"] == "1", "stable is recorded as promoted only once its pods run the new version"
    d, s = drive(rm, s, 400, stable_template_version="2", stable_updated_ready=3, stable_desired=4)
    assert s["rollout"]["phase"] == "Promoting"
    d, s = drive(rm, s, 410, stable_template_version="2", stable_updated_ready=4, stable_desired=4)
    assert s["rollout"]["phase"] == "Promoted" and s["stableVersion"] == "2"
    assert d.serving.canary_version is None and d.outcome == "Promoted"
    d2, s2 = drive(rm, s, 500)
    assert s2 == s and d2.events == (), "a finished rollout is stable under re-reconcile"


def _to_verifying(rm):
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 1, **up())
    _, s = drive(rm, s, 2, **up(), gates={"warmup": passed("warmup")})
    assert s["rollout"]["phase"] == "Verifying"
    return s


def test_failed_equivalence_rolls_back_with_the_numbers_and_stays_back():
    rm = model("2")
    s = _to_verifying(rm)
    d, s = drive(rm, s, 3, gates={"equivalence": failed("equivalence", "rank corr 0.41 < 0.9")})
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "equivalence"
    assert "rank corr 0.41 < 0.9" in s["rollout"]["message"]
    assert s["stableVersion"] == "1" and d.serving.canary_version is None
    assert s["gates"][-1]["metrics"] == {"rankCorrelation": 0.41}
    assert any(e.type == "Warning" and e.reason == "RolledBack" for e in d.events)
    d, s2 = drive(rm, s, 100)
    assert s2["rollout"] == s["rollout"] and d.serving.canary_version is None, "no retry loop"
    d, s3 = drive(rm, s, 200, annotations={RETRY_ANNOTATION: "2"})
    assert s3["rollout"]["phase"] == "CanaryStarting" and s3["gates"] == []
    assert attempt_id(wire.rollout(s3["rollout"])) != attempt_id(wire.rollout(s["rollout"])), "a retry runs fresh gate Jobs"
    d, s4 = drive(rm, s3, 300, annotations={RETRY_ANNOTATION: "2"})
    assert s4["rollout"]["startedAt"] == s3["rollout"]["startedAt"], "the retry annotation acts once"


def test_job_deadline_is_a_rollback_with_a_clear_reason():
    rm = model("2")
    s = _to_verifying(rm)
    _, s = drive(rm, s, 3, gates={"equivalence": GateObservation(True, True, False, "DeadlineExceeded", None)})
    assert s["rollout"]["phase"] == "RolledBack"
    assert "did not finish within 900s" in s["rollout"]["message"]


def test_gate_job_without_verdict_fails_safe():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 1, **up())
    _, s = drive(rm, s, 2, gates={"warmup": GateObservation(True, True, True, None, None)})
    assert s["rollout"]["phase"] == "RolledBack" and s["gates"][0]["outcome"] == "error"


def test_canary_that_never_becomes_ready_rolls_back():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 901, canary_desired=1)
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "canary"


def test_new_version_mid_rollout_supersedes():
    s = _to_verifying(model("2"))
    d, s = drive(model("3"), s, 5)
    assert s["rollout"]["version"] == "3" and s["rollout"]["phase"] == "CanaryStarting"
    assert s["rollout"]["fromVersion"] == "1" and s["gates"] == []
    assert [e.reason for e in d.events] == ["RolloutSuperseded", "CanaryStarting"]


def test_back_to_stable_cancels():
    s = _to_verifying(model("2"))
    d, s = drive(model("1"), s, 5)
    assert s["rollout"]["phase"] == "Canceled" and d.serving.canary_version is None
    assert s["stableVersion"] == "1"


def test_paused_freezes_and_annotations_promote_or_abort():
    rm = model("2", paused=True)
    s = _to_verifying(model("2"))
    _, s2 = drive(rm, s, 3, gates={"equivalence": passed("equivalence")})
    assert s2["rollout"]["phase"] == "Verifying", "paused: no phase change"
    rm = model("2")
    _, s = drive(rm, s, 3, gates={"equivalence": passed("equivalence")})
    assert s["rollout"]["phase"] == "Canary"
    _, s_promote = drive(rm, s, 4, annotations={PROMOTE_ANNOTATION: "2"}, **up())
    assert s_promote["rollout"]["phase"] == "Promoting"
    _, s_other = drive(rm, s, 4, annotations={PROMOTE_ANNOTATION: "7"}, **up())
    assert s_other["rollout"]["phase"] == "Canary", "an annotation for another version does nothing"
    d, s_abort = drive(rm, s, 4, annotations={ABORT_ANNOTATION: "2"})
    assert s_abort["rollout"]["phase"] == "RolledBack" and s_abort["rollout"]["failedGate"] == "manual"


def _to_canary(rm, seconds=3):
    s = _to_verifying(rm)
    _, s = drive(rm, s, seconds, gates={"equivalence": passed("equivalence")}, **up())
    assert s["rollout"]["phase"] == "Canary"
    _, s = drive(rm, s, seconds, **up())     # the next step switches traffic on: the hold starts
    assert s["rollout"]["phase"] == "Canary" and s["rollout"]["canarySince"]
    return s


def _promoted(rm):
    s = _to_canary(rm)
    _, s = drive(rm, s, 400, **up())
    _, s = drive(rm, s, 410, stable_template_version="2", stable_updated_ready=4, stable_desired=4)
    assert s["rollout"]["phase"] == "Promoted" and s["stableVersion"] == "2"
    return s


# --- status is a record, not a licence (issue 12, finding 2) ---

def test_a_phase_set_by_hand_without_its_verdicts_goes_back_to_its_gate():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 1, **up())
    assert s["rollout"]["phase"] == "Warming"
    forged = {**s, "rollout": {**s["rollout"], "phase": "Promoting"}}
    d, s2 = drive(rm, forged, 2, stable_template_version="1", stable_updated_ready=4, stable_desired=4, **up())
    assert s2["rollout"]["phase"] == "Warming" and d.gate_jobs == ("warmup",)
    assert d.serving.stable_version == "1" and not d.serving.canary_traffic, "nothing promoted, no traffic"
    assert s2["stableVersion"] == "1" and d.outcome is None
    assert [e.reason for e in d.events] == ["GateVerdictMissing"] and d.events[0].type == "Warning"
    # Only the warmup verdict recorded: a forged Canary goes back to the equivalence gate.
    s = _to_verifying(rm)
    d, s2 = drive(rm, {**s, "rollout": {**s["rollout"], "phase": "Canary"}}, 3, **up())
    assert s2["rollout"]["phase"] == "Verifying" and d.gate_jobs == ("equivalence",)


def test_verdicts_of_another_attempt_or_version_do_not_count():
    rm = model("2")
    s = _to_canary(rm)
    other_attempt = [{**g, "attempt": "abcdef"} for g in s["gates"]]
    d, s2 = drive(rm, {**s, "gates": other_attempt}, 400, **up())
    assert s2["rollout"]["phase"] == "Warming" and not d.serving.canary_traffic
    other_version = [{**g, "version": "3"} for g in s["gates"]]
    _, s3 = drive(rm, {**s, "gates": other_version}, 400, **up())
    assert s3["rollout"]["phase"] == "Warming"
    failing = [{**g, "outcome": "fail"} if g["gate"] == "equivalence" else g for g in s["gates"]]
    _, s4 = drive(rm, {**s, "gates": failing}, 400, **up())
    assert s4["rollout"]["phase"] == "Verifying"


def test_a_stable_version_set_by_hand_does_not_switch_serving():
    rm = model("1")
    # v1 serves, never rolled out; someone writes stableVersion 2.
    d, s = drive(rm, {"stableVersion": "2"}, stable_template_version="1")
    assert d.serving == ServingState("1") and s["stableVersion"] == "1"
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "StatusRejected")]
    assert "status.stableVersion 2" in d.events[0].message
    d, s = drive(rm, s, 1, stable_template_version="1")
    assert d.events == (), "said once: the status is corrected"


def test_a_stable_version_set_by_hand_mid_rollout_keeps_the_gates():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 1, **up())
    assert s["rollout"]["phase"] == "Warming"
    d, s2 = drive(rm, {**s, "stableVersion": "2"}, 2, stable_template_version="1", **up())
    assert s2["rollout"]["phase"] == "Warming" and s2["stableVersion"] == "1"
    assert d.serving.stable_version == "1" and d.gate_jobs == ("warmup",), "no cancel into an ungated v2"


def test_after_a_promotion_a_hand_set_stable_version_is_a_new_rollout_with_gates():
    s = _promoted(model("2"))
    d, s2 = drive(model("2"), {**s, "stableVersion": "3"}, 500, stable_template_version="2")
    assert d.serving == ServingState("2") and s2["stableVersion"] == "2"
    # spec.version 3 too: version 3 is rolled out, gates and all, from the promoted version 2.
    d, s3 = drive(model("3"), {**s, "stableVersion": "3"}, 500, stable_template_version="2")
    assert s3["rollout"]["phase"] == "CanaryStarting" and s3["rollout"]["fromVersion"] == "2"
    assert d.serving.stable_version == "2" and d.serving.canary_version == "3"


def test_records_written_before_attempts_were_stored_keep_serving():
    """An operator upgrade: the Promoted record's verdicts carry no attempt; what serves vouches."""
    s = _promoted(model("2"))
    legacy = {"stableVersion": "2", "rollout": {k: v for k, v in s["rollout"].items() if k != "attempt"},
              "gates": [{k: v for k, v in g.items() if k != "attempt"} for g in s["gates"]]}
    d, s2 = drive(model("2"), legacy, 500, stable_template_version="2")
    assert d.serving == ServingState("2") and d.events == ()


# --- canary readiness from live pods on live nodes (finding 9) ---

def test_a_canary_pod_on_a_gone_or_not_ready_node_is_not_ready():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    for dead in (up(node_ready=False), up(ready=False), up(deleting=True)):
        _, s2 = drive(rm, s, 10, **dead)
        assert s2["rollout"]["phase"] == "CanaryStarting"


def test_the_canary_is_never_promoted_on_a_pod_whose_node_is_gone():
    rm = model("2")
    s = _to_canary(rm)                                  # the hold starts at t=3
    d, s2 = drive(rm, s, 200, **up(node_ready=False))   # its node goes 197 s into the 300 s hold
    assert s2["rollout"]["phase"] == "Canary" and d.serving.stable_version == "1"
    assert [e.reason for e in d.events] == ["CanaryNotServing"]
    assert "stopped serving after 197s of its 300s hold (0/1 pods Ready on live nodes)" in s2["rollout"]["message"]
    assert "stepSince" not in s2["rollout"] and s2["rollout"]["canaryDownSince"]
    d, s2b = drive(rm, s2, 400, annotations={PROMOTE_ANNOTATION: "2"}, **up(node_ready=False))
    assert s2b["rollout"]["phase"] == "Canary", "the promote annotation does not skip readiness"
    # Not back within timeoutSeconds (900 s) of going down: roll back.
    d, s3 = drive(rm, s2, 200 + 901, **up(node_ready=False))
    assert s3["rollout"]["phase"] == "RolledBack" and s3["rollout"]["failedGate"] == "canary"
    assert d.serving == ServingState("1") and "0/1" in s3["rollout"]["message"]


def test_a_canary_back_after_going_down_serves_a_whole_hold_before_promotion():
    # The replacement of a lost canary pod never served: the hold counts only the time in which
    # the canary served at its weight, so it starts again when the replacement is Ready.
    rm = model("2")
    s = _to_canary(rm)                                  # the hold starts at t=3
    _, s = drive(rm, s, 250, **up(node_ready=False))    # lost after 247 s
    d, s = drive(rm, s, 290, canary_pods=(pod(ready=False),), canary_desired=1)   # its replacement starts
    assert s["rollout"]["phase"] == "Canary" and "stepSince" not in s["rollout"]
    d, s = drive(rm, s, 310, **up())                    # the replacement is Ready: its hold starts now
    assert [e.reason for e in d.events] == ["CanaryServing"] and s["rollout"]["stepSince"].endswith("12:05:10Z")
    d, s = drive(rm, s, 310 + 299, **up())
    assert s["rollout"]["phase"] == "Canary", "the 247 s served before the loss do not count"
    d, s = drive(rm, s, 310 + 300, **up())
    assert s["rollout"]["phase"] == "Promoting"
    canary = next(g for g in s["gates"] if g["gate"] == "canary")
    assert canary["metrics"]["windowSeconds"] == 300 and canary["metrics"]["windowStart"].endswith("12:05:10Z")


def test_after_a_supersede_only_the_new_versions_pods_count():
    s = _to_verifying(model("2"))
    rm3 = model("3")
    _, s = drive(rm3, s, 5, **up(version="2"))
    assert s["rollout"]["version"] == "3"
    _, s2 = drive(rm3, s, 6, **up(version="2"))
    assert s2["rollout"]["phase"] == "CanaryStarting", "v2's Ready pods are not v3's canary"
    _, s3 = drive(rm3, s, 7, **up(version="3"))
    assert s3["rollout"]["phase"] == "Warming"


# --- the machine is total ---

# A phase this operator does not know never reaches the machine: model_status.known_status closes
# the record as Canceled (tests/core/test_status_from_newer_operator.py).
@pytest.mark.parametrize("phase", ["Promoted", "Superseded", "Canceled"])
def test_a_record_the_machine_would_not_keep_for_the_target_restarts_the_rollout(phase):
    rm = model("2")
    s = _to_canary(rm)
    d, s2 = drive(rm, {**s, "rollout": {**s["rollout"], "phase": phase}}, 10, stable_template_version="1")
    assert s2["rollout"]["phase"] == "CanaryStarting" and s2["gates"] == [] and s2["stableVersion"] == "1"
    assert s2["rollout"]["attempt"] != s["rollout"]["attempt"], "fresh gate Jobs"
    assert d.serving.stable_version == "1" and not d.serving.canary_traffic
    if phase == "Promoted":
        assert d.events[0].type == "Warning" and d.events[0].reason == "RolloutRestarted"


def test_promoted_with_stable_version_lagging_converges_to_the_promoted_version():
    s = _promoted(model("2"))
    d, s2 = drive(model("2"), {**s, "stableVersion": "1"}, 500, stable_template_version="2")
    assert d.serving == ServingState("2") and s2["stableVersion"] == "2" and s2["rollout"] == s["rollout"]


def test_promoting_has_a_deadline_and_rolls_back():
    rm = model("2")
    s = _to_canary(rm)
    _, s = drive(rm, s, 400, **up())
    assert s["rollout"]["phase"] == "Promoting"
    d, s2 = drive(rm, s, 400 + 900, stable_template_version="2", stable_updated_ready=2, stable_desired=4, **up())
    assert s2["rollout"]["phase"] == "Promoting"
    d, s2 = drive(rm, s, 400 + 901, stable_template_version="2", stable_updated_ready=2, stable_desired=4, **up())
    assert s2["rollout"]["phase"] == "RolledBack" and s2["rollout"]["failedGate"] == "promotion"
    assert d.serving == ServingState("1") and s2["stableVersion"] == "1" and "2 updated and Ready" in s2["rollout"]["message"]


@pytest.mark.parametrize("phase", ["CanaryStarting", "Warming", "Verifying", "Canary", "Promoting"])
@pytest.mark.parametrize("paused", [False, True])
def test_abort_is_honoured_in_every_active_phase_paused_or_not(phase, paused):
    rm = model("2", paused=paused)
    s = _to_canary(model("2"))
    _, s = drive(model("2"), s, 400, **up())
    assert s["rollout"]["phase"] == "Promoting"
    d, s2 = drive(rm, {**s, "rollout": {**s["rollout"], "phase": phase}}, 401,
                  annotations={ABORT_ANNOTATION: "2"}, **up())
    assert s2["rollout"]["phase"] == "RolledBack" and s2["rollout"]["failedGate"] == "manual"
    assert d.serving == ServingState("1") and s2["stableVersion"] == "1"


def test_a_version_can_be_retried_again_and_again_each_with_a_fresh_attempt():
    rm = model("2")
    s = _to_verifying(rm)
    attempts = [s["rollout"]["attempt"]]
    t = 3
    for value in ("2", "2/again", "2/3"):
        _, s = drive(rm, s, t, gates={"equivalence": failed("equivalence", "no")})
        assert s["rollout"]["phase"] == "RolledBack"
        _, s = drive(rm, s, t + 1, annotations={RETRY_ANNOTATION: value})
        assert s["rollout"]["phase"] == "CanaryStarting" and s["rollout"]["retried"] == value
        attempts.append(s["rollout"]["attempt"])
        _, s = drive(rm, s, t + 2, annotations={RETRY_ANNOTATION: value}, **up())
        _, s = drive(rm, s, t + 3, gates={"warmup": passed("warmup")}, annotations={RETRY_ANNOTATION: value})
        assert s["rollout"]["phase"] == "Verifying"
        t += 10
    assert len(set(attempts)) == 4, attempts
    # Failing once more with the last value still set: it does not retry by itself.
    _, s = drive(rm, s, t, gates={"equivalence": failed("equivalence", "no")}, annotations={RETRY_ANNOTATION: "2/3"})
    _, s2 = drive(rm, s, t + 100, annotations={RETRY_ANNOTATION: "2/3"})
    assert s2["rollout"]["phase"] == "RolledBack" and s2["rollout"]["startedAt"] == s["rollout"]["startedAt"]


def test_a_leftover_abort_does_not_abort_the_retry():
    rm = model("2")
    s = _to_verifying(rm)
    _, s = drive(rm, s, 3, annotations={ABORT_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["aborted"] == "2"
    _, s = drive(rm, s, 4, annotations={ABORT_ANNOTATION: "2", RETRY_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "CanaryStarting"
    _, s = drive(rm, s, 5, annotations={ABORT_ANNOTATION: "2", RETRY_ANNOTATION: "2"}, **up())
    assert s["rollout"]["phase"] == "Warming"
    _, s = drive(rm, s, 6, annotations={ABORT_ANNOTATION: "2/again"})
    assert s["rollout"]["phase"] == "RolledBack", "a new value aborts again"


def test_attempts_started_in_the_same_second_differ():
    """v2, superseded by v3, then v2 again, all within one second: v2's first Jobs are not reused."""
    _, s = drive(model("2"), {"stableVersion": "1"})
    _, s3 = drive(model("3"), s)
    _, s2 = drive(model("2"), s3)
    assert s2["rollout"]["startedAt"] == s["rollout"]["startedAt"]
    assert len({s["rollout"]["attempt"], s3["rollout"]["attempt"], s2["rollout"]["attempt"]}) == 3


@pytest.mark.parametrize("weight,replicas,expected", [(10, 2, 1), (50, 4, 4), (20, 4, 1), (25, 9, 3)])
def test_canary_replicas_follow_the_weight(weight, replicas, expected):
    from rankops.render.desired import canary_replicas_for
    assert canary_replicas_for(replicas, weight) == expected


def test_the_canary_hold_starts_when_traffic_does_even_if_the_next_step_comes_late():
    """The step after status says Canary switches traffic on. Counting the hold from the record,
    a hold shorter than the reconcile interval ended before any request reached the canary: the
    e2e saw the canary serve only while Promoting."""
    rm = model("2", canary={"weight": 20, "durationSeconds": 3})
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 10, **up())
    _, s = drive(rm, s, 20, **up(), gates={"warmup": passed("warmup")})
    _, s = drive(rm, s, 30, **up(), gates={"equivalence": passed("equivalence")})
    assert s["rollout"]["phase"] == "Canary"
    d, s = drive(rm, s, 45, **up())            # 15 s later: traffic goes on now, the hold starts
    assert s["rollout"]["phase"] == "Canary" and d.serving.canary_traffic
    d, s = drive(rm, s, 48, **up())
    assert s["rollout"]["phase"] == "Promoting"


def _counters(success, failure=0, p99_us=None):
    from rankops.triton.metrics import ModelCounters

    return ModelCounters({"success": success, "failure": failure, "executions": success / 2, "inferences": success * 10,
                          "queue_us": success * 100}, {0.99: p99_us} if p99_us else {})


def _serving(rm):
    """A rollout of 2 whose canary takes traffic (status says Canary, the hold has started)."""
    s = _to_verifying(rm)
    _, s = drive(rm, s, 3, **up(), gates={"equivalence": passed("equivalence")})
    _, s = drive(rm, s, 4, **up())
    assert s["rollout"]["phase"] == "Canary" and s["rollout"]["canarySince"]
    return s


def test_the_canary_is_judged_on_its_triton_numbers_since_traffic_reached_it():
    rm = model("2")
    s = _serving(rm)
    start = {"canary": {"c0": _counters(50)}, "stable": {"s0": _counters(1000), "s1": _counters(900)}}
    d, s = drive(rm, s, 10, **up(), track_metrics=start)
    baseline = s["rollout"]["analysisBaseline"]
    assert baseline["canary"]["c0"]["success"] == 50 and baseline["attempt"] == s["rollout"]["attempt"]
    # 400 more canary requests, 30 of them failed (7%): rolled back during Canary, with the numbers.
    bad = {"canary": {"c0": _counters(420, 30, 5000)}, "stable": {"s0": _counters(2000, 0, 5000), "s1": _counters(1900)}}
    d, s = drive(rm, s, 60, **up(), track_metrics=bad)
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "canary"
    assert "failure ratio 7.50% > 1.00%" in s["rollout"]["message"], s["rollout"]["message"]
    result = s["gates"][-1]
    assert (result["gate"], result["outcome"], result["reason"]) == ("canary", "fail", "CanaryFailingRequests")
    assert result["metrics"]["canary"]["requests"] == 400 and result["metrics"]["stable"]["requests"] == 2000
    assert d.serving.canary_version is None and s["stableVersion"] == "1"


def test_a_healthy_canary_promotes_after_its_hold_with_its_analysis_recorded():
    rm = model("2")
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    good = {"canary": {"c0": _counters(500, 1, 5000)}, "stable": {"s0": _counters(2000, 0, 4800)}}
    d, s = drive(rm, s, 4 + 300, **up(), track_metrics=good)
    assert s["rollout"]["phase"] == "Promoting", s["rollout"]
    assert "canary analysis: canary 501 requests, 1 failed" in s["rollout"]["message"]
    assert [(g["gate"], g["outcome"]) for g in s["gates"]][-1] == ("canary", "pass")


def test_without_readable_metrics_the_hold_alone_decides():
    rm = model("2")
    s = _serving(rm)
    d, s = drive(rm, s, 4 + 300, **up(), track_metrics=None)
    assert s["rollout"]["phase"] == "Promoting" and "canary analysis" not in s["rollout"]["message"]
    assert "analysisBaseline" not in s["rollout"]


STEPS = {"steps": [{"weight": 10, "durationSeconds": 60}, {"weight": 50, "durationSeconds": 120}]}


def test_progressive_steps_each_hold_their_weight_then_promote():
    rm = model("2", canary=STEPS)
    s = _serving(rm)                                   # traffic on at t=4: step 1 of 2
    assert s["rollout"]["step"] == 1 and s["rollout"]["stepSince"] == s["rollout"]["canarySince"]
    d, s = drive(rm, s, 30, **up())
    assert d.serving.canary_weight == 10 and d.serving.canary_replicas == 1   # 1 of 5 pods nearest 10%
    d, s = drive(rm, s, 64, **up())                    # step 1 held 60 s: step 2, promoted only after it
    assert s["rollout"]["phase"] == "Canary" and s["rollout"]["step"] == 2
    assert [e.reason for e in d.events] == ["CanaryStepPassed"]
    assert "takes 50% for 120s (step 2/2) after holding 10% 60s" in s["rollout"]["message"]
    assert d.serving.canary_weight == 50 and d.serving.canary_replicas == 4 and d.serving.canary_traffic
    d, s = drive(rm, s, 70, **up(4))                   # step 2's four pods serve: its hold starts
    assert [e.reason for e in d.events] == ["CanaryServing"]
    d, s = drive(rm, s, 70 + 119, **up(4))
    assert s["rollout"]["phase"] == "Canary"
    d, s = drive(rm, s, 70 + 120, **up(4))
    assert s["rollout"]["phase"] == "Promoting" and "(step 2/2, 50%)" in s["rollout"]["message"]


def test_a_step_waits_for_its_canary_pods_before_the_next():
    rm = model("2", canary=STEPS)
    s = _serving(rm)
    _, s = drive(rm, s, 64, **up())
    d, s = drive(rm, s, 64 + 120, canary_pods=up()["canary_pods"], canary_desired=4)   # 1 of 4 Ready
    assert s["rollout"]["phase"] == "Canary" and s["rollout"]["step"] == 2


def test_each_step_is_judged_on_its_own_window():
    rm = model("2", canary=STEPS)
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    # Step 1: 200 canary requests, none failed: the next step, its analysis recorded for step 1.
    first = {"canary": {"c0": _counters(200, 0, 4000)}, "stable": {"s0": _counters(2000, 0, 4000)}}
    _, s = drive(rm, s, 64, **up(), track_metrics=first)
    assert s["rollout"]["step"] == 2
    [result] = [g for g in s["gates"] if g["gate"] == "canary"]
    assert result["outcome"] == "pass" and result["metrics"]["step"] == 1
    assert result["summary"].startswith("step 1/2: canary 200 requests, 0 failed")
    # Step 2 starts its window at its first reading: step 1's clean requests do not dilute its failures.
    _, s = drive(rm, s, 70, **up(4), track_metrics=first)
    assert s["rollout"]["analysisBaseline"]["step"] == 2
    bad = {"canary": {"c0": _counters(300, 10, 4000)}, "stable": {"s0": _counters(3000, 0, 4000)}}
    _, s = drive(rm, s, 100, **up(4), track_metrics=bad)
    assert s["rollout"]["phase"] == "RolledBack", s["rollout"]
    assert "(step 2/2, 50%)" in s["rollout"]["message"] and "failure ratio 9.09% > 1.00%" in s["rollout"]["message"]
    assert s["gates"][-1]["metrics"]["canary"]["requests"] == 110 and s["gates"][-1]["metrics"]["step"] == 2


def test_promote_annotation_skips_the_remaining_steps():
    rm = model("2", canary=STEPS)
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), annotations={PROMOTE_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "Promoting" and s["rollout"]["message"].startswith("promoted by annotation")


def test_the_analysis_bounds_come_from_the_spec():
    strict = {"analysis": {"maxFailureRatio": 0.1, "maxP99VsStable": None, "minRequests": 20, "maxP99Ms": 3}}
    rm = model("2", canary={"weight": 20, "durationSeconds": 300, **strict})
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    # 5% failures: within this spec's 10%; 2x the stable's P99: not compared; 4 ms: above its 3 ms.
    slow = {"canary": {"c0": _counters(38, 2, 4000)}, "stable": {"s0": _counters(500, 0, 2000)}}
    _, s = drive(rm, s, 60, **up(), track_metrics=slow)
    assert s["rollout"]["phase"] == "RolledBack" and s["gates"][-1]["reason"] == "CanaryP99AboveBound"
    assert s["gates"][-1]["metrics"]["bounds"] == {"maxFailureRatio": 0.1, "maxP99Ms": 3.0, "maxP99VsStable": None,
                                                   "minRequests": 20, "maxAvgQueueMs": None,
                                                   "maxAvgQueueVsStable": None, "maxShedRatioVsStable": 0.02}


def test_analysis_off_lets_the_hold_alone_decide():
    rm = model("2", canary={"weight": 20, "durationSeconds": 300, "analysis": {"enabled": False}})
    s = _serving(rm)
    bad = {"canary": {"c0": _counters(400, 100, 4000)}, "stable": {"s0": _counters(500, 0, 2000)}}
    _, s = drive(rm, s, 10, **up(), track_metrics=bad)
    _, s = drive(rm, s, 4 + 300, **up(), track_metrics=bad)
    assert s["rollout"]["phase"] == "Promoting"
    # What it was judged on says so: not judged, by the spec's choice.
    canary = next(g for g in s["gates"] if g["gate"] == "canary")
    assert (canary["outcome"], canary["reason"]) == ("inconclusive", "AnalysisDisabled")
    assert "analysis.enabled false" in canary["summary"]


@pytest.mark.parametrize("mode", ["gatewayAPI", "openshiftRoute"])
def test_exact_traffic_routes_follow_the_step_being_held(mode):
    from rankops.render.traffic import traffic_objects

    rm = model("2", canary={**STEPS, "traffic": mode})
    s = _serving(rm)
    _, s = drive(rm, s, 64, **up())
    d, s = drive(rm, s, 70, **up())
    [route] = traffic_objects(rm, d.serving)
    if mode == "gatewayAPI":
        weights = [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]]
    else:
        weights = [route["spec"]["to"]["weight"], route["spec"]["alternateBackends"][0]["weight"]]
    assert s["rollout"]["step"] == 2 and weights == [50, 50]


def test_a_promote_annotation_acts_once_and_a_leftover_does_not_skip_a_retried_canary():
    rm = model("2", canary=STEPS)
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), annotations={PROMOTE_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "Promoting" and s["rollout"]["promoted"] == "2"
    # Rolled back (aborted), then retried: the same promote value left in place does nothing.
    _, s = drive(rm, s, 11, **up(), annotations={PROMOTE_ANNOTATION: "2", ABORT_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "RolledBack"
    annotations = {PROMOTE_ANNOTATION: "2", ABORT_ANNOTATION: "2", RETRY_ANNOTATION: "2"}
    _, s = drive(rm, s, 20, **up(), annotations=annotations)
    assert s["rollout"]["phase"] == "Warming" and s["rollout"]["promoted"] == "2"
    _, s = drive(rm, s, 22, **up(), annotations=annotations, gates={"warmup": passed("warmup")})
    _, s = drive(rm, s, 23, **up(), annotations=annotations, gates={"equivalence": passed("equivalence")})
    _, s = drive(rm, s, 24, **up(), annotations=annotations)
    assert s["rollout"]["phase"] == "Canary" and s["rollout"]["step"] == 1, s["rollout"]
    # A new value acts again.
    _, s = drive(rm, s, 25, **up(), annotations={**annotations, PROMOTE_ANNOTATION: "2/now"})
    assert s["rollout"]["phase"] == "Promoting" and s["rollout"]["promoted"] == "2/now"


def test_a_paused_canary_is_still_judged_and_a_failing_one_rolled_back_but_its_hold_waits():
    rm, paused = model("2"), model("2", paused=True)
    s = _serving(rm)
    _, s = drive(paused, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    good = {"canary": {"c0": _counters(500, 0, 4000)}, "stable": {"s0": _counters(500, 0, 4000)}}
    d, s = drive(paused, s, 4 + 400, **up(), track_metrics=good)
    assert s["rollout"]["phase"] == "Canary" and d.serving.canary_traffic, "held past its duration: paused waits"
    bad = {"canary": {"c0": _counters(600, 50, 4000)}, "stable": {"s0": _counters(600, 0, 4000)}}
    _, s = drive(paused, s, 4 + 410, **up(), track_metrics=bad)
    assert s["rollout"]["phase"] == "RolledBack" and s["gates"][-1]["reason"] == "CanaryFailingRequests"


def test_a_pod_that_joined_the_window_under_a_minute_ago_is_left_out_of_the_p99_but_not_the_failures():
    rm = model("2")
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    # c1 joins (a restart or scale-up): its P99 is its cold start and warm replay, 80 ms.
    joined = {"canary": {"c0": _counters(100, 0, 4000), "c1": _counters(300, 0, 80000)},
              "stable": {"s0": _counters(400, 0, 4000)}}
    _, s = drive(rm, s, 20, **up(2), track_metrics=joined)
    assert s["rollout"]["phase"] == "Canary" and s["rollout"]["analysisBaseline"]["joined"] == \
        {"canary": {"c1": "2026-11-30T12:00:20Z"}}
    later = {"canary": {"c0": _counters(300, 0, 4000), "c1": _counters(400, 0, 80000)},
             "stable": {"s0": _counters(800, 0, 4000)}}
    _, s = drive(rm, s, 60, **up(2), track_metrics=later)
    assert s["rollout"]["phase"] == "Canary", s["rollout"]["message"]
    # A minute after it joined, its summary is its own traffic's: 20x the stable's P99 is judged.
    _, s = drive(rm, s, 81, **up(2), track_metrics=later)
    assert s["rollout"]["phase"] == "RolledBack" and s["gates"][-1]["reason"] == "CanarySlowerThanStable"
    # Failures of a young pod count at once.
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    _, s = drive(rm, s, 20, **up(2), track_metrics={"canary": {"c0": _counters(100), "c1": _counters(5)},
                                                     "stable": {"s0": _counters(400)}})
    failing = {"canary": {"c0": _counters(200), "c1": _counters(50, 20)}, "stable": {"s0": _counters(800)}}
    _, s = drive(rm, s, 30, **up(2), track_metrics=failing)
    assert s["rollout"]["phase"] == "RolledBack" and s["gates"][-1]["reason"] == "CanaryFailingRequests"


def test_the_canary_is_sized_on_the_stable_as_deployed_not_spec_replicas():
    """batching: auto plans the replicas; the stable Deployment has the plan's 8, spec.replicas says 4."""
    rm = model("2", canary={"weight": 20, "durationSeconds": 300})
    d, _ = drive(rm, {"stableVersion": "1"}, stable_desired=8, stable_template_version="1")
    assert d.serving.canary_replicas == 2    # 2 beside 8 is 20%
    d, _ = drive(rm, {"stableVersion": "1"}, stable_template_version=None)
    assert d.serving.canary_replicas == 1    # no stable yet: spec.replicas (4) decides
