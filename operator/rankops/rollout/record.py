"""What a rollout step reads and writes: the phases, the observations, the Decision, and the
record being changed (`Step`), shared by the machine (rollout/machine.py) and its Canary phase
(rollout/canary_hold.py). Pure: no I/O, the clock is an observation.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Any

from rankops.api.phases import ACTIVE_PHASES, RolloutPhase
from rankops.api.rankingmodel import GateResult, RankingModelSpec, RolloutStatus
from rankops.render.desired import ServingState
from rankops.rollout.readiness import PodObservation

# The phases (api.phases.RolloutPhase), by their short names.
CANARY_STARTING, WARMING, VERIFYING, CANARY, PROMOTING = (
    RolloutPhase.CANARY_STARTING, RolloutPhase.WARMING, RolloutPhase.VERIFYING, RolloutPhase.CANARY,
    RolloutPhase.PROMOTING)
PROMOTED, ROLLED_BACK, SUPERSEDED, CANCELED = (
    RolloutPhase.PROMOTED, RolloutPhase.ROLLED_BACK, RolloutPhase.SUPERSEDED, RolloutPhase.CANCELED)
ACTIVE = ACTIVE_PHASES
GATE_OF_PHASE = {WARMING: "warmup", VERIFYING: "equivalence"}
NEXT_PHASE = {WARMING: VERIFYING, VERIFYING: CANARY}
GATES = ("warmup", "equivalence")
# Triton's latency summaries (the P99 the canary analysis reads) cover about the last minute.
P99_SUMMARY_WINDOW_S = 60
# The passing verdicts (of this version and attempt) each phase stands on.
EVIDENCE = {VERIFYING: ("warmup",), CANARY: GATES, PROMOTING: GATES}

# Manual controls: the annotation's value names the version it applies to ("<version>", or
# "<version>/<anything>" to give a new value), so a leftover annotation cannot act on another
# version. Abort, retry and promote act once per value: the value acted on is kept in the rollout
# record (aborted, retried, promoted) and carried to the next record, so one left in place never
# acts again (a leftover promote would otherwise skip a retried attempt's whole canary).
PROMOTE_ANNOTATION = "rankops.io/promote"     # skip the rest of the canary hold, every step (gates still apply)
ABORT_ANNOTATION = "rankops.io/abort"         # roll back now, in any active phase, paused or not
RETRY_ANNOTATION = "rankops.io/retry"         # try a rolled-back version again, with a fresh attempt
CONSUMED = {ABORT_ANNOTATION: "aborted", RETRY_ANNOTATION: "retried", PROMOTE_ANNOTATION: "promoted"}


@dataclass(frozen=True)
class GateObservation:
    job_exists: bool = False
    finished: bool = False
    succeeded: bool = False
    failure_reason: str | None = None        # e.g. DeadlineExceeded, BackoffLimitExceeded
    verdict: dict[str, Any] | None = None     # parsed verdict (Verdict.to_dict()) when finished
    detail: str | None = None                 # why a Job cannot be judged, said in the gate's summary


@dataclass(frozen=True)
class Observed:
    now: dt.datetime
    canary_pods: tuple[PodObservation, ...] = ()   # the canary Deployment's pods and their nodes
    canary_desired: int = 0
    stable_updated_ready: int = 0            # ready stable pods already running the stable template
    stable_desired: int = 0
    stable_template_version: str | None = None     # the version the stable Deployment runs (None: none)
    gates: dict[str, GateObservation] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    # During Canary: each serving pod's Triton counters read now, by track ("canary", "stable");
    # None when they were not read (no reachable pod).
    track_metrics: dict[str, dict[str, Any]] | None = None
    # Canary pods kept un-Ready because the version fails its warm requests (rollout.warming).
    canary_warm_failing: tuple[str, ...] = ()
    # During Canary: the serving pods whose metrics could not be read, each "pod (ip): cause".
    metrics_problems: tuple[str, ...] = ()
    # During Canary: the serving pods of each track that were not read, each with why (a bound that needs them
    # cannot be judged: no verdict, rollout/canary_analysis.judge).
    metrics_unread: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The stable replicas the model wants (spec.replicas, or the plan's), before any is lent to the canary.
    replicas: int | None = None
    # rollout.strategy inPlace (rollout/inplace_phase.py): the two versions' memory arithmetic on one GPU
    # (planner/two_versions.SideBySide; None: not worked out), read when a rollout starts; and during
    # InPlace, the pods' repository indexes, the gate verdicts and the stable P99 (rollout/inplace.Observed;
    # None: not read this time).
    in_place_fit: Any = None
    in_place: Any = None


@dataclass(frozen=True)
class Event:
    type: str      # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    stable_version: str              # status.stableVersion after this step
    serving: ServingState            # what to render now
    rollout: RolloutStatus | None    # status.rollout
    gates: list[GateResult]          # status.gates
    gate_jobs: tuple[str, ...] = ()  # gates whose Job must exist now
    reference_version: str | None = None  # a versions[] reference served for the equivalence gate
    events: tuple[Event, ...] = ()
    outcome: str | None = None       # Promoted | RolledBack | Superseded | Canceled, when this step ended a rollout
    in_place_actions: tuple[Any, ...] = ()   # InPlace: what the pods must see done (rollout/inplace.py's actions)
    stable_pods_version: str | None = None   # status.stablePodsVersion (rollout/machine.py `step`)


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def attempt_id(rollout: RolloutStatus) -> str:
    """Short id of one rollout attempt: gate Job names and verdicts carry it, so a retry never reads
    old verdicts. Records made before `attempt` was stored derive it as they did then."""
    return rollout.attempt or hashlib.sha256(f"{rollout.version}@{rollout.started_at}".encode()).hexdigest()[:6]


def new_attempt_id(version: str, started: str, previous: RolloutStatus | None) -> str:
    # Chained to the attempt it replaces: two attempts of a version started in the same second differ.
    prev = attempt_id(previous) if previous else ""
    return hashlib.sha256(f"{version}@{started}@{prev}".encode()).hexdigest()[:6]


def passed_gates(gates: list[GateResult], rollout: RolloutStatus) -> set[str]:
    """Gates with a passing verdict recorded for this rollout's version and attempt."""
    attempt = attempt_id(rollout)
    return {g.gate for g in gates if g.outcome == "pass" and g.version == rollout.version and g.attempt == attempt}


