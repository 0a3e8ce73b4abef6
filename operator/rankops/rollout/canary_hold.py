"""The Canary phase: the canary holds each step's weight, judged on evidence (pure).

The hold counts only served time; each step moves on with a passing verdict from Triton's own
numbers (rollout/canary_analysis.py), or by an explicit policy when none can be had; a failing
verdict rolls back at once. Sizing the canary (surge beside the stable, or in replicas it lends)
is here too: the hold needs to know how many pods serve the step's weight.
"""
from __future__ import annotations

import datetime as dt
import math
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


def hold(s: Step, paused: bool) -> None:
    """One reconcile of the Canary phase: the step's hold, judged on evidence.

    The hold counts only time in which the canary served at its step's weight (every pod of the
    step Ready on a live node, traffic on): when the canary stops serving, the step's clock and
    its analysis window start again once it is back. A step moves on with a passing verdict, or
    with analysis off (the clock alone, by the spec's choice); without a verdict its hold is
    extended up to analysis.maxExtensionSeconds, then analysis.onNoVerdict decides. A failing
    verdict rolls back at once, paused or not; `paused` makes no other move.
    """
    spec, rollout, observed, stable = s.spec, s.rollout, s.observed, s.stable
    now, target, attempt, timeout = s.now, s.target, s.attempt, s.timeout
    traffic_on, promote = s.recorded_in(CANARY), s.asked(PROMOTE_ANNOTATION)
    analysis = spec.rollout.canary.analysis
    plan = spec.rollout.canary.step_plan()
    number, held_step = current_step(spec, rollout)
    steps, last = len(plan), number == len(plan)
    duration = held_step.duration_seconds
    where = f" (step {number}/{steps}, {held_step.weight}%)" if steps > 1 else ""
    wanted = max(observed.canary_desired, canary_size(spec, s.stable_size, held_step.weight)[0])
    ready = ready_count(observed.canary_pods, target)
    # A hold starts once every pod of the step serves, and goes on while as many as then do: the
    # stable scaling up (spec.autoscaling) asks for more canary pods, which is no lost canary.
    started_with = rollout.step_pods if rollout.step_since else None
    serving = traffic_on and ready >= (min(wanted, started_with) if started_with else wanted)
    # (A record of an operator before steps has only canarySince.)
    since = parse_time(rollout.step_since or (None if rollout.canary_down_since else rollout.canary_since))

    # Whatever part of its weight the canary serves, its failures count: a failing canary is rolled
    # back at once, paused or not, at full weight or not.
    judged = _analyse(spec, rollout, observed, attempt) if traffic_on else None
    if judged is not None and judged.outcome == canary_analysis.FAIL:
        held = int((now - since).total_seconds()) if since else 0
        s.record_gate(_canary_result(target, attempt, judged, now, number, steps,
                                     {"windowStart": iso(since) if since else None, "windowSeconds": held}))
        s.roll_back("canary", f"canary analysis failed for {target}{where}: {judged.summary}; stable {stable} untouched")
        return

    if serving and since is None:   # the step's weight is served from now: its hold starts (again)
        if rollout.canary_down_since:
            s.say("Normal", "CanaryServing", f"canary {target} serves its weight{where} with "
                                             f"{ready}/{wanted} pods: its {duration}s hold starts")
        s.set(canary_down_since=None, hold_extended_since=None, canary_since=rollout.canary_since or iso(now),
              step_since=iso(now), step_pods=ready)
        since = now
    elif since is not None and not serving:
        held = int((now - since).total_seconds())
        stuck = rollout.unschedulable
        s.set(step_since=None, step_pods=None, analysis_baseline=None, hold_extended_since=None,
              canary_down_since=iso(now),
              message=(f"canary {target} stopped serving{where} after {held}s of its {duration}s hold "
                       f"({ready}/{wanted} pods Ready on live nodes" + (f"; {stuck}" if stuck else "") +
                       "): the hold and its analysis start again once every pod serves"))
        s.say("Warning", "CanaryNotServing", rollout.message)
        since = None

    if since is None:   # not serving at the step's weight (yet, or any more): it has timeoutSeconds to
        waiting = parse_time(rollout.canary_down_since or rollout.phase_since) or now
        if (now - waiting).total_seconds() > timeout and not paused:
            stuck = rollout.unschedulable
            s.roll_back("canary", f"canary {target} not serving{where} within {timeout}s ({ready}/{wanted} pods "
                                  f"Ready on live nodes" + (f"; {stuck}" if stuck else "") +
                                  f"); stable {stable} untouched")
        elif rollout.unschedulable:
            s.set(message=f"waiting for canary {target}{where} ({ready}/{wanted} pods Ready): "
                          f"{rollout.unschedulable}" + _capacity_hint(spec))
        return

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
    s.set(analysis_problem=blind)

    def judged_entry() -> GateResult:
        return _canary_result(target, attempt, judged, now, number, steps, window)

    def advance(why: str, note: str) -> None:
        s.set(awaiting_decision=None, hold_extended_since=None)
        if last or promote:
            if promote:
                s.set(promoted=promote)
            s.move(PROMOTING, f"{why}{note}; updating stable to {target}")
            return
        upcoming = plan[number]
        # Serving the new weight starts its hold.
        s.set(step=number + 1, canary_down_since=iso(now), step_since=None, step_pods=None)
        if observed.track_metrics:   # the next weight takes effect now: its window starts at this reading
            s.set(analysis_baseline={"attempt": attempt, "step": number + 1, "at": iso(now), **{
                track: {pod: dict(c.values) for pod, c in pods.items()}
                for track, pods in observed.track_metrics.items()}})
        s.set(message=f"canary {target} takes {upcoming.weight}% for {upcoming.duration_seconds}s "
                      f"(step {number + 1}/{steps}) after holding {held_step.weight}% {int(held)}s{note}")
        s.say("Normal", "CanaryStepPassed", rollout.message)

    if paused:
        return
    verdict = judged is not None and judged.outcome == canary_analysis.PASS
    if promote:
        if verdict:
            s.record_gate(judged_entry())
        else:
            s.record_gate(_no_verdict_result(target, attempt, now, number, steps, "PromotedByAnnotation",
                                             f"promoted by annotation {PROMOTE_ANNOTATION} without a verdict"
                                             + (f" ({problem})" if problem else ""), window))
        advance("promoted by annotation" if held < duration else f"canary held {int(held)}s{where}",
                f"; canary analysis: {judged.summary}" if verdict else f"; no canary verdict ({problem})"
                if problem else "")
        return
    if held < duration:
        return
    if not analysis.enabled:
        s.record_gate(_no_verdict_result(target, attempt, now, number, steps, "AnalysisDisabled",
                                         f"held {int(held)}s with rollout.canary.analysis.enabled false: not judged",
                                         window))
        advance(f"canary held {int(held)}s{where}", "; canary analysis off (rollout.canary.analysis.enabled false)")
        return
    if verdict:
        s.record_gate(judged_entry())
        advance(f"canary held {int(held)}s{where}", f"; canary analysis: {judged.summary}")
        return
    # The hold is over but nothing judged the canary: extend it, then let the policy decide.
    if held < duration + analysis.max_extension_seconds:
        if not rollout.hold_extended_since:
            s.set(hold_extended_since=iso(now),
                  message=f"canary {target}{where} held {int(held)}s without a verdict ({problem}): hold "
                          f"extended up to {analysis.max_extension_seconds}s (analysis.maxExtensionSeconds)")
            s.say("Warning", "CanaryHoldExtended", rollout.message)
        return
    policy = analysis.on_no_verdict
    summary = (f"no verdict after {int(held)}s serving ({duration}s hold + {analysis.max_extension_seconds}s "
               f"extension): {problem}")
    if policy is NoVerdictPolicy.promote:
        s.record_gate(_no_verdict_result(target, attempt, now, number, steps, "PromotedWithoutVerdict",
                                         f"{summary}; moved on by analysis.onNoVerdict promote", window))
        advance(f"canary held {int(held)}s{where}", f"; no canary verdict ({problem}), onNoVerdict promote")
    elif policy is NoVerdictPolicy.hold:
        if not rollout.awaiting_decision:
            awaiting = (f"{summary}; onNoVerdict hold: annotate rankops.io/promote={target} "
                        f"to move on, or rankops.io/abort={target} to roll back")
            s.set(awaiting_decision=awaiting, message=f"canary {target}{where} awaits a decision: {awaiting}")
            s.record_gate(_no_verdict_result(target, attempt, now, number, steps, "AwaitingDecision", summary, window))
            s.say("Warning", "CanaryAwaitingDecision", rollout.message)
    else:
        s.record_gate(_no_verdict_result(target, attempt, now, number, steps, "NoVerdict", summary, window))
        s.roll_back("canary", f"canary {target}{where}: {summary}; rolled back by analysis.onNoVerdict rollback; "
                              f"stable {stable} untouched")
    return
