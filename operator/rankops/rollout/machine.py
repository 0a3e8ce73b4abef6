"""The gated rollout of a new model version, as a pure function of spec, status and observations.

`step()` is called on every reconcile. It reads the previous rollout record from status (so an
operator restart resumes where it was), what the cluster shows (canary readiness, gate Job
results) and the clock, and returns the next record, the serving state to render, the gate Jobs
that must exist and the Events to emit. It never branches on what woke it.

    CanaryStarting -> Warming -> Verifying -> Canary -> Promoting -> Promoted
          \\______________\\___________\\__________\\___________\\-> RolledBack   (a gate failed, a deadline
    any active phase -> Superseded                   (spec.version changed again)    passed, or aborted)

Status is a record, not a licence: a phase counts only with the passing verdicts of this attempt
it stands on, and status.stableVersion only when what serves or a verified promotion vouches for
it (`trusted_stable`). Anything else goes back through the gates; nothing is promoted on a word.

Each reconcile: the guards every phase shares (the stable's claim, a version back to stable,
retry and supersede; then a phase's missing evidence, abort, a canary failing its warm-up, and
paused) are applied once, then the phase's own function runs, and the next one if it moved on
(CanaryStarting -> Warming can happen in one step). The record and the shared moves are
rollout/record.py's `Step`; the Canary phase is rollout/canary_hold.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from rankops.api.rankingmodel import (GateResult, RankingModelSpec, RankingModelStatus, RolloutStatus, RolloutStrategy,
                                      TorchscriptReference)
from rankops.render.desired import ServingState
from rankops.rollout import canary_hold, inplace_phase
from rankops.rollout.canary_hold import analysis_bounds, canary_size, lendable_replicas  # noqa: F401 (API)
from rankops.rollout.readiness import PodObservation, ready_count
from rankops.rollout.record import (  # noqa: F401 (the machine's API: re-exported)
    ABORT_ANNOTATION, ACTIVE, CANARY, CANARY_STARTING, CANCELED, CONSUMED, EVIDENCE, GATE_OF_PHASE, GATES,
    NEXT_PHASE, P99_SUMMARY_WINDOW_S, PROMOTE_ANNOTATION, PROMOTED, PROMOTING, RETRY_ANNOTATION, ROLLED_BACK,
    SUPERSEDED, VERIFYING, WARMING, Decision, Event, GateObservation, Observed, Step, asked, attempt_id, current_step,
    iso, new_attempt_id, parse_time, passed_gates)


def trusted_stable(spec: RankingModelSpec, status: RankingModelStatus, observed: Observed) -> tuple[str, str | None]:
    """The stable version, and why status.stableVersion was not taken when it was not.

    status.stableVersion is accepted when it is what the stable Deployment runs, or what the rollout
    record vouches for: a Promoted rollout of it with both gates passed for its attempt, or the
    version any other rollout started from. A claim nothing vouches for (a hand edit) is ignored;
    the vouched version stays stable, and a version change goes through its gates.
    """
    claimed, rollout = status.stable_version, status.rollout
    serving = observed.stable_template_version
    if rollout and rollout.phase == PROMOTED and set(GATES) <= passed_gates(status.gates, rollout):
        vouched = rollout.version
    elif rollout and rollout.from_version:
        vouched = rollout.from_version
    else:
        vouched = serving or claimed or spec.version
    if claimed is None or claimed in (vouched, serving):
        return claimed or vouched, None
    return vouched, (f"status.stableVersion {claimed} is neither what the stable Deployment runs "
                     f"({serving or 'none yet'}) nor a version a rollout with passing gates promoted: ignored, "
                     f"stable stays {vouched}; change spec.version to roll out {claimed} through its gates")


def reference_version_of(spec: RankingModelSpec, stable: str) -> str | None:
    ref = spec.rollout.equivalence.reference
    if isinstance(ref, TorchscriptReference) or ref in ("stable", stable):
        return None
    return ref


def _unschedulable(pods: tuple[PodObservation, ...], version: str) -> str | None:
    """The scheduler's word on the canary pods of `version` it cannot place, e.g.
    '1 pod unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu'."""
    stuck = [p for p in pods if p.version == version and p.unschedulable and not p.deleting]
    if not stuck:
        return None
    return f"{len(stuck)} pod{'s' if len(stuck) > 1 else ''} unschedulable: {stuck[0].unschedulable}"


def _canary_starting(s: Step) -> None:
    """The canary comes up; Ready on live nodes, it goes to its warmup gate."""
    pods, target = s.observed.canary_pods, s.target
    ready, desired = ready_count(pods, target), s.observed.canary_desired
    stuck = s.rollout.unschedulable
    if desired > 0 and ready >= desired:
        s.move(WARMING, f"canary {target} Ready ({ready}/{desired} pods); running the warmup gate")
    elif s.phase_age() > s.timeout:
        s.roll_back("canary", f"canary {target} not Ready after {s.timeout}s ({ready}/{desired} pods Ready on "
                              f"live nodes" + (f"; {stuck}" if stuck else "") + ")")
    elif stuck:
        s.set(message=f"waiting for canary {target} ({ready}/{desired} pods Ready): {stuck}"
                      + canary_hold._capacity_hint(s.spec))

# A gate phase rolls back this long past its Job's own deadline (a Job that never started).
GATE_GRACE_S = 120


def _gate(s: Step) -> None:
    """Warming or Verifying: the phase's gate Job runs; its verdict moves the rollout on or back."""
    gate, target, timeout = GATE_OF_PHASE[s.phase], s.target, s.timeout
    seen = s.observed.gates.get(gate, GateObservation())
    if not seen.finished:
        if s.phase_age() > timeout + GATE_GRACE_S:
            # The Job should have hit its own deadline; this catches a Job that never started.
            s.roll_back(gate, f"{gate} gate for {target} did not report within {timeout}s")
        return
    verdict = seen.verdict or {}
    outcome = verdict.get("outcome") or "error"   # no verdict: cannot judge, fail safe
    summary = verdict.get("summary") or seen.detail or (
        f"{gate} Job failed ({seen.failure_reason or 'no verdict in its termination message'})")
    if seen.failure_reason == "DeadlineExceeded":
        outcome, summary = "error", f"{gate} Job did not finish within {timeout}s (Job deadline exceeded)"
    s.record_gate(GateResult(gate=gate, version=target, attempt=s.attempt, outcome=outcome,
                             reason=verdict.get("reason") or seen.failure_reason or "NoVerdict",
                             summary=summary, metrics=verdict.get("metrics") or {}, finished_at=iso(s.now)))
    if outcome != "pass" or not seen.succeeded:
        s.roll_back(gate, f"{gate} gate {outcome} for {target}: {summary}; stable {s.stable} untouched")
        return
    nxt = NEXT_PHASE[s.phase]
    s.say("Normal", "GatePassed", f"{gate} gate passed for {target}: {summary}")
    if nxt == CANARY:
        s.set(canary_since=None, step_since=None, step=1)   # the times: set when traffic really starts (canary_hold)
        steps = " then ".join(f"{p.weight}% for {p.duration_seconds}s" for p in s.spec.rollout.canary.step_plan())
        s.move(CANARY, f"gates passed; canary {target} takes {steps}")
    else:
        s.move(nxt, f"running the {GATE_OF_PHASE[nxt]} gate on {target}")


