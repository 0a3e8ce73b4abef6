"""The status decisions beside step(): phase, conditions, weight, Events, and what gets deleted.

Pure functions of the spec, the old status, the step's Decision and the observed facts; no
cluster. Each case is one the operator meets: a first deploy, a stable serving, each rollout
phase, a rollback, each Degraded cause, a spec the operator cannot apply.
"""
from __future__ import annotations

from typing import NamedTuple

import pytest
from pydantic import ValidationError

from rankops.api.rankingmodel import RankingModel, RankingModelStatus
from rankops.render import names
from rankops.render.desired import ServingState
from rankops import model_status as sd
from rankops.rollout.machine import (CANARY, CANARY_STARTING, PROMOTED, PROMOTING, ROLLED_BACK, VERIFYING, WARMING,
                                     Decision)
from tests import wire

NOW, LATER = "2026-12-01T12:00:00Z", "2026-12-01T12:05:00Z"
MODEL = "ctr"


def spec(version="2", traffic="replicas", replicas=4, weight=20, reference="stable"):
    return RankingModel.model_validate({
        "metadata": {"name": MODEL, "namespace": "reco"},
        "spec": {
            "replicas": replicas, "version": version,
            "versions": [{"name": v, "modelUri": f"s3://m/{v}", "format": "onnx"} for v in ("1", "2", "3")],
            "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}],
            "batching": {"maxBatchSize": 8},
            "rollout": {"canary": {"weight": weight, "durationSeconds": 300, "traffic": traffic,
                                   **({"parentRef": "gw"} if traffic == "gatewayAPI" else {})},
                        "equivalence": {"reference": reference}},
        }}).spec


def rollout(phase, version="2", **more):
    return wire.rollout({"version": version, "fromVersion": "1", "phase": phase, "attempt": "a1b2c3",
                         "startedAt": NOW, "phaseSince": NOW, "message": f"{phase} of {version}", **more})


class Stored(NamedTuple):
    status: dict
    events: tuple


def decide(spec, old, decision, facts) -> Stored:
    """sd.decide from a status as stored, and its status as it is stored."""
    decided = sd.decide(spec, wire.status(old), decision, facts)
    return Stored(wire.stored(decided.status), decided.events)


def degraded_only(old, *args) -> Stored:
    decided = sd.degraded_only(wire.status(old), *args)
    return Stored(wire.stored(decided.status), decided.events)


def idle(stable="1") -> Decision:
    return Decision(stable, ServingState(stable), None, [])


def rolling(phase, traffic=False, weight=20, reference=None, jobs=()) -> Decision:
    return Decision("1", ServingState("2" if phase == PROMOTING else "1", "2", traffic, 1, weight),
                    rollout(phase), [], gate_jobs=jobs, reference_version=reference)


def serving(version="1", ready=4, settled=None, desired=4) -> sd.StableView:
    return sd.StableView(True, desired, ready, ready if settled is None else settled, version)


def facts(stable=None, **more) -> sd.Facts:
    return sd.Facts(now=more.pop("now", NOW), generation=more.pop("generation", 3),
                    stable=serving() if stable is None else stable, replicas=more.pop("replicas", 4), **more)


def conds(status):
    return {c["type"]: (c["status"], c["reason"]) for c in wire.stored(status)["conditions"]}


# -- phase and conditions --

def test_a_settled_stable_is_ready_stable_and_as_expected_and_says_nothing_on_first_visit():
    decided = decide(spec("1"), {}, idle(), facts())
    status = decided.status
    assert status["phase"] == "Ready" and status["ready"] == "4/4" and status["observedGeneration"] == 3
    assert conds(status) == {"Ready": ("True", "ReplicasReady"), "Progressing": ("False", "Stable"),
                             "Degraded": ("False", "AsExpected")}
    assert all(c["lastTransitionTime"] == NOW and c["observedGeneration"] == 3 for c in status["conditions"])
    assert "canaryVersion" not in status and "canaryWeight" not in status and "rollout" not in status
    assert decided.events == ()


