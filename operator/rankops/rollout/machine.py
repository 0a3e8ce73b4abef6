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
"""
from __future__ import annotations

import datetime as dt
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from rankops.api.rankingmodel import (CanaryCapacity, NoVerdictPolicy, RankingModelSpec, TorchscriptReference,
                                     TrafficMode)
from rankops.render.desired import ServingState, canary_replicas_for
from rankops.rollout import canary_analysis
from rankops.rollout.readiness import PodObservation, ready_count

CANARY_STARTING, WARMING, VERIFYING, CANARY, PROMOTING = "CanaryStarting", "Warming", "Verifying", "Canary", "Promoting"
PROMOTED, ROLLED_BACK, SUPERSEDED, CANCELED = "Promoted", "RolledBack", "Superseded", "Canceled"
ACTIVE = (CANARY_STARTING, WARMING, VERIFYING, CANARY, PROMOTING)
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
    # The stable replicas the model wants (spec.replicas, or the plan's), before any is lent to the canary.
    replicas: int | None = None


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
    """Short id of one rollout attempt: gate Job names and verdicts carry it, so a retry never reads
    old verdicts. Records made before `attempt` was stored derive it as they did then."""
    return rollout.get("attempt") or \
        hashlib.sha256(f"{rollout['version']}@{rollout.get('startedAt')}".encode()).hexdigest()[:6]


def _new_attempt_id(version: str, started: str, previous: dict[str, Any] | None) -> str:
    # Chained to the attempt it replaces: two attempts of a version started in the same second differ.
    prev = attempt_id(previous) if previous else ""
    return hashlib.sha256(f"{version}@{started}@{prev}".encode()).hexdigest()[:6]


def passed_gates(gates: list[dict[str, Any]], rollout: dict[str, Any]) -> set[str]:
    """Gates with a passing verdict recorded for this rollout's version and attempt."""
    attempt = attempt_id(rollout)
    return {g.get("gate") for g in gates if g.get("outcome") == "pass" and g.get("version") == rollout["version"]
            and g.get("attempt") == attempt}


def trusted_stable(spec: RankingModelSpec, status: dict[str, Any], observed: Observed) -> tuple[str, str | None]:
    """The stable version, and why status.stableVersion was not taken when it was not.

    status.stableVersion is accepted when it is what the stable Deployment runs, or what the rollout
    record vouches for: a Promoted rollout of it with both gates passed for its attempt, or the
    version any other rollout started from. A claim nothing vouches for (a hand edit) is ignored;
    the vouched version stays stable, and a version change goes through its gates.
    """
    claimed, rollout = status.get("stableVersion"), status.get("rollout")
    serving = observed.stable_template_version
    if rollout and rollout.get("phase") == PROMOTED and set(GATES) <= passed_gates(status.get("gates") or [], rollout):
        vouched = rollout["version"]
    elif rollout and rollout.get("fromVersion"):
        vouched = rollout["fromVersion"]
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


def analysis_bounds(spec: RankingModelSpec) -> canary_analysis.Bounds:
    cfg = spec.rollout.canary.analysis
    max_p99 = cfg.max_p99_ms if cfg.max_p99_ms is not None else (spec.slo.p99_latency_ms if spec.slo else None)
    return canary_analysis.Bounds(max_failure_ratio=cfg.max_failure_ratio, max_p99_ms=max_p99,
                                  max_p99_vs_stable=cfg.max_p99_vs_stable, min_requests=cfg.min_requests)


