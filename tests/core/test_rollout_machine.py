"""The rollout state machine, step by step, as the operator would drive it."""
from __future__ import annotations

import datetime as dt

import pytest

from rankops.api.rankingmodel import RankingModel
from rankops.rollout.machine import (ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION, GateObservation,
                                     Observed, attempt_id, step)

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


def model(version="2", **rollout) -> RankingModel:
    return RankingModel.model_validate({
        "metadata": {"name": "ctr", "namespace": "reco"},
        "spec": {
            "replicas": 4, "version": version,
            "versions": [{"name": v, "modelUri": f"s3://m/{v}", "format": "onnx"} for v in ("1", "2", "3")],
            "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}],
            "batching": {"maxBatchSize": 8},
            "rollout": {"canary": {"weight": 20, "durationSeconds": 300}, **rollout},
        }})


def passed(gate, **metrics):
    return GateObservation(True, True, True, None, {"gate": gate, "outcome": "pass", "reason": "Passed",
                                                    "summary": f"{gate} ok", "metrics": metrics})


def failed(gate, summary):
    return GateObservation(True, True, False, "BackoffLimitExceeded",
                           {"gate": gate, "outcome": "fail", "reason": "RankingDisagrees", "summary": summary,
                            "metrics": {"rankCorrelation": 0.41}})


def drive(rm, status, seconds=0, **observed):
    decision = step(rm.spec, status, Observed(now=T0 + dt.timedelta(seconds=seconds), **observed))
    new_status = {"stableVersion": decision.stable_version, "rollout": decision.rollout, "gates": decision.gates}
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

    d, s = drive(rm, s, 10, canary_ready=0, canary_desired=1)
    assert s["rollout"]["phase"] == "CanaryStarting"
    d, s = drive(rm, s, 20, canary_ready=1, canary_desired=1)
    assert s["rollout"]["phase"] == "Warming" and d.gate_jobs == ("warmup",)
    d, s = drive(rm, s, 30, canary_ready=1, canary_desired=1, gates={"warmup": GateObservation(job_exists=True)})
    assert s["rollout"]["phase"] == "Warming" and d.gate_jobs == ("warmup",)
    d, s = drive(rm, s, 40, canary_ready=1, canary_desired=1, gates={"warmup": passed("warmup", p99Ms=9.5)})
    assert s["rollout"]["phase"] == "Verifying" and d.gate_jobs == ("equivalence",)
    assert s["gates"][0]["outcome"] == "pass" and s["gates"][0]["metrics"] == {"p99Ms": 9.5}
    assert not d.serving.canary_traffic, "no traffic before the equivalence gate"
    d, s = drive(rm, s, 50, canary_ready=1, canary_desired=1, gates={"equivalence": passed("equivalence")})
    assert s["rollout"]["phase"] == "Canary" and d.serving.canary_traffic and d.gate_jobs == ()
    assert [g["gate"] for g in s["gates"]] == ["warmup", "equivalence"]
    d, s = drive(rm, s, 50 + 299, canary_ready=1, canary_desired=1)
    assert s["rollout"]["phase"] == "Canary"
    d, s = drive(rm, s, 50 + 300, canary_ready=1, canary_desired=1)
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
    _, s = drive(rm, s, 1, canary_ready=1, canary_desired=1)
    _, s = drive(rm, s, 2, canary_ready=1, canary_desired=1, gates={"warmup": passed("warmup")})
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
    assert attempt_id(s3["rollout"]) != attempt_id(s["rollout"]), "a retry runs fresh gate Jobs"
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
    _, s = drive(rm, s, 1, canary_ready=1, canary_desired=1)
    _, s = drive(rm, s, 2, gates={"warmup": GateObservation(True, True, True, None, None)})
    assert s["rollout"]["phase"] == "RolledBack" and s["gates"][0]["outcome"] == "error"


def test_canary_that_never_becomes_ready_rolls_back():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 901, canary_ready=0, canary_desired=1)
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
    _, s_promote = drive(rm, s, 4, annotations={PROMOTE_ANNOTATION: "2"})
    assert s_promote["rollout"]["phase"] == "Promoting"
    _, s_other = drive(rm, s, 4, annotations={PROMOTE_ANNOTATION: "7"})
    assert s_other["rollout"]["phase"] == "Canary", "an annotation for another version does nothing"
    d, s_abort = drive(rm, s, 4, annotations={ABORT_ANNOTATION: "2"})
    assert s_abort["rollout"]["phase"] == "RolledBack" and s_abort["rollout"]["failedGate"] == "manual"


@pytest.mark.parametrize("weight,replicas,expected", [(10, 2, 1), (50, 4, 4), (20, 4, 1), (25, 9, 3)])
def test_canary_replicas_follow_the_weight(weight, replicas, expected):
    from rankops.render.desired import canary_replicas_for
    assert canary_replicas_for(replicas, weight) == expected
