"""When a model must be reconciled again though no watch event will say so (pure).

controller-runtime's Reconcile returns RequeueAfter from the object's own deadlines; this is that
for a RankingModel, from the status a reconcile decided:

- 0 right after a rollout moved to another active phase (its next phase acts at once);
- the rollout's deadlines: a phase's timeout (Canary starting, the gates, Promoting), the canary
  hold's end (its step's duration, then the analysis' extension), the canary's wait to serve;
- `polls`: what only a reading of the pods shows, which no watch reports (the canary's pods
  being placed, their Triton counters for the analysis, autoscaling's load, a model not Ready
  yet, a generation not applied: a refused write to retry): the shell's `--interval`.

Everything else moves on by events (its children's and its own) and `--resync`.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from rankops.api.phases import ModelPhase
from rankops.api.rankingmodel import RankingModelSpec, RankingModelStatus, RolloutStatus
from rankops.rollout.inplace_phase import IN_PLACE
from rankops.rollout.machine import ACTIVE, CANARY, CANARY_STARTING, GATE_GRACE_S, PROMOTING, VERIFYING, WARMING
from rankops.rollout.record import current_step, parse_time

SLACK_S = 1.0        # past a deadline, so the check `age > timeout` holds when it is reconciled


@dataclass(frozen=True)
class Requeue:
    after_s: float | None = None   # the soonest deadline, in seconds from now (None: none)
    polls: bool = False            # something only a pod reading shows: again at --interval


def after_reconcile(spec: RankingModelSpec, before: RankingModelStatus, after: RankingModelStatus,
                    generation: int | None, now: dt.datetime) -> Requeue:
    """When to come back, from the status read (`before`) and the one decided (`after`)."""
    polls = after.observed_generation != generation \
        or (after.autoscaling is not None and after.autoscaling.mode == "rankops")
    rollout = after.rollout
    if rollout is None or rollout.phase not in ACTIVE:   # (in a rollout, the phase is the rollout's)
        return Requeue(None, polls or after.phase not in (ModelPhase.READY, ModelPhase.ROLLED_BACK))
    was = before.rollout
    if was is None or _where(was) != _where(rollout):
        return Requeue(0.0, polls)
    if spec.rollout.paused or rollout.phase in (CANARY_STARTING, IN_PLACE):
        # The canary's pods, scheduled or not; the pods' repository indexes and the in-place gates'
        # verdicts: no watch of ours says.
        return Requeue(None, True)
    deadline = _deadline(spec, rollout, now)
    if rollout.phase == CANARY and spec.rollout.canary.analysis.enabled:
        polls = True   # the canary's and the stable's Triton counters
    return Requeue(max(0.0, (deadline - now).total_seconds() + SLACK_S) if deadline else None, polls)


def _where(rollout: RolloutStatus) -> tuple:
    """What makes a rollout's next step act at once when it changes (an in-place switch's own phase too)."""
    return (rollout.version, rollout.attempt, rollout.phase, rollout.in_place.phase if rollout.in_place else None)


def _deadline(spec: RankingModelSpec, rollout: RolloutStatus, now: dt.datetime) -> dt.datetime | None:
    timeout = spec.rollout.gate_jobs.timeout_seconds
    since = parse_time(rollout.phase_since) or now
    if rollout.phase in (WARMING, VERIFYING):
        return since + dt.timedelta(seconds=timeout + GATE_GRACE_S)
    if rollout.phase == PROMOTING:
        return since + dt.timedelta(seconds=timeout)
    if rollout.phase == CANARY:
        return _hold_deadline(spec, rollout, now, timeout)
    return None


def _hold_deadline(spec: RankingModelSpec, rollout: RolloutStatus, now: dt.datetime,
                   timeout: int) -> dt.datetime | None:
    """The canary hold's next moment: its step's end, then its extension's; while the canary does
    not serve, the end of its wait to serve (canary_hold.hold)."""
    step_since = parse_time(rollout.step_since or (None if rollout.canary_down_since else rollout.canary_since))
    if step_since is None:
        waiting = parse_time(rollout.canary_down_since or rollout.phase_since) or now
        return waiting + dt.timedelta(seconds=timeout)
    duration = current_step(spec, rollout)[1].duration_seconds
    ends = [step_since + dt.timedelta(seconds=duration)]
    if spec.rollout.canary.analysis.enabled:
        ends.append(ends[0] + dt.timedelta(seconds=spec.rollout.canary.analysis.max_extension_seconds))
    later = [end for end in ends if end > now]
    return min(later) if later else None