def _analyse(spec: RankingModelSpec, rollout: dict[str, Any], observed: Observed,
             attempt: str) -> canary_analysis.Judgement | None:
    """The canary's numbers since its current step's weight took effect, against the stable's
    (None: analysis off, or not read).

    The first reading of this attempt's step is kept in the record as the window's start
    (`rollout.analysisBaseline`), so a restarted operator judges the same window, and each step
    is judged on its own.
    """
    from rankops.gates.server_metrics import ModelCounters

    readings = observed.track_metrics
    if not spec.rollout.canary.analysis.enabled or not readings or not readings.get("canary"):
        return None
    step = rollout.get("step") or 1
    baseline = rollout.get("analysisBaseline")
    if not baseline or baseline.get("attempt") != attempt or (baseline.get("step") or 1) != step:
        baseline = {"attempt": attempt, "step": step}
    # A pod first seen after the window began (a step's scale-up, a restart: a counter went down)
    # starts its own window at this reading: its counters so far are mostly its warm replay, which
    # is not traffic of the step (counted, it dilutes the real failures).
    now = iso(observed.now)
    joined = {track: dict(pods) for track, pods in (baseline.get("joined") or {}).items()}
    for track, pods in readings.items():
        known = baseline.get(track) or {}
        for pod, c in pods.items():
            if known and (pod not in known or any(c.values.get(k, 0.0) < v for k, v in known[pod].items())):
                joined.setdefault(track, {})[pod] = now
    baseline = {**baseline, **{track: {
        **(baseline.get(track) or {}),
        **{pod: dict(c.values) for pod, c in pods.items()
           if pod not in (baseline.get(track) or {})
           or any(c.values.get(k, 0.0) < v for k, v in baseline[track][pod].items())}}
        for track, pods in readings.items()}, **({"joined": joined} if joined else {})}
    if baseline != rollout.get("analysisBaseline"):
        rollout["analysisBaseline"] = baseline
    # Triton's latency summary covers about the last minute, so a pod that joined the window less
    # than that ago still reports its own cold start and warm replay in its P99: it is left out of
    # its track's P99 (its failures still count) until the minute has passed.
    young = {track: {pod for pod, at in pods.items()
                     if (observed.now - parse_time(at)).total_seconds() < P99_SUMMARY_WINDOW_S}
             for track, pods in joined.items()}
    before = {track: {pod: ModelCounters(values, {}) for pod, values in (baseline.get(track) or {}).items()}
              for track in ("canary", "stable")}
    windows = {track: canary_analysis.track_window(before[track], readings.get(track) or {},
                                                   young.get(track, set()))
               for track in ("canary", "stable")}
    return canary_analysis.judge(windows["canary"], windows["stable"], analysis_bounds(spec))


def _canary_result(version: str, attempt: str, judged: canary_analysis.Judgement, now: dt.datetime,
                   step: int, steps: int, window: dict[str, Any]) -> dict[str, Any]:
    """status.gates' canary entry: the outcome and what it was judged on (both tracks' requests,
    failures and P99s, the bounds, and the window: its start and the seconds the canary served)."""
    outcome = {canary_analysis.FAIL: "fail", canary_analysis.PASS: "pass"}.get(judged.outcome, "inconclusive")
    where = f"step {step}/{steps}: " if steps > 1 else ""
    return {"gate": "canary", "version": version, "attempt": attempt, "outcome": outcome, "reason": judged.reason,
            "summary": where + judged.summary, "metrics": {**judged.metrics, "step": step, **window},
            "finishedAt": iso(now)}


def lendable_replicas(spec: RankingModelSpec) -> int:
    """Stable replicas a `capacity: replace` canary may take: the replicas the model may lose and
    still meet its SLO (planning.failureTolerance; 1, the planner's default, without planning)."""
    tolerance = spec.planning.failure_tolerance if spec.planning is not None else 1
    return max(0, tolerance)


def canary_size(spec: RankingModelSpec, stable_size: int, weight: int) -> tuple[int, int]:
    """(canary pods, stable replicas lent to them) for a step of `weight` percent beside a stable of
    `stable_size` replicas (the model's, not the Deployment's: lending shrinks that one).

    `replicas` traffic splits by Ready pods, so a surge canary needs w/(100-w) of the stable's count
    and a replacing one w% of it; exact routing gives the canary the stable's pods for its share.
    Replace lends at most lendable_replicas and keeps one stable replica; without any to lend the
    canary surges."""
    exact_share = max(1, math.ceil(stable_size * weight / 100))
    if spec.rollout.canary.capacity is CanaryCapacity.replace:
        lend = min(exact_share, lendable_replicas(spec), max(stable_size - 1, 0))
        if lend > 0:
            return lend, lend
    if spec.rollout.canary.traffic is TrafficMode.replicas:
        return canary_replicas_for(stable_size, weight), 0
    return exact_share, 0


def _unschedulable(pods: tuple[PodObservation, ...], version: str) -> str | None:
    """The scheduler's word on the canary pods of `version` it cannot place, e.g.
    '1 pod unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu'."""
    stuck = [p for p in pods if p.version == version and p.unschedulable and not p.deleting]
    if not stuck:
        return None
    return f"{len(stuck)} pod{'s' if len(stuck) > 1 else ''} unschedulable: {stuck[0].unschedulable}"


