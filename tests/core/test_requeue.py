"""ModelPlan.requeue_after (issue 39): a model is reconciled again when its own deadlines are due
(rollout.deadlines), at --interval only while it polls what no watch reports, else on events and
--resync."""
from __future__ import annotations

import datetime as dt

import pytest

from rankops.api.rankingmodel import RankingModel
from rankops.rollout.deadlines import GATE_GRACE_S, SLACK_S, after_reconcile
from rankops.rollout.machine import CANARY, CANARY_STARTING, PROMOTED, PROMOTING, ROLLED_BACK, VERIFYING, WARMING
from tests import wire
from tests.core.test_render_is_the_plan import SMALL

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
NOW = "2026-12-01T12:00:00Z"


def spec(**rollout):
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel", "metadata": {"name": "m", "namespace": "n"},
            "spec": {**SMALL, "rollout": {**SMALL.get("rollout", {}), **rollout}}}
    return RankingModel.model_validate(body).spec


def status(phase="Ready", generation=2, rollout_phase=None, **rollout):
    wired = {"phase": phase, "observedGeneration": generation}
    if rollout_phase:
        wired["rollout"] = {"version": "2", "fromVersion": "1", "phase": rollout_phase, "attempt": "a1b2c3",
                            "startedAt": NOW, "phaseSince": NOW, **rollout}
    return wire.status(wired)


def again(before, after=None, at=T0, **spec_rollout):
    return after_reconcile(spec(**spec_rollout), before, after or before, 2, at)


@pytest.mark.parametrize("phase, generation, rollout_phase, polls", [
    ("Ready", 2, None, False),                 # settled: events and resync only
    ("RolledBack", 2, ROLLED_BACK, False),
    ("Ready", 2, PROMOTED, False),
    ("Ready", 1, None, True),                  # a generation not applied yet (a refused write to retry)
    ("Pending", 2, None, True),                # not Ready yet: its pods' placement
    ("Degraded", 2, None, True),
])
def test_only_what_no_watch_reports_is_polled(phase, generation, rollout_phase, polls):
    found = again(status(phase, generation, rollout_phase))
    assert found.polls is polls and found.after_s is None


def test_a_rollout_that_moved_is_reconciled_again_at_once():
    moved = again(status(CANARY_STARTING, 2, CANARY_STARTING), status(WARMING, 2, WARMING))
    assert moved.after_s == 0
    started = again(status("Ready", 2), status(CANARY_STARTING, 2, CANARY_STARTING))
    assert started.after_s == 0


def test_the_gates_and_promotion_come_back_at_their_deadline_not_on_a_poll():
    timeout = spec().rollout.gate_jobs.timeout_seconds
    later = T0 + dt.timedelta(seconds=30)
    for phase in (WARMING, VERIFYING):
        found = again(status(phase, 2, phase), at=later)
        assert found.after_s == timeout + GATE_GRACE_S - 30 + SLACK_S
    found = again(status(PROMOTING, 2, PROMOTING), at=later)
    assert found.after_s == timeout - 30 + SLACK_S


def test_the_canary_hold_comes_back_at_its_steps_end():
    hold = spec(canary={"analysis": {"enabled": False}})
    duration = hold.rollout.canary.step_plan()[0].duration_seconds
    serving = status(CANARY, 2, CANARY, step=1, stepSince=NOW, canarySince=NOW)
    found = after_reconcile(hold, serving, serving, 2, T0 + dt.timedelta(seconds=10))
    assert found.after_s == duration - 10 + SLACK_S
    judged = again(serving, at=T0 + dt.timedelta(seconds=10))
    assert judged.polls, "its analysis reads Triton counters: --interval"
    waiting = status(CANARY, 2, CANARY, step=1)   # not serving yet: its wait to serve ends
    assert again(waiting).after_s == spec().rollout.gate_jobs.timeout_seconds + SLACK_S


def test_a_starting_canary_or_a_paused_rollout_polls():
    assert again(status(CANARY, 2, CANARY_STARTING)).polls
    assert again(status(PROMOTING, 2, PROMOTING), paused=True).polls
    assert not again(status(PROMOTING, 2, PROMOTING)).polls, "the stable's Deployment events move it on"