def _promoting(s: Step) -> None:
    """The stable rolls to the target; once all of it runs it, the rollout is Promoted."""
    observed, target = s.observed, s.target
    if observed.stable_template_version == target and observed.stable_updated_ready >= observed.stable_desired:
        s.move(PROMOTED, f"version {target} promoted: stable updated, canary removed")
    elif s.phase_age() > s.timeout:
        s.roll_back("promotion", f"stable did not run version {target} on all {observed.stable_desired} replicas "
                                 f"within {s.timeout}s ({observed.stable_updated_ready} updated and Ready); "
                                 f"stable {s.stable} restored")


PHASES: dict[str, Callable[[Step], None]] = {
    CANARY_STARTING: _canary_starting, WARMING: _gate, VERIFYING: _gate,
    CANARY: lambda s: canary_hold.hold(s, paused=False), PROMOTING: _promoting,
}


def _guards(s: Step) -> None:
    """What every active phase shares, applied once before its own step."""
    target, phase = s.target, s.phase
    # A phase counts only with the verdicts it stands on (status may have been written by hand).
    missing = [g for g in EVIDENCE.get(phase, ()) if g not in passed_gates(s.gates, s.rollout)]
    if missing:
        back = WARMING if "warmup" in missing else VERIFYING
        s.move(back, f"status.rollout.phase said {phase}, but no passing {missing[0]} verdict of attempt "
                     f"{s.attempt} is recorded for {target}: running the {GATE_OF_PHASE[back]} gate",
               "GateVerdictMissing", warning=True)
    if s.phase == inplace_phase.IN_PLACE:
        return   # an abort goes through the switch: the new version is unloaded before the rollout ends
    abort = s.asked(ABORT_ANNOTATION)
    if abort:   # honoured in every active phase, paused or not
        s.set(aborted=abort)
        s.roll_back("manual", f"rollout of version {target} aborted by annotation {ABORT_ANNOTATION}; "
                              f"stable {s.stable} untouched")
        return
    if s.phase not in (CANARY_STARTING, CANARY):
        s.set(unschedulable=None)
        return
    # Kept in the record while it lasts: Degraded says it (PodsUnschedulable, with its Event), and
    # the rollout's message says what it waits for.
    s.set(unschedulable=_unschedulable(s.observed.canary_pods, target))
    if s.observed.canary_warm_failing:
        # Its warm container saw the version fail its requests: no gate will pass it, no wait helps.
        s.roll_back("canary", f"canary {target} fails its warm-up requests: "
                              f"{'; '.join(s.observed.canary_warm_failing[:3])}; stable {s.stable} untouched")