@pytest.mark.parametrize("stable, why", [
    (sd.StableView(), "no stable Deployment yet"),
    (serving(ready=2), "2 of 4 Ready"),
    (serving(ready=4, settled=3), "one pod still runs the old template"),
    (serving(desired=3), "the Deployment still asks for 3"),
    (serving(version="0"), "the Deployment runs another version"),
])
def test_a_stable_not_settled_at_the_wanted_version_and_count_is_pending_and_deploying(stable, why):
    status = decide(spec("1"), {}, idle(), facts(stable)).status
    assert status["phase"] == "Pending", why
    assert conds(status)["Ready"] == ("False", "ReplicasNotReady")
    assert conds(status)["Progressing"] == ("True", "Deploying")


def test_ready_flipping_says_so_once_and_moves_its_transition_time_only_then():
    pending = decide(spec("1"), {}, idle(), facts(serving(ready=2))).status
    up = decide(spec("1"), pending, idle(), facts(now=LATER))
    assert [(e.type, e.reason) for e in up.events] == [("Normal", "Ready")]
    ready = next(c for c in up.status["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == LATER
    again = decide(spec("1"), up.status, idle(), facts(now="2026-12-01T13:00:00Z"))
    assert again.events == () and again.status == up.status, "the same facts change nothing"
    down = decide(spec("1"), up.status, idle(), facts(serving(ready=3), now="2026-12-01T13:00:00Z"))
    assert [(e.type, e.reason) for e in down.events] == [("Warning", "NotReady")]
    assert "3/4 replicas of version 1 Ready and up to date" in conds_message(down.status, "Ready")


def conds_message(status, type_):
    return next(c["message"] for c in wire.stored(status)["conditions"] if c["type"] == type_)


@pytest.mark.parametrize("phase", [CANARY_STARTING, WARMING, VERIFYING, CANARY, PROMOTING])
def test_an_active_rollout_is_the_phase_and_progressing_with_its_message(phase):
    status = decide(spec("2"), {}, rolling(phase), facts()).status
    assert status["phase"] == phase and status["rollout"]["phase"] == phase
    assert conds(status)["Progressing"] == ("True", phase)
    assert conds_message(status, "Progressing") == f"{phase} of 2"
    assert status["canaryVersion"] == "2" and status["stableVersion"] == "1"


def test_a_promoted_rollout_is_ready_and_stable_again():
    decision = Decision("2", ServingState("2"), rollout(PROMOTED), [])
    status = decide(spec("2"), {}, decision, facts(serving("2"))).status
    assert status["phase"] == "Ready" and status["stableVersion"] == "2" and "canaryVersion" not in status
    assert conds(status)["Progressing"] == ("False", "Stable")


def test_a_rolled_back_target_is_rolled_back_and_degraded_without_a_second_event():
    decision = Decision("1", ServingState("1"), rollout(ROLLED_BACK, failedGate="warmup"), [])
    decided = decide(spec("2"), {}, decision, facts())
    assert decided.status["phase"] == ROLLED_BACK
    assert conds(decided.status)["Degraded"] == ("True", "RolledBack")
    assert conds(decided.status)["Ready"] == ("True", "ReplicasReady"), "the stable still serves"
    assert decided.events == (), "step() says RolledBack itself"


def test_a_rollback_of_another_version_than_the_spec_names_is_history_not_degraded():
    decision = Decision("1", ServingState("1"), rollout(ROLLED_BACK, version="3"), [])
    status = decide(spec("1"), {}, decision, facts()).status
    assert status["phase"] == "Ready" and conds(status)["Degraded"] == ("False", "AsExpected")


# -- Degraded: the first cause, most serious first --

CAUSES = [("pool_note", "no validated node", "NoReadyNodes"),
          ("placement", ("DriverTooOld", "driver 470 runs no 24.05"), "DriverTooOld"),
          ("unbatched", ("x varies",), "RequestsNotBatched"),
          ("problems", ("P99 12 ms > 10 ms",), "PlanPredictsProblem")]


@pytest.mark.parametrize("first", range(len(CAUSES)))
def test_degraded_names_the_most_serious_cause_and_warns_when_its_reason_changes(first):
    given = {key: value for key, value, _ in CAUSES[first:]}
    decided = decide(spec("1"), {}, idle(), facts(**given))
    reason = CAUSES[first][2]
    assert conds(decided.status)["Degraded"] == ("True", reason)
    assert [(e.type, e.reason) for e in decided.events] == [("Warning", reason)]
    assert decide(spec("1"), decided.status, idle(), facts(**given)).events == (), "said once"


def test_what_was_not_checked_is_said_in_an_as_expected_degraded():
    status = decide(spec("1"), {}, idle(), facts(notes=("tritonImage 99.01 not in rankops' table",))).status
    assert conds(status)["Degraded"] == ("False", "AsExpected")
    assert conds_message(status, "Degraded") == "no problem seen; tritonImage 99.01 not in rankops' table"


# -- the canary's weight --

def test_no_canary_no_weight_and_a_canary_before_traffic_weighs_zero():
    assert "canaryWeight" not in decide(spec("1"), {}, idle(), facts()).status
    assert decide(spec("2"), {}, rolling(WARMING), facts(canary_ready=1)).status["canaryWeight"] == 0


def test_by_replicas_the_weight_is_the_share_of_ready_pods():
    status = decide(spec("2"), {}, rolling(CANARY, traffic=True), facts(canary_ready=1)).status
    assert status["canaryWeight"] == 20   # 1 canary of 5 Ready pods
    status = decide(spec("2"), {}, rolling(CANARY, traffic=True), facts(serving(ready=3), canary_ready=1)).status
    assert status["canaryWeight"] == 25   # a stable pod down: the canary gets more than its 20%


def test_routed_the_weight_is_the_held_steps():
    decision = rolling(CANARY, traffic=True, weight=50)
    assert decide(spec("2", "gatewayAPI"), {}, decision, facts(canary_ready=0)).status["canaryWeight"] == 50
    assert decide(spec("2", "gatewayAPI"), {}, rolling(VERIFYING), facts()).status["canaryWeight"] == 0


# -- a spec the operator cannot apply --

def test_a_spec_not_applied_says_degraded_and_keeps_what_serves():
    ready = decide(spec("1"), {}, idle(), facts(generation=1)).status
    decided = degraded_only(ready, 2, "InvalidSpec", "spec.replicas: must be >= 1", LATER)
    status = decided.status
    assert status["phase"] == "Degraded" and status["observedGeneration"] == 2
    assert status["stableVersion"] == "1" and status["ready"] == "4/4", "the rest as it was"
    assert conds(status) == {"Ready": ("True", "SpecNotApplied"), "Progressing": ("False", "SpecNotApplied"),
                             "Degraded": ("True", "InvalidSpec")}
    assert "version 1 serves as before (4/4 Ready)" in conds_message(status, "Ready")
    assert [(e.type, e.reason) for e in decided.events] == [("Warning", "InvalidSpec")]
    assert degraded_only(status, 2, "InvalidSpec", "spec.replicas: must be >= 1", LATER).events == ()
    other = degraded_only(status, 3, "PlanFailed", "no plan", LATER)
    assert [e.reason for e in other.events] == ["PlanFailed"], "a new reason is said"


def test_a_spec_not_applied_before_anything_served_says_nothing_serves():
    status = degraded_only({}, 1, "NodePoolNotFound", "GpuNodePool a100 does not exist", NOW).status
    assert conds(status)["Ready"] == ("Unknown", "SpecNotApplied")
    assert "nothing serves yet" in conds_message(status, "Ready")


# -- what gets deleted --

def track(track_name):
    return sd.track_children(MODEL, track_name)


EVERYTHING = track(names.CANARY) + track("reference")


@pytest.mark.parametrize("decision, gone", [
    (idle(), EVERYTHING),                                                        # no rollout: both tracks go
    (rolling(CANARY_STARTING), track("reference")),
    (rolling(WARMING, reference="1", jobs=("warmup",)), []),                    # a versions[] reference serves
    (rolling(VERIFYING, jobs=("equivalence",)), track("reference")),            # reference: stable
    (rolling(CANARY, traffic=True), track("reference")),
    (rolling(PROMOTING, traffic=True), track("reference")),
    (Decision("1", ServingState("1"), rollout(ROLLED_BACK), []), EVERYTHING),
])
def test_the_tracks_a_phase_does_not_serve_are_deleted_when_they_exist(decision, gone):
    assert sd.deletions(MODEL, decision, EVERYTHING, []) == gone
    assert sd.deletions(MODEL, decision, [], []) == [], "nothing that does not exist"
    present = EVERYTHING[:1] + EVERYTHING[3:4]   # the canary Deployment, the reference Deployment
    assert sd.deletions(MODEL, decision, present, []) == [c for c in gone if c in present]


def test_running_gate_jobs_the_decision_does_not_run_are_stopped_and_finished_ones_kept():
    decision = rolling(VERIFYING, jobs=("equivalence",))
    wanted = names.gate_job_name(MODEL, "equivalence", "2", "a1b2c3")
    old_warmup = names.gate_job_name(MODEL, "warmup", "2", "a1b2c3")
    superseded = names.gate_job_name(MODEL, "equivalence", "2", "ffffff")
    jobs = [(wanted, False), (old_warmup, True), (superseded, False)]
    assert sd.deletions(MODEL, decision, [], jobs) == [("Job", superseded)]
    assert sd.wanted_job_names(MODEL, decision) == {wanted}
    # Rolled back or idle: every running gate Job stops, its load with it.
    assert sd.deletions(MODEL, idle(), [], jobs) == [("Job", wanted), ("Job", superseded)]


# -- typed status --

def test_status_is_the_typed_model_and_a_field_it_lacks_fails():
    decided = sd.decide(spec("2"), RankingModelStatus(), rolling(CANARY, traffic=True), facts(canary_ready=1))
    assert isinstance(decided.status, RankingModelStatus)
    stored = decided.status.to_wire()
    assert RankingModelStatus.model_validate(stored) == decided.status, "what is stored reads back the same"
    with pytest.raises(ValidationError, match="step_index"):
        decided.status.rollout.step_index = 2   # the record a step changes: no field the CRD lacks
    with pytest.raises(ValidationError, match="step"):
        decided.status.rollout.step = 0         # nor a value it refuses (step >= 1)
    with pytest.raises(ValidationError, match="canaryPercent"):
        RankingModelStatus.model_validate({**stored, "canaryPercent": 20})
    assert "canaryVersion" not in decided.status.model_copy(update={"canary_version": None}).to_wire(), \
        "no nulls written"


def test_a_stored_value_that_does_not_validate_is_dropped_and_said_not_raised():
    stored = decide(spec("2"), {}, rolling(CANARY, traffic=True), facts(canary_ready=1)).status
    status, dropped = sd.known_status({**stored, "replicas": "many", "gates": [{"gate": "warmup"}]})
    assert sorted(dropped) == ["gates=invalid", "replicas=invalid"]
    assert status.replicas is None and status.gates == [] and status.rollout.phase == CANARY


def test_a_pools_status_is_its_typed_model_too():
    from rankops.api.gpunodepool import GpuNodePoolStatus

    status = {"nodes": 2, "ready": 1, "failing": 1, "pending": 0, "excluded": 0, "driverVersions": None,
              "failingByCheck": [{"check": "nouveau", "count": 1, "nodes": ["gpu-2"]}], "observedGeneration": 1,
              "conditions": [{"type": "Ready", "status": "True", "reason": "NodesReady", "message": "1 of 2"}]}
    typed, dropped = GpuNodePoolStatus.from_stored({**status, "readyNodes": 1, "ready": -1})
    assert sorted(dropped) == ["ready=invalid", "readyNodes"] and typed.nodes == 2
    assert "driverVersions" not in typed.to_wire()
    with pytest.raises(ValidationError, match="readyNodes"):
        GpuNodePoolStatus.model_validate({**status, "readyNodes": 1})



def can_wait(old, new):
    return sd.first_status_can_wait(wire.status(old), wire.status(new))


def first_ready(old, new):
    return sd.first_ready_event(wire.status(old), wire.status(new))


def test_only_a_first_status_that_would_say_pending_and_nothing_else_may_wait():
    pending = {"phase": "Pending", "conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected"}]}
    assert can_wait({}, pending)
    assert not can_wait({"phase": "Pending"}, pending), "a model with a status: written as it changes"
    assert not can_wait({}, {**pending, "phase": "Ready"})
    assert not can_wait({}, {**pending, "conditions": [
        {"type": "Degraded", "status": "True", "reason": "NoReadyNodes"}]}), "a problem is said at once"
    assert not can_wait({}, {**pending, "rollout": {"version": "2", "phase": WARMING}})


def test_a_model_whose_pending_was_not_written_says_its_first_ready():
    ready = decide(spec("1"), {}, idle(), facts()).status
    event = first_ready({}, ready)
    assert (event.type, event.reason) == ("Normal", "Ready") and "4/4 replicas" in event.message
    assert first_ready({"phase": "Pending"}, ready) is None, "a written Pending flips in decide()"
    assert first_ready({}, decide(spec("1"), {}, idle(), facts(stable=sd.StableView())).status) is None