def current_step(spec: RankingModelSpec, rollout: dict[str, Any] | None) -> tuple[int, Any]:
    """The canary step being held (1-based, clamped to the spec's steps, which may have changed)
    and its CanaryStep."""
    plan = spec.rollout.canary.step_plan()
    number = min(max(int((rollout or {}).get("step") or 1), 1), len(plan))
    return number, plan[number - 1]


def _capacity_hint(spec: RankingModelSpec) -> str:
    if spec.rollout.canary.capacity is CanaryCapacity.surge and lendable_replicas(spec) > 0:
        return ("; on a cluster without room for the canary, rollout.canary.capacity: replace lets it take a "
                "stable replica's GPU")
    return ""


def _no_verdict_result(version: str, attempt: str, now: dt.datetime, step: int, steps: int, reason: str,
                       summary: str, window: dict[str, Any]) -> dict[str, Any]:
    where = f"step {step}/{steps}: " if steps > 1 else ""
    return {"gate": "canary", "version": version, "attempt": attempt, "outcome": "inconclusive", "reason": reason,
            "summary": where + summary, "metrics": {"step": step, **window}, "finishedAt": iso(now)}


def _hold_canary(spec: RankingModelSpec, rollout: dict[str, Any], gates: list[dict[str, Any]], observed: Observed,
                 events: list[Event], move: Any, roll_back: Any, *, traffic_on: bool, stable: str, stable_size: int,
                 paused: bool, promote: str | None) -> list[dict[str, Any]]:
    """One reconcile of the Canary phase: the step's hold, judged on evidence; returns status.gates.

    The hold counts only time in which the canary served at its step's weight (every pod of the
    step Ready on a live node, traffic on): when the canary stops serving, the step's clock and
    its analysis window start again once it is back. A step moves on with a passing verdict, or
    with analysis off (the clock alone, by the spec's choice); without a verdict its hold is
    extended up to analysis.maxExtensionSeconds, then analysis.onNoVerdict decides. A failing
    verdict rolls back at once, paused or not.
    """
    now, target, attempt = observed.now, rollout["version"], attempt_id(rollout)
    analysis = spec.rollout.canary.analysis
    timeout = spec.rollout.gate_jobs.timeout_seconds
    plan = spec.rollout.canary.step_plan()
    number, held_step = current_step(spec, rollout)
    steps, last = len(plan), number == len(plan)
    duration = held_step.duration_seconds
    where = f" (step {number}/{steps}, {held_step.weight}%)" if steps > 1 else ""
    wanted = max(observed.canary_desired, canary_size(spec, stable_size, held_step.weight)[0])
    ready = ready_count(observed.canary_pods, target)
    serving = traffic_on and ready >= wanted
    # (A record of an operator before steps has only canarySince.)
    since = parse_time(rollout.get("stepSince") or (None if rollout.get("canaryDownSince")
                                                    else rollout.get("canarySince")))

    # Whatever part of its weight the canary serves, its failures count: a failing canary is rolled
    # back at once, paused or not, at full weight or not.
    judged = _analyse(spec, rollout, observed, attempt) if traffic_on else None
    if judged is not None and judged.outcome == canary_analysis.FAIL:
        held = int((now - since).total_seconds()) if since else 0
        gates = [g for g in gates if g.get("gate") != "canary"] + [_canary_result(
            target, attempt, judged, now, number, steps,
            {"windowStart": iso(since) if since else None, "windowSeconds": held})]
        roll_back("canary", f"canary analysis failed for {target}{where}: {judged.summary}; stable {stable} untouched")
        return gates

    if serving and since is None:   # the step's weight is served from now: its hold starts (again)
        if rollout.get("canaryDownSince"):
            events.append(Event("Normal", "CanaryServing", f"canary {target} serves its weight{where} with "
                                                           f"{ready}/{wanted} pods: its {duration}s hold starts"))
        rollout.pop("canaryDownSince", None)
        rollout.pop("holdExtendedSince", None)
        rollout["canarySince"] = rollout.get("canarySince") or iso(now)
        rollout["stepSince"] = iso(now)
        since = now
    elif since is not None and not serving:
        held = int((now - since).total_seconds())
        rollout.pop("stepSince", None)
        rollout.pop("analysisBaseline", None)
        rollout.pop("holdExtendedSince", None)
        rollout["canaryDownSince"] = iso(now)
        stuck = rollout.get("unschedulable")
        rollout["message"] = (f"canary {target} stopped serving{where} after {held}s of its {duration}s hold "
                              f"({ready}/{wanted} pods Ready on live nodes" + (f"; {stuck}" if stuck else "") +
                              "): the hold and its analysis start again once every pod serves")
        events.append(Event("Warning", "CanaryNotServing", rollout["message"]))
        since = None

    if since is None:   # not serving at the step's weight (yet, or any more): it has timeoutSeconds to
        waiting = parse_time(rollout.get("canaryDownSince") or rollout.get("phaseSince")) or now
        if (now - waiting).total_seconds() > timeout and not paused:
            stuck = rollout.get("unschedulable")
            roll_back("canary", f"canary {target} not serving{where} within {timeout}s ({ready}/{wanted} pods "
                                f"Ready on live nodes" + (f"; {stuck}" if stuck else "") +
                                f"); stable {stable} untouched")
        elif rollout.get("unschedulable"):
            rollout["message"] = (f"waiting for canary {target}{where} ({ready}/{wanted} pods Ready): "
                                  f"{rollout['unschedulable']}" + _capacity_hint(spec))
        return gates

    held = (now - since).total_seconds()
    window = {"windowStart": iso(since), "windowSeconds": int(held)}
    # Why no verdict can be given now.
    blind = ("metrics not read from " + "; ".join(observed.metrics_problems)) \
        if analysis.enabled and observed.metrics_problems else None
    problem = None
    if analysis.enabled and judged is None:
        problem = blind or "no canary pod taking traffic has been read yet"
    elif judged is not None and judged.outcome == canary_analysis.WAIT:
        problem = judged.summary
    # Kept in the record while it lasts: Degraded says it (CanaryNotJudged, with its Event, once).
    if blind:
        rollout["analysisProblem"] = blind
    else:
        rollout.pop("analysisProblem", None)

    def record(entry: dict[str, Any]) -> None:
        nonlocal gates
        gates = [g for g in gates if g.get("gate") != "canary"] + [entry]

    def judged_entry() -> dict[str, Any]:
        return _canary_result(target, attempt, judged, now, number, steps, window)

    def advance(why: str, note: str) -> None:
        rollout.pop("awaitingDecision", None)
        rollout.pop("holdExtendedSince", None)
        if last or promote:
            if promote:
                rollout["promoted"] = promote
            move(PROMOTING, f"{why}{note}; updating stable to {target}")
            return
        upcoming = plan[number]
        rollout.update(step=number + 1, canaryDownSince=iso(now))   # serving the new weight starts its hold
        rollout.pop("stepSince", None)
        if observed.track_metrics:   # the next weight takes effect now: its window starts at this reading
            rollout["analysisBaseline"] = {"attempt": attempt, "step": number + 1, **{
                track: {pod: dict(c.values) for pod, c in pods.items()}
                for track, pods in observed.track_metrics.items()}}
        rollout["message"] = (f"canary {target} takes {upcoming.weight}% for {upcoming.duration_seconds}s "
                              f"(step {number + 1}/{steps}) after holding {held_step.weight}% {int(held)}s{note}")
        events.append(Event("Normal", "CanaryStepPassed", rollout["message"]))

    if paused:
        return gates
    verdict = judged is not None and judged.outcome == canary_analysis.PASS
    if promote:
        if verdict:
            record(judged_entry())
        else:
            record(_no_verdict_result(target, attempt, now, number, steps, "PromotedByAnnotation",
                                      f"promoted by annotation {PROMOTE_ANNOTATION} without a verdict"
                                      + (f" ({problem})" if problem else ""), window))
        advance("promoted by annotation" if held < duration else f"canary held {int(held)}s{where}",
                f"; canary analysis: {judged.summary}" if verdict else f"; no canary verdict ({problem})"
                if problem else "")
        return gates
    if held < duration:
        return gates
    if not analysis.enabled:
        record(_no_verdict_result(target, attempt, now, number, steps, "AnalysisDisabled",
                                  f"held {int(held)}s with rollout.canary.analysis.enabled false: not judged",
                                  window))
        advance(f"canary held {int(held)}s{where}", "; canary analysis off (rollout.canary.analysis.enabled false)")
        return gates
    if verdict:
        record(judged_entry())
        advance(f"canary held {int(held)}s{where}", f"; canary analysis: {judged.summary}")
        return gates
    # The hold is over but nothing judged the canary: extend it, then let the policy decide.
    if held < duration + analysis.max_extension_seconds:
        if not rollout.get("holdExtendedSince"):
            rollout["holdExtendedSince"] = iso(now)
            rollout["message"] = (f"canary {target}{where} held {int(held)}s without a verdict ({problem}): hold "
                                  f"extended up to {analysis.max_extension_seconds}s (analysis.maxExtensionSeconds)")
            events.append(Event("Warning", "CanaryHoldExtended", rollout["message"]))
        return gates
    policy = analysis.on_no_verdict
    summary = (f"no verdict after {int(held)}s serving ({duration}s hold + {analysis.max_extension_seconds}s "
               f"extension): {problem}")
    if policy is NoVerdictPolicy.promote:
        record(_no_verdict_result(target, attempt, now, number, steps, "PromotedWithoutVerdict",
                                  f"{summary}; moved on by analysis.onNoVerdict promote", window))
        advance(f"canary held {int(held)}s{where}", f"; no canary verdict ({problem}), onNoVerdict promote")
    elif policy is NoVerdictPolicy.hold:
        if not rollout.get("awaitingDecision"):
            rollout["awaitingDecision"] = (f"{summary}; onNoVerdict hold: annotate rankops.io/promote={target} "
                                           f"to move on, or rankops.io/abort={target} to roll back")
            rollout["message"] = f"canary {target}{where} awaits a decision: {rollout['awaitingDecision']}"
            record(_no_verdict_result(target, attempt, now, number, steps, "AwaitingDecision", summary, window))
            events.append(Event("Warning", "CanaryAwaitingDecision", rollout["message"]))
    else:
        record(_no_verdict_result(target, attempt, now, number, steps, "NoVerdict", summary, window))
        roll_back("canary", f"canary {target}{where}: {summary}; rolled back by analysis.onNoVerdict rollback; "
                            f"stable {stable} untouched")
    return gates