def _in_place_abort(s: Step) -> str | None:
    """Why an in-place switch must stop now: spec.version moved (back to the stable, or on to another
    version), or rankops.io/abort names its version."""
    wanted = s.spec.version
    if wanted == s.stable:
        return f"{inplace_phase.CANCELED_BY}{wanted}"
    if wanted != s.target:
        return f"{inplace_phase.SUPERSEDED_BY}{wanted}"
    abort = s.asked(ABORT_ANNOTATION)
    if abort:
        s.set(aborted=abort)
        return f"aborted by annotation {ABORT_ANNOTATION}"
    return None


def _run_phases(s: Step) -> None:
    """The current phase's step, then the next one's if it moved on (each at most once). Paused:
    no phase changes; a canary that serves is still judged, and rolled back if it fails."""
    if s.spec.rollout.paused:
        if s.phase == CANARY:
            canary_hold.hold(s, paused=True)
        return
    done: set[str] = set()
    while s.phase in PHASES and s.phase not in done:
        done.add(s.phase)
        PHASES[s.phase](s)


def _start(spec: RankingModelSpec, status: RankingModelStatus, observed: Observed, stable: str,
           events: list[Event]) -> tuple[RolloutStatus | None, list[GateResult], str | None]:
    """The rollout record this step works on (its own copy: the status read is left as it was), its
    gates, and the outcome when there is nothing to roll (None, or an idle record, when the target
    is stable or stays rolled back)."""
    now, target = observed.now, spec.version
    rollout, gates = status.rollout, list(status.gates)
    phase = rollout.phase if rollout else None
    if rollout and phase == inplace_phase.IN_PLACE:
        # A switch half done ends through its own rollback first, whatever spec.version says now.
        return rollout.model_copy(deep=True), gates, None
    if target == stable:
        if rollout and phase in ACTIVE:
            record = rollout.model_copy(deep=True)
            record.phase, record.phase_since = CANCELED, iso(now)
            record.message = f"spec.version is back to the stable version {stable}; canary {rollout.version} removed"
            events.append(Event("Normal", "RolloutCanceled", record.message))
            return record, gates, CANCELED
        return rollout, gates, "idle"
    retry = asked(observed.annotations, RETRY_ANNOTATION, target, rollout)
    if rollout and rollout.version == target and phase == ROLLED_BACK and not retry:
        return rollout, gates, "idle"   # stays rolled back until spec.version changes or a retry is asked
    if rollout and rollout.version == target and phase in ACTIVE:
        return rollout.model_copy(deep=True), gates, None
    if rollout and phase in ACTIVE:
        events.append(Event("Normal", "RolloutSuperseded",
                            f"rollout of version {rollout.version} superseded by version {target}"))
    elif rollout and rollout.version == target and phase not in (ROLLED_BACK, SUPERSEDED, CANCELED):
        # Promoted while stable is not the target, or a phase this machine never writes.
        events.append(Event("Warning", "RolloutRestarted",
                            f"status.rollout says {phase} for version {target} but stable is {stable}: "
                            f"running version {target}'s gates again"))
    started = iso(now)
    consumed = {key: getattr(rollout, key) for key in CONSUMED.values() if rollout and getattr(rollout, key)}
    record = RolloutStatus(version=target, from_version=stable, phase=CANARY_STARTING,
                           attempt=new_attempt_id(target, started, rollout), started_at=started, phase_since=started,
                           message=f"starting canary of version {target} beside stable {stable}",
                           strategy=spec.rollout.strategy, **{**consumed, **({"retried": retry} if retry else {})})
    if spec.rollout.switches_in_place:
        begun = inplace_phase.start(spec, target, stable, now, observed.in_place_fit)
        events.extend(begun.events)
        record.in_place = begun.record
        if begun.phase == inplace_phase.IN_PLACE:
            record.phase, record.message = begun.phase, begun.message
            return record, [], None
        record.strategy, record.message = RolloutStrategy.pods, f"{begun.message}: {record.message}"
    events.append(Event("Normal", CANARY_STARTING, record.message))
    return record, [], None


