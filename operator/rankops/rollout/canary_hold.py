"""The Canary phase: the canary holds each step's weight, judged on evidence (pure).

The hold counts only served time; each step moves on with a passing verdict from Triton's own
numbers (rollout/canary_analysis.py), or by an explicit policy when none can be had; a failing
verdict rolls back at once. Sizing the canary (surge beside the stable, or in replicas it lends)
is here too: the hold needs to know how many pods serve the step's weight.
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from rankops.api.rankingmodel import (CanaryCapacity, GateResult, NoVerdictPolicy, RankingModelSpec, RolloutStatus,
                                      TrafficMode)
from rankops.render.desired import canary_replicas_for
from rankops.rollout import canary_analysis
from rankops.rollout.readiness import ready_count
from rankops.rollout.record import (CANARY, PROMOTE_ANNOTATION, PROMOTING, P99_SUMMARY_WINDOW_S, Observed, Step,
                                    current_step, iso, parse_time)

def analysis_bounds(spec: RankingModelSpec) -> canary_analysis.Bounds:
    cfg = spec.rollout.canary.analysis
    max_p99 = cfg.max_p99_ms if cfg.max_p99_ms is not None else (spec.slo.p99_latency_ms if spec.slo else None)
    return canary_analysis.Bounds(max_failure_ratio=cfg.max_failure_ratio, max_p99_ms=max_p99,
                                  max_p99_vs_stable=cfg.max_p99_vs_stable, min_requests=cfg.min_requests,
                                  max_avg_queue_ms=cfg.max_avg_queue_ms, max_avg_queue_vs_stable=cfg.max_avg_queue_vs_stable,
                                  max_shed_ratio_vs_stable=cfg.max_shed_ratio_vs_stable)


def _analyse(spec: RankingModelSpec, rollout: RolloutStatus, observed: Observed,
             attempt: str) -> canary_analysis.Judgement | None:
    """The canary's numbers since its current step's weight took effect, against the stable's
    (None: analysis off, or not read).

    The first reading of this attempt's step is kept in the record as the window's start
    (`rollout.analysisBaseline`), so a restarted operator judges the same window, and each step
    is judged on its own.
    """
    from rankops.triton.metrics import ModelCounters

    readings = observed.track_metrics
    if not spec.rollout.canary.analysis.enabled or not readings or not readings.get("canary"):
        return None
    step = rollout.step or 1
    baseline = rollout.analysis_baseline
    if not baseline or baseline.get("attempt") != attempt or (baseline.get("step") or 1) != step:
        baseline = {"attempt": attempt, "step": step, "at": iso(observed.now)}
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
    if baseline != rollout.analysis_baseline:
        rollout.analysis_baseline = baseline
    # Triton's latency summary covers about the last minute, so a pod that joined the window less
    # than that ago still reports its own cold start and warm replay in its P99: it is left out of
    # its track's P99 (its failures still count) until the minute has passed.
    young = {track: {pod for pod, at in pods.items()
                     if (observed.now - parse_time(at)).total_seconds() < P99_SUMMARY_WINDOW_S}
             for track, pods in joined.items()}
    before = {track: {pod: ModelCounters(values, {}) for pod, values in (baseline.get(track) or {}).items()}
              for track in ("canary", "stable")}
    # Each pod's window length, so counters that moved more than a Triton can are not summed (a
    # record of an operator before this one has no start time: only per-request checks then).
    started = parse_time(baseline.get("at"))
    seconds = {track: {pod: (observed.now - (parse_time(joined.get(track, {}).get(pod)) or started)).total_seconds()
                       for pod in pods if joined.get(track, {}).get(pod) or started}
               for track, pods in readings.items()}
    windows = {track: canary_analysis.track_window(before[track], readings.get(track) or {},
                                                   young.get(track, set()), observed.metrics_unread.get(track, ()),
                                                   seconds.get(track))
               for track in ("canary", "stable")}
    return canary_analysis.judge(windows["canary"], windows["stable"], analysis_bounds(spec))


def _canary_result(version: str, attempt: str, judged: canary_analysis.Judgement, now: dt.datetime,
                   step: int, steps: int, window: dict[str, Any]) -> GateResult:
    """status.gates' canary entry: the outcome and what it was judged on (both tracks' requests,
    failures and P99s, the bounds, and the window: its start and the seconds the canary served)."""
    outcome = {canary_analysis.FAIL: "fail", canary_analysis.PASS: "pass"}.get(judged.outcome, "inconclusive")
    where = f"step {step}/{steps}: " if steps > 1 else ""
    return GateResult(gate="canary", version=version, attempt=attempt, outcome=outcome, reason=judged.reason,
                      summary=where + judged.summary, metrics={**judged.metrics, "step": step, **window},
                      finished_at=iso(now))


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


def _capacity_hint(spec: RankingModelSpec) -> str:
    if spec.rollout.canary.capacity is CanaryCapacity.surge and lendable_replicas(spec) > 0:
        return ("; on a cluster without room for the canary, rollout.canary.capacity: replace lets it take a "
                "stable replica's GPU")
    return ""


def _no_verdict_result(version: str, attempt: str, now: dt.datetime, step: int, steps: int, reason: str,
                       summary: str, window: dict[str, Any]) -> GateResult:
    where = f"step {step}/{steps}: " if steps > 1 else ""
    return GateResult(gate="canary", version=version, attempt=attempt, outcome="inconclusive", reason=reason,
                      summary=where + summary, metrics={"step": step, **window}, finished_at=iso(now))


@dataclass
class _Hold:
    """What one reconcile of the Canary phase knows of its step (hold's named steps share it)."""
    s: Step
    paused: bool
    number: int                # the step held, 1-based
    steps: int
    duration: int              # its hold, in seconds
    where: str                 # " (step 2/3, 25%)", or "" for a single step
    wanted: int                # the canary pods the step's weight needs
    ready: int                 # those Ready on live nodes
    traffic_on: bool           # status already says Canary: traffic reaches the canary
    promote: str | None        # the promote annotation, when it names the target and has not acted
    judged: canary_analysis.Judgement | None
    since: dt.datetime | None = None     # when the step's weight started being served
    held: float = 0.0
    problem: str | None = None           # why no verdict can be given now

    @property
    def window(self) -> dict[str, Any]:
        return {"windowStart": iso(self.since), "windowSeconds": int(self.held)}


def hold(s: Step, paused: bool) -> None:
    """One reconcile of the Canary phase: the step's hold, judged on evidence.

    The hold counts only time in which the canary served at its step's weight (every pod of the
    step Ready on a live node, traffic on): when the canary stops serving, the step's clock and
    its analysis window start again once it is back. A step moves on with a passing verdict, or
    with analysis off (the clock alone, by the spec's choice); without a verdict its hold is
    extended up to analysis.maxExtensionSeconds, then analysis.onNoVerdict decides. A failing
    verdict rolls back at once, paused or not; `paused` makes no other move.
    """
    h = _start(s, paused)
    if _failed(h):
        return
    h.since = _serving_clock(h)
    if h.since is None:
        _wait_to_serve(h)
        return
    h.held = (s.now - h.since).total_seconds()
    h.problem = _why_no_verdict(h)
    if paused:
        return
    if h.promote:
        _promote_by_annotation(h)
    elif h.held >= h.duration:
        _hold_over(h)


def _start(s: Step, paused: bool) -> _Hold:
    spec, rollout, observed = s.spec, s.rollout, s.observed
    traffic_on = s.recorded_in(CANARY)
    number, held_step = current_step(spec, rollout)
    steps = len(spec.rollout.canary.step_plan())
    wanted = max(observed.canary_desired, canary_size(spec, s.stable_size, held_step.weight)[0])
    # Whatever part of its weight the canary serves, its failures count (judged whenever traffic is on).
    judged = _analyse(spec, rollout, observed, s.attempt) if traffic_on else None
    return _Hold(s, paused, number, steps, held_step.duration_seconds,
                 f" (step {number}/{steps}, {held_step.weight}%)" if steps > 1 else "", wanted,
                 ready_count(observed.canary_pods, s.target), traffic_on, s.asked(PROMOTE_ANNOTATION), judged)


def _failed(h: _Hold) -> bool:
    """A failing canary is rolled back at once, paused or not, at full weight or not."""
    s, rollout = h.s, h.s.rollout
    if h.judged is None or h.judged.outcome != canary_analysis.FAIL:
        return False
    since = _step_since(rollout)
    held = int((s.now - since).total_seconds()) if since else 0
    s.record_gate(_canary_result(s.target, s.attempt, h.judged, s.now, h.number, h.steps,
                                 {"windowStart": iso(since) if since else None, "windowSeconds": held}))
    s.roll_back("canary", f"canary analysis failed for {s.target}{h.where}: {h.judged.summary}; "
                          f"stable {s.stable} untouched")
    return True


def _step_since(rollout: RolloutStatus) -> dt.datetime | None:
    # (A record of an operator before steps has only canarySince.)
    return parse_time(rollout.step_since or (None if rollout.canary_down_since else rollout.canary_since))


def _serving_clock(h: _Hold) -> dt.datetime | None:
    """When the step's weight started being served: its hold starts once every pod of the step
    serves, and goes on while as many as then do (the stable scaling up, spec.autoscaling, asks
    for more canary pods, which is no lost canary); it stops, and starts again later, when not."""
    s, rollout, now = h.s, h.s.rollout, h.s.now
    started_with = rollout.step_pods if rollout.step_since else None
    serving = h.traffic_on and h.ready >= (min(h.wanted, started_with) if started_with else h.wanted)
    since = _step_since(rollout)
    if serving and since is None:   # the step's weight is served from now: its hold starts (again)
        if rollout.canary_down_since:
            s.say("Normal", "CanaryServing", f"canary {s.target} serves its weight{h.where} with "
                                             f"{h.ready}/{h.wanted} pods: its {h.duration}s hold starts")
        s.set(canary_down_since=None, hold_extended_since=None, canary_since=rollout.canary_since or iso(now),
              step_since=iso(now), step_pods=h.ready)
        return now
    if since is not None and not serving:
        held = int((now - since).total_seconds())
        stuck = rollout.unschedulable
        s.set(step_since=None, step_pods=None, analysis_baseline=None, hold_extended_since=None,
              canary_down_since=iso(now),
              message=(f"canary {s.target} stopped serving{h.where} after {held}s of its {h.duration}s hold "
                       f"({h.ready}/{h.wanted} pods Ready on live nodes" + (f"; {stuck}" if stuck else "") +
                       "): the hold and its analysis start again once every pod serves"))
        s.say("Warning", "CanaryNotServing", rollout.message)
        return None
    return since


def _wait_to_serve(h: _Hold) -> None:
    """Not serving at the step's weight (yet, or any more): it has timeoutSeconds to."""
    s, rollout = h.s, h.s.rollout
    waiting = parse_time(rollout.canary_down_since or rollout.phase_since) or s.now
    stuck = rollout.unschedulable
    if (s.now - waiting).total_seconds() > s.timeout and not h.paused:
        s.roll_back("canary", f"canary {s.target} not serving{h.where} within {s.timeout}s ({h.ready}/{h.wanted} "
                              f"pods Ready on live nodes" + (f"; {stuck}" if stuck else "") +
                              f"); stable {s.stable} untouched")
    elif stuck:
        s.set(message=f"waiting for canary {s.target}{h.where} ({h.ready}/{h.wanted} pods Ready): {stuck}"
                      + _capacity_hint(s.spec))


def _why_no_verdict(h: _Hold) -> str | None:
    """Why no verdict can be given now; a blind analysis (metrics not read) is kept in the record
    while it lasts: Degraded says it (CanaryNotJudged, with its Event, once)."""
    analysis, observed = h.s.spec.rollout.canary.analysis, h.s.observed
    blind = ("metrics not read from " + "; ".join(observed.metrics_problems)) \
        if analysis.enabled and observed.metrics_problems else None
    h.s.set(analysis_problem=blind)
    if analysis.enabled and h.judged is None:
        return blind or "no canary pod taking traffic has been read yet"
    if h.judged is not None and h.judged.outcome == canary_analysis.WAIT:
        return h.judged.summary
    return None


def _verdict(h: _Hold) -> bool:
    return h.judged is not None and h.judged.outcome == canary_analysis.PASS


def _judged_entry(h: _Hold) -> GateResult:
    s = h.s
    return _canary_result(s.target, s.attempt, h.judged, s.now, h.number, h.steps, h.window)


def _no_verdict(h: _Hold, reason: str, summary: str) -> GateResult:
    s = h.s
    return _no_verdict_result(s.target, s.attempt, s.now, h.number, h.steps, reason, summary, h.window)


def _promote_by_annotation(h: _Hold) -> None:
    s = h.s
    if _verdict(h):
        s.record_gate(_judged_entry(h))
    else:
        s.record_gate(_no_verdict(h, "PromotedByAnnotation", f"promoted by annotation {PROMOTE_ANNOTATION} "
                                  "without a verdict" + (f" ({h.problem})" if h.problem else "")))
    _advance(h, "promoted by annotation" if h.held < h.duration else f"canary held {int(h.held)}s{h.where}",
             f"; canary analysis: {h.judged.summary}" if _verdict(h) else f"; no canary verdict ({h.problem})"
             if h.problem else "")


def _hold_over(h: _Hold) -> None:
    """The step's hold is over: it moves on with analysis off or a passing verdict; without a
    verdict the hold is extended, then analysis.onNoVerdict decides."""
    s, analysis, held = h.s, h.s.spec.rollout.canary.analysis, int(h.held)
    if not analysis.enabled:
        s.record_gate(_no_verdict(h, "AnalysisDisabled",
                                  f"held {held}s with rollout.canary.analysis.enabled false: not judged"))
        _advance(h, f"canary held {held}s{h.where}", "; canary analysis off (rollout.canary.analysis.enabled false)")
        return
    if _verdict(h):
        s.record_gate(_judged_entry(h))
        _advance(h, f"canary held {held}s{h.where}", f"; canary analysis: {h.judged.summary}")
        return
    if h.held < h.duration + analysis.max_extension_seconds:
        if not s.rollout.hold_extended_since:
            s.set(hold_extended_since=iso(s.now),
                  message=f"canary {s.target}{h.where} held {held}s without a verdict ({h.problem}): hold "
                          f"extended up to {analysis.max_extension_seconds}s (analysis.maxExtensionSeconds)")
            s.say("Warning", "CanaryHoldExtended", s.rollout.message)
        return
    _no_verdict_policy(h)


def _no_verdict_policy(h: _Hold) -> None:
    s, analysis, held = h.s, h.s.spec.rollout.canary.analysis, int(h.held)
    summary = (f"no verdict after {held}s serving ({h.duration}s hold + {analysis.max_extension_seconds}s "
               f"extension): {h.problem}")
    policy = analysis.on_no_verdict
    if policy is NoVerdictPolicy.promote:
        s.record_gate(_no_verdict(h, "PromotedWithoutVerdict", f"{summary}; moved on by analysis.onNoVerdict promote"))
        _advance(h, f"canary held {held}s{h.where}", f"; no canary verdict ({h.problem}), onNoVerdict promote")
    elif policy is NoVerdictPolicy.hold:
        if not s.rollout.awaiting_decision:
            awaiting = (f"{summary}; onNoVerdict hold: annotate rankops.io/promote={s.target} "
                        f"to move on, or rankops.io/abort={s.target} to roll back")
            s.set(awaiting_decision=awaiting, message=f"canary {s.target}{h.where} awaits a decision: {awaiting}")
            s.record_gate(_no_verdict(h, "AwaitingDecision", summary))
            s.say("Warning", "CanaryAwaitingDecision", s.rollout.message)
    else:
        s.record_gate(_no_verdict(h, "NoVerdict", summary))
        s.roll_back("canary", f"canary {s.target}{h.where}: {summary}; rolled back by analysis.onNoVerdict "
                              f"rollback; stable {s.stable} untouched")


def _advance(h: _Hold, why: str, note: str) -> None:
    """The step is done: the next one, or Promoting after the last (or when promoted by hand)."""
    s, observed = h.s, h.s.observed
    s.set(awaiting_decision=None, hold_extended_since=None)
    if h.number == h.steps or h.promote:
        if h.promote:
            s.set(promoted=h.promote)
        s.move(PROMOTING, f"{why}{note}; updating stable to {s.target}")
        return
    upcoming = s.spec.rollout.canary.step_plan()[h.number]
    held_weight = current_step(s.spec, s.rollout)[1].weight
    # Serving the new weight starts its hold.
    s.set(step=h.number + 1, canary_down_since=iso(s.now), step_since=None, step_pods=None)
    if observed.track_metrics:   # the next weight takes effect now: its window starts at this reading
        s.set(analysis_baseline={"attempt": s.attempt, "step": h.number + 1, "at": iso(s.now), **{
            track: {pod: dict(c.values) for pod, c in pods.items()}
            for track, pods in observed.track_metrics.items()}})
    s.set(message=f"canary {s.target} takes {upcoming.weight}% for {upcoming.duration_seconds}s "
                  f"(step {h.number + 1}/{h.steps}) after holding {held_weight}% {int(h.held)}s{note}")
    s.say("Normal", "CanaryStepPassed", s.rollout.message)