def step(spec: RankingModelSpec, status: dict[str, Any], observed: Observed) -> Decision:
    now = observed.now
    stable, rejected = trusted_stable(spec, status, observed)
    rollout = status.get("rollout")
    gates = list(status.get("gates") or [])
    target = spec.version
    events: list[Event] = []
    if rejected:
        events.append(Event("Warning", "StatusRejected", rejected))

    def idle(record, *, outcome=None) -> Decision:
        return Decision(stable, ServingState(stable), record, gates, events=tuple(events), outcome=outcome)

    if target == stable:
        if rollout and rollout.get("phase") in ACTIVE:
            record = {**rollout, "phase": CANCELED, "phaseSince": iso(now),
                      "message": f"spec.version is back to the stable version {stable}; canary {rollout['version']} removed"}
            events.append(Event("Normal", "RolloutCanceled", record["message"]))
            return idle(record, outcome=CANCELED)
        return idle(rollout)

    def asked(annotation: str, record: dict[str, Any] | None) -> str | None:
        """The annotation's value when it names the target and has not acted yet."""
        value = observed.annotations.get(annotation)
        if value is None or value.split("/", 1)[0] != target or value == (record or {}).get(CONSUMED[annotation]):
            return None
        return value

    retry = asked(RETRY_ANNOTATION, rollout)
    phase = (rollout or {}).get("phase")
    if rollout and rollout["version"] == target and phase == ROLLED_BACK and not retry:
        return idle(rollout)  # stays rolled back until spec.version changes or a retry is asked
    if rollout is None or rollout["version"] != target or phase not in ACTIVE:
        if rollout and phase in ACTIVE:
            events.append(Event("Normal", "RolloutSuperseded",
                                f"rollout of version {rollout['version']} superseded by version {target}"))
        elif rollout and rollout["version"] == target and phase not in (ROLLED_BACK, SUPERSEDED, CANCELED):
            # Promoted while stable is not the target, or a phase this machine never writes.
            events.append(Event("Warning", "RolloutRestarted",
                                f"status.rollout says {phase} for version {target} but stable is {stable}: "
                                f"running version {target}'s gates again"))
        started = iso(now)
        record = {"version": target, "fromVersion": stable, "phase": CANARY_STARTING,
                  "attempt": _new_attempt_id(target, started, rollout), "startedAt": started, "phaseSince": started,
                  "message": f"starting canary of version {target} beside stable {stable}"}
        record.update({key: (rollout or {}).get(key) for key in CONSUMED.values() if (rollout or {}).get(key)})
        if retry:
            record["retried"] = retry
        rollout = record
        gates = []
        events.append(Event("Normal", "CanaryStarting", rollout["message"]))

    rollout = dict(rollout)
    paused = spec.rollout.paused
    phase = rollout["phase"]
    attempt = attempt_id(rollout)

    def phase_age() -> float:
        """Seconds in the current phase: read when used, as a move earlier in this step starts a new one
        (a hold longer than the timeout must not make the Promoting it moves to late at once)."""
        return (now - (parse_time(rollout.get("phaseSince")) or now)).total_seconds()
    timeout = spec.rollout.gate_jobs.timeout_seconds
    canary_ready = ready_count(observed.canary_pods, target)
    canary_up = observed.canary_desired > 0 and canary_ready >= observed.canary_desired
    # The model's stable size (not the Deployment's, which a replacing canary shrinks; with
    # batching: auto the plan's replicas, not spec.replicas).
    stable_size = observed.replicas or observed.stable_desired or spec.replicas

    def move(to: str, message: str, reason: str | None = None, warning: bool = False) -> None:
        nonlocal phase
        rollout.update(phase=to, phaseSince=iso(now), message=message)
        phase = to
        events.append(Event("Warning" if warning else "Normal", reason or to, message))

    def roll_back(gate: str, message: str) -> None:
        rollout["failedGate"] = gate
        move(ROLLED_BACK, message, "RolledBack", warning=True)

    # A phase counts only with the verdicts it stands on (status may have been written by hand).
    missing = [g for g in EVIDENCE.get(phase, ()) if g not in passed_gates(gates, rollout)]
    if missing:
        back = WARMING if "warmup" in missing else VERIFYING
        move(back, f"status.rollout.phase said {phase}, but no passing {missing[0]} verdict of attempt {attempt} "
                   f"is recorded for {target}: running the {GATE_OF_PHASE[back]} gate", "GateVerdictMissing",
             warning=True)

    abort = asked(ABORT_ANNOTATION, rollout)
    if abort:   # honoured in every active phase, paused or not
        rollout["aborted"] = abort
        roll_back("manual", f"rollout of version {target} aborted by annotation {ABORT_ANNOTATION}; "
                            f"stable {stable} untouched")

    stuck = _unschedulable(observed.canary_pods, target) if phase in (CANARY_STARTING, CANARY) else None
    # Kept in the record while it lasts: Degraded says it (PodsUnschedulable, with its Event), and
    # the rollout's message says what it waits for.
    if stuck:
        rollout["unschedulable"] = stuck
    else:
        rollout.pop("unschedulable", None)
    if phase in (CANARY_STARTING, CANARY) and observed.canary_warm_failing:
        # Its warm container saw the version fail its requests: no gate will pass it, no wait helps.
        roll_back("canary", f"canary {target} fails its warm-up requests: "
                            f"{'; '.join(observed.canary_warm_failing[:3])}; stable {stable} untouched")
    if not paused and phase == CANARY_STARTING:
        if canary_up:
            move(WARMING, f"canary {target} Ready ({canary_ready}/{observed.canary_desired} pods); "
                          "running the warmup gate")
        elif phase_age() > timeout:
            roll_back("canary", f"canary {target} not Ready after {timeout}s "
                                f"({canary_ready}/{observed.canary_desired} pods Ready on live nodes"
                                + (f"; {stuck}" if stuck else "") + ")")
        elif stuck:
            rollout["message"] = (f"waiting for canary {target} ({canary_ready}/{observed.canary_desired} pods "
                                  f"Ready): {stuck}" + _capacity_hint(spec))

    if not paused and phase in GATE_OF_PHASE:
        gate = GATE_OF_PHASE[phase]
        seen = observed.gates.get(gate, GateObservation())
        if seen.finished:
            verdict = seen.verdict or {}
            outcome = verdict.get("outcome") or "error"   # no verdict: cannot judge, fail safe
            summary = verdict.get("summary") or seen.detail or (
                f"{gate} Job failed ({seen.failure_reason or 'no verdict in its termination message'})")
            if seen.failure_reason == "DeadlineExceeded":
                outcome, summary = "error", f"{gate} Job did not finish within {timeout}s (Job deadline exceeded)"
            result = {"gate": gate, "version": target, "attempt": attempt, "outcome": outcome,
                      "reason": verdict.get("reason") or seen.failure_reason or "NoVerdict",
                      "summary": summary, "metrics": verdict.get("metrics") or {}, "finishedAt": iso(now)}
            gates = [g for g in gates if g.get("gate") != gate] + [result]
            if outcome == "pass" and seen.succeeded:
                nxt = NEXT_PHASE[phase]
                events.append(Event("Normal", "GatePassed", f"{gate} gate passed for {target}: {summary}"))
                if nxt == CANARY:
                    for key in ("canarySince", "stepSince"):
                        rollout.pop(key, None)   # set when traffic really starts (below)
                    rollout["step"] = 1
                    plan = spec.rollout.canary.step_plan()
                    steps = " then ".join(f"{s.weight}% for {s.duration_seconds}s" for s in plan)
                    move(CANARY, f"gates passed; canary {target} takes {steps}")
                else:
                    move(nxt, f"running the {GATE_OF_PHASE[nxt]} gate on {target}")
            else:
                roll_back(gate, f"{gate} gate {outcome} for {target}: {summary}; stable {stable} untouched")
        elif phase_age() > timeout + 120:
            # The Job should have hit its own deadline; this catches a Job that never started.
            roll_back(gate, f"{gate} gate for {target} did not report within {timeout}s")

    # Traffic follows the record: it reaches the canary only from the step after status says Canary,
    # so no request is served by a version whose status does not yet show both verdicts.
    recorded = status.get("rollout") or {}
    recorded_here = recorded.get("version") == target and attempt_id(recorded) == attempt
    if phase == CANARY:
        gates = _hold_canary(spec, rollout, gates, observed, events, move, roll_back,
                             traffic_on=recorded_here and recorded.get("phase") == CANARY,
                             stable=stable, stable_size=stable_size, paused=paused, promote=asked(PROMOTE_ANNOTATION, rollout))
        phase = rollout["phase"]

    if phase == PROMOTING:
        rolled = (observed.stable_template_version == target
                  and observed.stable_updated_ready >= observed.stable_desired)
        if rolled:
            move(PROMOTED, f"version {target} promoted: stable updated, canary removed", "Promoted")
            return Decision(target, ServingState(target), rollout, gates, events=tuple(events), outcome=PROMOTED)
        if phase_age() > timeout:
            roll_back("promotion", f"stable did not run version {target} on all {observed.stable_desired} replicas "
                                   f"within {timeout}s ({observed.stable_updated_ready} updated and Ready); "
                                   f"stable {stable} restored")

    if phase == ROLLED_BACK:
        return Decision(stable, ServingState(stable), rollout, gates, events=tuple(events), outcome=ROLLED_BACK)

    # Active rollout: render the canary beside the stable (or in its lent replicas), at the weight
    # of the step it holds.
    weight = current_step(spec, rollout)[1].weight
    canary_replicas, lent = canary_size(spec, stable_size, weight)
    taking_traffic = phase in (CANARY, PROMOTING) and recorded.get("phase") in (CANARY, PROMOTING) and recorded_here
    serving = ServingState(
        stable_version=target if phase == PROMOTING else stable,
        canary_version=target, canary_traffic=taking_traffic, canary_replicas=canary_replicas,
        canary_weight=weight, stable_lent=lent)
    jobs = (GATE_OF_PHASE[phase],) if phase in GATE_OF_PHASE else ()
    reference = reference_version_of(spec, stable) if phase in (WARMING, VERIFYING) else None
    outcome = SUPERSEDED if any(e.reason == "RolloutSuperseded" for e in events) else None
    return Decision(stable, serving, rollout, gates, gate_jobs=jobs, reference_version=reference,
                    events=tuple(events), outcome=outcome)
