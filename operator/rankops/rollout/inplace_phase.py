"""The rollout machine's InPlace phase (rollout.strategy inPlace, issue 41): the in-place switch
(rollout/inplace.py) run inside the rollout record, its ends turned into the machine's.

    start: inPlace asked -> InPlace, or at once CanaryStarting (pods) when the plan's memory
           arithmetic or the versions' formats say the two cannot share a pod (status says why)
    InPlace --Switched--> Promoted
            --RolledBack--> RolledBack (a gate failed, or aborted), Canceled (spec.version back to
                            the stable) or Superseded (spec.version changed again)
            --FellBack--> CanaryStarting (the pods strategy, a new attempt: interference, a load
                          that failed or ran out of time)

The switch's record lives in status.rollout.inPlace; what it asks of the pods (loads, unloads,
gates by version on one pod) comes back as `actions` for the shell. A spec.version change or an
abort never drops a switch half done: the new version is unloaded from every pod first (the
switch's RollingBack), and only then does the record end, so no pod is left holding a version
nobody tracks. The gates' verdicts are recorded in status.gates under this attempt, as the Jobs'
are, so the promotion stands on the same evidence as a canary's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rankops.api.phases import RolloutPhase
from rankops.api.rankingmodel import GateResult, InPlaceSwitchStatus, RankingModelSpec, RolloutStrategy
from rankops.planner.two_versions import SideBySide, VersionOnGpu, side_by_side
from rankops.render.tritonconfig import triton_version
from rankops.rollout import inplace
from rankops.rollout.record import GATES, Event, Step, iso, new_attempt_id, passed_gates

IN_PLACE = RolloutPhase.IN_PLACE
# Without an SLO, the bound on the serving version's P99 while a version loads beside it.
DEFAULT_MAX_STABLE_P99_MS = 1000.0


@dataclass(frozen=True)
class InPlaceStart:
    phase: RolloutPhase                 # IN_PLACE, or CANARY_STARTING when it cannot be in place
    record: InPlaceSwitchStatus
    message: str
    events: tuple[Event, ...]


def policy(spec: RankingModelSpec, replicas: int) -> inplace.Policy:
    from rankops.render.desired import failure_tolerance

    bound = spec.rollout.in_place.max_stable_p99_ms or (spec.slo.p99_latency_ms if spec.slo else None) \
        or DEFAULT_MAX_STABLE_P99_MS
    return inplace.Policy(replicas=replicas, failure_tolerance=failure_tolerance(spec), max_stable_p99_ms=bound,
                          load_timeout_s=spec.rollout.in_place.load_timeout_seconds, gates=GATES)


def versions_side_by_side(spec: Any, result: Any, serving_name: str, incoming_name: str) -> SideBySide | None:
    """spec.versions' `incoming_name` loaded beside `serving_name` on one GPU with the plan `result`
    (planner.PlanResult: its batch, instances per GPU, memory figures and GPU); None when either
    is not in spec.versions. spec.planning.memory is one figure per instance for every version."""
    by_name = {v.name: v for v in getattr(spec, "versions", None) or []}
    if serving_name not in by_name or incoming_name not in by_name:
        return None
    memory = result.inputs.memory
    per_instance = memory.per_instance_mib(result.max_batch_size) if memory is not None else None
    reserve = memory.runtime_reserve_mib if memory is not None else 0.0
    return side_by_side(version_on_gpu(by_name[serving_name], per_instance, result.instances_per_gpu),
                        version_on_gpu(by_name[incoming_name], per_instance, result.instances_per_gpu),
                        result.inputs.gpu_memory_mib, reserve)


def version_on_gpu(version: Any, per_instance_mib: float | None = None, instances: int = 1) -> VersionOnGpu:
    """One of spec.versions as Triton holds it on a GPU (planner.two_versions), what built its engine included."""
    engine = (f"TensorRT {version.tensorrt_version}" if version.tensorrt_version else
              f"Triton {version.built_with_triton}" if version.built_with_triton else None)
    return VersionOnGpu(version.name, triton_version(version.name), version.format.value,
                        version.precision.value, per_instance_mib, instances, engine)


def start(spec: RankingModelSpec, target: str, stable: str, now, fit) -> InPlaceStart:
    """A new rollout with strategy inPlace: the switch's first record, or the pods strategy with why."""
    reference = spec.rollout.equivalence.reference
    if not (isinstance(reference, str) and reference in ("stable", stable)):
        # In place, equivalence compares the new version with the serving one loaded beside it.
        what = reference if isinstance(reference, str) else "a TorchScript file"
        fit = SideBySide(fit.fits if fit else None, fit.arithmetic if fit else "not worked out",
                         (*(fit.problems if fit else ()), f"rollout.equivalence.reference is {what}, which "
                          "no serving pod holds: in place, equivalence compares with the serving version"))
    switch = inplace.begin(target, stable, now, fit)
    record = _status(switch.record)
    if switch.record.phase == inplace.FELL_BACK:
        return InPlaceStart(RolloutPhase.CANARY_STARTING, record, switch.record.message, switch.events)
    return InPlaceStart(IN_PLACE, record, switch.record.message, switch.events)