def current_step(spec: RankingModelSpec, rollout: RolloutStatus | None) -> tuple[int, Any]:
    """The canary step being held (1-based, clamped to the spec's steps, which may have changed)
    and its CanaryStep."""
    plan = spec.rollout.canary.step_plan()
    number = min(max((rollout.step if rollout else None) or 1, 1), len(plan))
    return number, plan[number - 1]


@dataclass
class Step:
    """One step of an active rollout: the record it changes and what it emits, with the moves
    every phase makes. The phases read from it and write through it; `step()` builds the Decision."""
    spec: RankingModelSpec
    observed: Observed
    stable: str                       # the trusted stable version
    recorded: RolloutStatus | None    # status.rollout as it was read (traffic follows it)
    rollout: RolloutStatus            # the record being made (step()'s own copy)
    gates: list[GateResult]
    events: list[Event]

    @property
    def now(self) -> dt.datetime:
        return self.observed.now

    @property
    def target(self) -> str:
        return self.rollout.version

    @property
    def phase(self) -> RolloutPhase:
        return self.rollout.phase

    @property
    def attempt(self) -> str:
        return attempt_id(self.rollout)

    @property
    def timeout(self) -> int:
        return self.spec.rollout.gate_jobs.timeout_seconds

    @property
    def stable_size(self) -> int:
        """The model's stable size (not the Deployment's, which a replacing canary shrinks; with
        batching: auto the plan's replicas, not spec.replicas)."""
        return self.observed.replicas or self.observed.stable_desired or self.spec.replicas

    def recorded_in(self, *phases: RolloutPhase) -> bool:
        """Whether status (as read) already says this attempt is in one of `phases`."""
        recorded = self.recorded
        return recorded is not None and recorded.version == self.target \
            and attempt_id(recorded) == self.attempt and recorded.phase in phases

    def phase_age(self) -> float:
        """Seconds in the current phase: read when used, as a move earlier in this step starts a new one
        (a hold longer than the timeout must not make the Promoting it moves to late at once)."""
        return (self.now - (parse_time(self.rollout.phase_since) or self.now)).total_seconds()

    def asked(self, annotation: str) -> str | None:
        """The annotation's value when it names the target and has not acted yet."""
        return asked(self.observed.annotations, annotation, self.target, self.rollout)

    def say(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def set(self, **fields: Any) -> None:
        """Change the record's fields (None: not recorded); each value is checked against its type."""
        for name, value in fields.items():
            setattr(self.rollout, name, value)

    def move(self, to: RolloutPhase, message: str, reason: str | None = None, warning: bool = False) -> None:
        self.set(phase=to, phase_since=iso(self.now), message=message)
        self.say("Warning" if warning else "Normal", reason or to, message)

    def roll_back(self, gate: str, message: str) -> None:
        self.set(failed_gate=gate)
        self.move(ROLLED_BACK, message, warning=True)

    def record_gate(self, entry: GateResult) -> None:
        """status.gates keeps one entry per gate: the latest."""
        self.gates = [g for g in self.gates if g.gate != entry.gate] + [entry]


def asked(annotations: dict[str, str], annotation: str, target: str, record: RolloutStatus | None) -> str | None:
    """The annotation's value when it names `target` and has not acted yet (manual controls act once
    per value; the value acted on is kept in the record)."""
    value = annotations.get(annotation)
    if value is None or value.split("/", 1)[0] != target or (record and value == getattr(record, CONSUMED[annotation])):
        return None
    return value
