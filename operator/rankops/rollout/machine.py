"""The gated rollout of a new model version, as a pure function of spec, status and observations.

`step()` is called on every reconcile. It reads the previous rollout record from status (so an
operator restart resumes where it was), what the cluster shows (canary readiness, gate Job
results) and the clock, and returns the next record, the serving state to render, the gate Jobs
that must exist and the Events to emit. It never branches on what woke it.

    CanaryStarting -> Warming -> Verifying -> Canary -> Promoting -> Promoted
          \\______________\\___________\\__________\\-> RolledBack      (a gate failed, timed out or aborted)
    any active phase -> Superseded                   (spec.version changed again)
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Any

from rankops.api.rankingmodel import RankingModelSpec, TorchscriptReference, TrafficMode
from rankops.render.desired import ServingState, canary_replicas_for

CANARY_STARTING, WARMING, VERIFYING, CANARY, PROMOTING = "CanaryStarting", "Warming", "Verifying", "Canary", "Promoting"
PROMOTED, ROLLED_BACK, SUPERSEDED, CANCELED = "Promoted", "RolledBack", "Superseded", "Canceled"
ACTIVE = (CANARY_STARTING, WARMING, VERIFYING, CANARY, PROMOTING)
GATE_OF_PHASE = {WARMING: "warmup", VERIFYING: "equivalence"}
NEXT_PHASE = {WARMING: VERIFYING, VERIFYING: CANARY}

# Level-based manual controls: the annotation's value names the version it applies to, so a
# leftover annotation cannot act on a later rollout.
PROMOTE_ANNOTATION = "rankops.io/promote"     # skip the rest of the canary hold (gates still apply)
ABORT_ANNOTATION = "rankops.io/abort"         # roll back now
RETRY_ANNOTATION = "rankops.io/retry"         # try a rolled-back version again


@dataclass(frozen=True)
class GateObservation:
    job_exists: bool = False
    finished: bool = False
    succeeded: bool = False
    failure_reason: str | None = None        # e.g. DeadlineExceeded, BackoffLimitExceeded
    verdict: dict[str, Any] | None = None     # parsed verdict (Verdict.to_dict()) when finished


@dataclass(frozen=True)
class Observed:
    now: dt.datetime
    canary_ready: int = 0
    canary_desired: int = 0
    stable_updated_ready: int = 0            # ready stable pods already running the stable template
    stable_desired: int = 0
    stable_template_version: str | None = None
    gates: dict[str, GateObservation] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    type: str      # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    stable_version: str              # status.stableVersion after this step
    serving: ServingState            # what to render now
    rollout: dict[str, Any] | None   # status.rollout
    gates: list[dict[str, Any]]      # status.gates
    gate_jobs: tuple[str, ...] = ()  # gates whose Job must exist now
    reference_version: str | None = None  # a versions[] reference served for the equivalence gate
    events: tuple[Event, ...] = ()
    outcome: str | None = None       # Promoted | RolledBack | Superseded, when this step ended a rollout


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def attempt_id(rollout: dict[str, Any]) -> str:
    """Short id of one rollout attempt: gate Job names carry it, so a retry never reads old verdicts."""
    return hashlib.sha256(f"{rollout['version']}@{rollout.get('startedAt')}".encode()).hexdigest()[:6]


def reference_version_of(spec: RankingModelSpec, stable: str) -> str | None:
    ref = spec.rollout.equivalence.reference
    if isinstance(ref, TorchscriptReference) or ref in ("stable", stable):
        return None
    return ref


def step(spec: RankingModelSpec, status: dict[str, Any], observed: Observed) -> Decision:
    now = observed.now
    stable = status.get("stableVersion") or spec.version
    rollout = status.get("rollout")
    gates = list(status.get("gates") or [])
    target = spec.version
    events: list[Event] = []

    def idle(record, *, outcome=None) -> Decision:
        return Decision(stable, ServingState(stable), record, gates, events=tuple(events), outcome=outcome)

    if target == stable:
        if rollout and rollout["phase"] in ACTIVE:
            record = {**rollout, "phase": CANCELED, "phaseSince": iso(now),
                      "message": f"spec.version is back to the stable version {stable}; canary {rollout['version']} removed"}
            events.append(Event("Normal", "RolloutCanceled", record["message"]))
            return idle(record, outcome=CANCELED)
        return idle(rollout)

    retry = observed.annotations.get(RETRY_ANNOTATION) == target
    fresh = rollout is None or rollout["version"] != target or rollout["phase"] in (SUPERSEDED, CANCELED) or (
        rollout["phase"] == ROLLED_BACK and retry and rollout.get("retried") != target)
    if rollout and rollout["phase"] == ROLLED_BACK and rollout["version"] == target and not fresh:
        return idle(rollout)  # stays rolled back until spec.version changes or a retry is asked
    if fresh:
        if rollout and rollout["phase"] in ACTIVE:
            events.append(Event("Normal", "RolloutSuperseded",
                                f"rollout of version {rollout['version']} superseded by version {target}"))
        rollout = {"version": target, "fromVersion": stable, "phase": CANARY_STARTING,
                   "startedAt": iso(now), "phaseSince": iso(now),
                   "message": f"starting canary of version {target} beside stable {stable}"}
        if retry:
            rollout["retried"] = target
        gates = []
        events.append(Event("Normal", "CanaryStarting", rollout["message"]))

    rollout = dict(rollout)
    paused = spec.rollout.paused
    phase = rollout["phase"]
    phase_age = (now - (parse_time(rollout.get("phaseSince")) or now)).total_seconds()
    timeout = spec.rollout.gate_jobs.timeout_seconds

    def move(to: str, message: str, reason: str | None = None, warning: bool = False) -> None:
        nonlocal phase
        rollout.update(phase=to, phaseSince=iso(now), message=message)
        phase = to
        events.append(Event("Warning" if warning else "Normal", reason or to, message))

    def roll_back(gate: str, message: str) -> None:
        rollout["failedGate"] = gate
        move(ROLLED_BACK, message, "RolledBack", warning=True)

    abort = observed.annotations.get(ABORT_ANNOTATION) == target
    if not paused and abort and phase in ACTIVE and phase != PROMOTING:
        roll_back("manual", f"rollout of version {target} aborted by annotation {ABORT_ANNOTATION}; "
                            f"stable {stable} untouched")

    if not paused and phase == CANARY_STARTING:
        if observed.canary_desired and observed.canary_ready >= observed.canary_desired:
            move(WARMING, f"canary {target} Ready ({observed.canary_ready}/{observed.canary_desired} pods); "
                          "running the warmup gate")
        elif phase_age > timeout:
            roll_back("canary", f"canary {target} not Ready after {timeout}s "
                                f"({observed.canary_ready}/{observed.canary_desired} pods Ready)")

    if not paused and phase in GATE_OF_PHASE:
        gate = GATE_OF_PHASE[phase]
        seen = observed.gates.get(gate, GateObservation())
        if seen.finished:
            verdict = seen.verdict or {}
            outcome = verdict.get("outcome") or "error"   # no verdict: cannot judge, fail safe
            summary = verdict.get("summary") or (
                f"{gate} Job failed ({seen.failure_reason or 'no verdict in its termination message'})")
            if seen.failure_reason == "DeadlineExceeded":
                outcome, summary = "error", f"{gate} Job did not finish within {timeout}s (Job deadline exceeded)"
            result = {"gate": gate, "version": target, "outcome": outcome,
                      "reason": verdict.get("reason") or seen.failure_reason or "NoVerdict",
                      "summary": summary, "metrics": verdict.get("metrics") or {}, "finishedAt": iso(now)}
            gates = [g for g in gates if g.get("gate") != gate] + [result]
            if outcome == "pass" and seen.succeeded:
                nxt = NEXT_PHASE[phase]
                events.append(Event("Normal", "GatePassed", f"{gate} gate passed for {target}: {summary}"))
                if nxt == CANARY:
                    rollout["canarySince"] = iso(now)
                    move(CANARY, f"gates passed; canary {target} takes {spec.rollout.canary.weight}% of traffic "
                                 f"for {spec.rollout.canary.duration_seconds}s")
                else:
                    move(nxt, f"running the {GATE_OF_PHASE[nxt]} gate on {target}")
            else:
                roll_back(gate, f"{gate} gate {outcome} for {target}: {summary}; stable {stable} untouched")
        elif phase_age > timeout + 120:
            # The Job should have hit its own deadline; this catches a Job that never started.
            roll_back(gate, f"{gate} gate for {target} did not report within {timeout}s")

    if not paused and phase == CANARY:
        held = (now - (parse_time(rollout.get("canarySince")) or now)).total_seconds()
        if held >= spec.rollout.canary.duration_seconds or observed.annotations.get(PROMOTE_ANNOTATION) == target:
            why = "promoted by annotation" if held < spec.rollout.canary.duration_seconds else \
                f"canary held {int(held)}s"
            move(PROMOTING, f"{why}; updating stable to {target}")

    if phase == PROMOTING:
        rolled = (observed.stable_template_version == target
                  and observed.stable_updated_ready >= observed.stable_desired)
        if rolled:
            move(PROMOTED, f"version {target} promoted: stable updated, canary removed", "Promoted")
            return Decision(target, ServingState(target), rollout, gates, events=tuple(events), outcome=PROMOTED)

    if phase == ROLLED_BACK:
        return Decision(stable, ServingState(stable), rollout, gates, events=tuple(events), outcome=ROLLED_BACK)

    # Active rollout: render the canary beside the stable.
    weight = spec.rollout.canary.weight
    canary_replicas = canary_replicas_for(spec.replicas, weight) \
        if spec.rollout.canary.traffic is TrafficMode.replicas else 1
    taking_traffic = phase in (CANARY, PROMOTING)
    serving = ServingState(
        stable_version=target if phase == PROMOTING else stable,
        canary_version=target, canary_traffic=taking_traffic, canary_replicas=canary_replicas)
    jobs = (GATE_OF_PHASE[phase],) if phase in GATE_OF_PHASE else ()
    reference = reference_version_of(spec, stable) if phase in (WARMING, VERIFYING) else None
    outcome = SUPERSEDED if any(e.reason == "RolloutSuperseded" for e in events) else None
    return Decision(stable, serving, rollout, gates, gate_jobs=jobs, reference_version=reference,
                    events=tuple(events), outcome=outcome)