def run(s: Step, observed: inplace.Observed | None, abort: str | None, paused: bool = False) -> tuple:
    """The InPlace phase's step: the switch moved on by what the shell read, its verdicts recorded,
    and its end turned into the machine's. Returns the actions the pods must see carried out.
    `paused` (rollout.paused): only what makes the switch safer moves (a rollback or fallback and
    its unloads: the new version serves its pod's share meanwhile); forward moves wait."""
    record = inplace.Record.from_status(s.rollout.in_place.to_wire())
    if observed is None:   # the shell read nothing (a new process's first reconcile): nothing moves
        return ()
    if record.phase in (inplace.PROMOTING, inplace.UNLOADING) and not set(GATES) <= passed_gates(s.gates, s.rollout):
        # A phase counts only with the verdicts it stands on (status may have been written by hand).
        record = replace(record, phase=inplace.GATING, since=iso(s.now),
                         message=f"status said {record.phase}, but no passing verdicts of attempt {s.attempt} "
                                 f"are recorded for {s.target}: gating it again")
        s.say("Warning", "GateVerdictMissing", record.message)
    if abort:
        observed = inplace.Observed(observed.now, observed.pods, observed.gates, observed.stable_p99_ms, abort)
    switch = inplace.step(record, observed, policy(s.spec, s.stable_size))
    if paused and not abort and record.phase not in inplace.CLEANING \
            and switch.record.phase not in (*inplace.CLEANING, *inplace.CLEANING.values()):
        return ()   # paused: a forward move waits
    _record_verdicts(s, switch.record, observed)
    s.set(in_place=_status(switch.record, served_by(observed, record.version, record.from_version)),
          message=switch.record.message or s.rollout.message)
    s.events.extend(switch.events)
    end = switch.record.phase
    if end == inplace.SWITCHED:
        s.move(RolloutPhase.PROMOTED, f"version {s.target} promoted in place: every pod serves it, "
                                      f"{record.from_version} unloaded")
    elif end in (inplace.ROLLED_BACK, inplace.FELL_BACK) and abort and abort.startswith(SUPERSEDED_BY):
        s.move(RolloutPhase.SUPERSEDED, f"in-place switch to {s.target} {abort}; {s.target} unloaded everywhere")
    elif end in (inplace.ROLLED_BACK, inplace.FELL_BACK) and abort and abort.startswith(CANCELED_BY):
        s.move(RolloutPhase.CANCELED, f"in-place switch to {s.target} canceled: {abort}; "
                                      f"{s.target} unloaded everywhere")
    elif end == inplace.ROLLED_BACK or (end == inplace.FELL_BACK and abort):
        s.roll_back(switch.record.failed_gate or "manual",
                    f"{switch.record.reason or 'rolled back'}" + (f"; {abort}" if abort and end == inplace.FELL_BACK
                                                                   else "")
                    + f"; {s.target} unloaded everywhere, stable {s.stable} serves on every pod")
    elif end == inplace.FELL_BACK:
        started = iso(s.now)
        s.set(strategy=RolloutStrategy.pods, attempt=new_attempt_id(s.target, started, s.rollout),
              started_at=started)
        s.move(RolloutPhase.CANARY_STARTING, f"in place not possible: {switch.record.reason}; starting canary "
                                             f"of version {s.target} beside stable {s.stable} (pods)")
    return tuple(a for a in switch.actions if not isinstance(a, inplace.FallBack))


# The abort reasons the machine gives a switch for a spec.version change (they end it differently).
SUPERSEDED_BY, CANCELED_BY = "superseded by version ", "spec.version is back to the stable version "


def _record_verdicts(s: Step, record: inplace.Record, observed: inplace.Observed) -> None:
    """Each gate's verdict on the gate pod, in status.gates under this attempt (as a Job's is)."""
    for gate, verdict in observed.gates.items():
        if gate not in GATES or verdict.pod_uid != record.gate_pod_uid:
            continue
        summary = f"{verdict.summary} (on pod {record.gate_pod})"
        known = next((g for g in s.gates if g.gate == gate), None)
        if known and known.version == s.target and known.attempt == s.attempt and known.outcome == verdict.outcome \
                and known.summary == summary:
            continue   # recorded when it came: its finishedAt stays
        s.record_gate(GateResult(gate=gate, version=s.target, attempt=s.attempt, outcome=verdict.outcome,
                                 reason="InPlace", summary=summary, finished_at=iso(s.now)))


def served_by(observed: inplace.Observed, new: str, old: str) -> str:
    """'2 on 1/3 pods, 1 on 3/3': how many of the pods read hold each version READY."""
    read = [p for p in observed.pods if p.versions is not None]
    count = lambda v: sum(p.versions.get(triton_version(v), inplace.VersionState("")).state == inplace.READY  # noqa: E731
                          for p in read)
    unread = len(observed.pods) - len(read)
    return f"{new} on {count(new)}/{len(read)} pods, {old} on {count(old)}/{len(read)}" + \
        (f" ({unread} not read)" if unread else "")


def _status(record: inplace.Record, served: str | None = None) -> InPlaceSwitchStatus:
    return InPlaceSwitchStatus.model_validate({**record.to_status(), **({"servedBy": served} if served else {})})