def step(spec: RankingModelSpec, status: RankingModelStatus, observed: Observed) -> Decision:
    decision = _step(spec, status, observed)
    if not spec.rollout.switches_in_place:
        return decision
    kept, rendered = _started_for(status, decision)
    return replace(decision, stable_pods_version=kept, serving=replace(decision.serving, started_for=rendered))


def _started_for(status: RankingModelStatus, decision: Decision) -> tuple[str, str]:
    """(status.stablePodsVersion, the stable template's rankops.io/started-for): the version the
    stable pods were last started for. An in-place promotion keeps it (the running pods serve the
    new version already); a promotion by pods moves it, and the template moves with the Promoting
    phase, so the stable pods roll to the new version then (and back, if the promotion rolls back)."""
    kept = status.stable_pods_version or status.stable_version or decision.stable_version
    rollout = decision.rollout
    by_pods = rollout is not None and rollout.strategy != RolloutStrategy.in_place
    if decision.outcome == PROMOTED and by_pods:
        kept = decision.stable_version
    rendered = decision.serving.stable_version if by_pods and rollout.phase == PROMOTING else kept
    return kept, rendered


def _step(spec: RankingModelSpec, status: RankingModelStatus, observed: Observed) -> Decision:
    stable, rejected = trusted_stable(spec, status, observed)
    events: list[Event] = []
    if rejected:
        events.append(Event("Warning", "StatusRejected", rejected))
    rollout, gates, settled = _start(spec, status, observed, stable, events)
    if settled is not None:
        outcome = CANCELED if settled == CANCELED else None
        return Decision(stable, ServingState(stable), rollout, gates, events=tuple(events), outcome=outcome)

    s = Step(spec, observed, stable, status.rollout, rollout, gates, events)
    _guards(s)
    actions: tuple = ()
    if s.phase == inplace_phase.IN_PLACE:
        actions = inplace_phase.run(s, observed.in_place, _in_place_abort(s), paused=spec.rollout.paused)
    if s.phase in ACTIVE:
        _run_phases(s)
    phase, target = s.phase, s.target
    if phase == PROMOTED:
        return Decision(target, ServingState(target), s.rollout, s.gates, events=tuple(events), outcome=PROMOTED)
    if phase in (ROLLED_BACK, CANCELED, SUPERSEDED):
        return Decision(stable, ServingState(stable), s.rollout, s.gates, events=tuple(events), outcome=phase)
    if phase == inplace_phase.IN_PLACE:
        # The stable pods hold the new version beside the serving one; nothing else is rendered for it.
        return Decision(stable, ServingState(stable, staged_versions=(target,)), s.rollout, s.gates,
                        events=tuple(events), in_place_actions=actions)

    # Active rollout: render the canary beside the stable (or in its lent replicas), at the weight
    # of the step it holds. Traffic follows the record: it reaches the canary only from the step
    # after status says Canary, so no request is served by a version whose status lacks both verdicts.
    weight = current_step(spec, s.rollout)[1].weight
    canary_replicas, lent = canary_size(spec, s.stable_size, weight)
    taking_traffic = phase in (CANARY, PROMOTING) and s.recorded_in(CANARY, PROMOTING)
    serving = ServingState(
        stable_version=target if phase == PROMOTING else stable,
        canary_version=target, canary_traffic=taking_traffic, canary_replicas=canary_replicas,
        canary_weight=weight, stable_lent=lent,
        # inPlace model promoted by pods: its pods not rolled yet keep the old version's files
        staged_versions=(stable,) if phase == PROMOTING and spec.rollout.switches_in_place else ())
    jobs = (GATE_OF_PHASE[phase],) if phase in GATE_OF_PHASE else ()
    reference = reference_version_of(spec, stable) if phase in (WARMING, VERIFYING) else None
    outcome = SUPERSEDED if any(e.reason == "RolloutSuperseded" for e in events) else None
    return Decision(stable, serving, s.rollout, s.gates, gate_jobs=jobs, reference_version=reference,
                    events=tuple(events), outcome=outcome)
