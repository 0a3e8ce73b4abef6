"""A shared server's pods that follow its members' load (issue 42): the pure decision.

    read (controller/servers.py, every READ_EVERY_S): each ready pod's Triton metrics page, and of it
         each held member's requests so far (success + failure: what was asked, shed ones included)
      -> member_rates(previous, reading)              each member's req/s, all pods together
      -> planner.shared_server.cards_for_load          the fewest cards on which every member's P99
                                                       holds beside the others at rate / targetUtilization
      -> autoscale.stabilize                           the HorizontalPodAutoscaler's windows

One rule sizes the server whether members arrive or the load moves: the admission's (each member
at its per-card rate under its headroom and failureTolerance rules, the device's time shared across
the members' batches), with the observed load in place of the targets. Within 10% of the load the
pods run now nothing changes (noise). A member whose needs cannot be counted (over the room, its
spec unreadable) or a pod that could not be read holds a scale-down (its load is unknown); a scale
up stands. What the next decision needs across a restart (the last reading, the windows'
recommendations) lives in status.autoscaling. No I/O; the clock is an argument.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankops import autoscale
from rankops.api.autoscaling import Recommendation
from rankops.api.sharedserver import ServerAutoscalingStatus, SharedServerSpec
from rankops.triton.metrics import implausible as implausible_move

READ_EVERY_S = 10.0                  # a server that autoscales reads its pods this often
STALE_S = 3 * READ_EVERY_S           # a pod's reading older than this starts no rate (the operator was away)
MAX_READ_PODS = 64                   # pods read per reading; the others' load is taken as the read ones' mean
TOLERANCE = autoscale.TOLERANCE
SCALED = autoscale.SCALED


@dataclass(frozen=True)
class ServerScaling:
    replicas: int
    status: ServerAutoscalingStatus
    events: tuple[tuple[str, str, str], ...] = ()   # (type, reason, message)


def reading_due(spec: SharedServerSpec, recorded: ServerAutoscalingStatus | None, now: dt.datetime) -> bool:
    """Whether this reconcile reads the pods' counters: autoscaling on, the last reading at least
    autoscale.MIN_READING_S ago (a burst of events reads once)."""
    if not spec.autoscaling.enabled:
        return False
    read_at = autoscale.read_stamp(recorded.read_at if recorded else None)
    elapsed = (now - read_at).total_seconds() if read_at is not None else None
    # a time ahead of the clock (skew, a clock set back) is not waited for
    return elapsed is None or elapsed < 0 or elapsed >= autoscale.MIN_READING_S


def pod_reading(at: dt.datetime, requests: Mapping[str, float],
                rejected: Mapping[str, float] | None = None, served: Mapping[str, float] | None = None,
                queue_us: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One pod's reading: when, each member's requests so far as its metrics page says (served +
    shed: a request refused for bad inputs costs Triton nothing and sizes nothing), of them those
    Triton shed (only members that shed any), those it served, and the time they queued (the
    member's autoscaling.maxAvgQueueMs reads it)."""
    read: dict[str, Any] = {"at": autoscale.iso_stamp(at), "requests": dict(requests)}
    shed = {m: n for m, n in (rejected or {}).items() if n}
    if shed:
        read["rejected"] = shed
    if served is not None and queue_us is not None:
        # a member that served with no queue time at all: its queue series was not on the page (a
        # Triton queues every request a little): untimed here, so no window is measured across it
        timed = [m for m in served if m in queue_us and not (served[m] > 0 and queue_us[m] <= 0)]
        if timed:
            read["served"] = {m: served[m] for m in timed}
            read["queueUs"] = {m: queue_us[m] for m in timed}
    return read


def member_rates(previous: Mapping[str, Any] | None, current: Mapping[str, Any], members: Sequence[str],
                 not_asked: int = 0) -> tuple[dict[str, autoscale.Rate] | None, list[str], list[str]]:
    """({member: its Rate}, or None when no pod was read both times within STALE_S; the pods whose
    counters moved more than a Triton pod can serve, left out and named; the members some pod serving
    them could not count (new since the last reading, a restarted Triton, the member just loaded
    there: its first counters hold its warm-up), whose rate is a guess). A member's rate is what the
    pods counted for it carry, scaled to every pod that lists it now and the ready pods not asked
    (past MAX_READ_PODS): a pod not counted carries the mean of those counted, never nothing. A member
    no pod counted is not in the rates."""
    implausible: list[str] = []
    previous = {pod: read for pod, read in (previous or {}).items()
                if pod in current and _age_s(read, current[pod]) is not None
                and 0 < _age_s(read, current[pod]) <= STALE_S}
    if not previous:
        return None, [], []
    for pod in list(previous):      # one Triton serves every member: its sum is bounded as one pod's
        moved = sum(max(0.0, n - b) for m in members
                    if (n := _request_count(current[pod], m)) is not None and (b := _request_count(previous[pod], m))
                    is not None)
        wrong = implausible_move({"success": moved}, _age_s(previous[pod], current[pod]))
        if wrong:
            implausible.append(f"{pod}: {wrong} (all members)")
            del previous[pod]
    rates: dict[str, autoscale.Rate] = {}
    guessed: list[str] = []
    for member in members:
        now = _counts(current, member)
        seen = autoscale.rate(_counts(previous, member), now, implausible)
        if seen.qps is None:            # no pod counted it: no rate (not 0)
            if now:
                guessed.append(member)
            continue
        serving = len(now) + not_asked
        if serving > seen.pods:
            if len(now) > seen.pods:
                guessed.append(member)
            seen = seen._replace(qps=seen.qps * serving / seen.pods)
        rates[member] = seen
    return rates, sorted(set(implausible)), guessed


def _request_count(read: Mapping[str, Any], member: str) -> float | None:
    return autoscale.counter_value((read.get("requests") or {}).get(member)) if isinstance(read.get("requests"), dict) else None


def _age_s(before: Any, after: Any) -> float | None:
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    then, at = autoscale.read_stamp(before.get("at")), autoscale.read_stamp(after.get("at"))
    return (at - then).total_seconds() if then is not None and at is not None else None


def _counts(reading: Mapping[str, Any] | None, member: str) -> dict[str, dict[str, Any]]:
    """{pod: autoscale.pod_reading} of one member, for autoscale.rate."""
    out = {}
    for pod, read in (reading or {}).items():
        if not isinstance(read, dict) or not isinstance(read.get("requests"), dict):
            continue
        at, n = autoscale.read_stamp(read.get("at")), autoscale.counter_value(read["requests"].get(member))
        shed = read.get("rejected") if isinstance(read.get("rejected"), dict) else {}
        rejected = autoscale.counter_value(shed.get(member, 0.0))
        if at is not None and n is not None and rejected is not None:
            out[pod] = autoscale.pod_reading(n, 0.0, at, rejected=min(rejected, n))
    return out


# A member's mean queue time is judged over at least this many requests served (all pods together).
MIN_QUEUE_SAMPLE = 100


def queue_ms(previous: Mapping[str, Any] | None, current: Mapping[str, Any], member: str) -> tuple[float | None, float]:
    """(The member's mean time in Triton's queue, ms, over the requests its pods served between two
    readings, or None; those requests). Only pods whose both readings hold its served and queue counters,
    moved forward, count; a pod's queue time per request served is at most the window's length (a
    request served in it queued within it, or just before: a counter that jumped is no reading)."""
    queued = served = 0.0
    for pod, now_read in current.items():
        before = (previous or {}).get(pod)
        seconds = _age_s(before, now_read)
        if seconds is None or not 0 < seconds <= STALE_S:
            continue
        values = [autoscale.counter_value(read[key].get(member)) if isinstance(read.get(key), dict) else None
                  for read in (before, now_read) for key in ("served", "queueUs")]
        if None in values:
            continue
        moved_served, moved_queue = values[2] - values[0], values[3] - values[1]
        if moved_served <= 0 or moved_queue < 0 or moved_queue > moved_served * (seconds + STALE_S) * 1e6:
            continue
        queued += moved_queue
        served += moved_served
    return (queued / served / 1000.0 if served else None), served


def step(spec: SharedServerSpec, recorded: ServerAutoscalingStatus | None, reading: Mapping[str, Any] | None,
         members: Sequence[Any], start: int, now: dt.datetime, *, previous: Mapping[str, Any] | None = None,
         problems: Sequence[str] = (), uncounted: Sequence[str] = (), not_asked: int = 0,
         max_queue_ms: Mapping[str, float] | None = None) -> ServerScaling | None:
    """The pods to run and status.autoscaling for this reconcile; None without autoscaling.
    `recorded`: status.autoscaling as read; `reading`: this reconcile's {pod: pod_reading} (None: not
    read now) and `previous` the one before it (the operator's memory: a restart takes one reading
    before it decides again); `members`: the admitted members as planner.pack.ModelToPack; `start`:
    the pods running (or the admission's cards) when nothing was decided yet; `problems`: pods asked
    and not read; `uncounted`: held members whose load this rule cannot size (over the room, frozen,
    no plan): both hold a scale-down, and Triton shedding an uncounted member's requests adds a pod as
    for a counted one; `max_queue_ms`: member -> its autoscaling.maxAvgQueueMs (its
    requests' mean time in Triton's queue over it, over at least MIN_QUEUE_SAMPLE requests: one pod
    more than the rule asks, never more than one: a tenant's bound does not size everyone's pods)."""
    from rankops.planner.pack import PackError
    from rankops.planner.shared_server import server_card

    a = spec.autoscaling
    if not a.enabled:
        return None
    b = autoscale.Bounds(a.min_replicas, spec.max_replicas, a.target_utilization, 0,
                         a.scale_up_stabilization_seconds, a.scale_down_stabilization_seconds)
    decided = recorded.desired_replicas if recorded else None
    current = autoscale.clamp(decided if decided is not None else max(1, start), b)
    history = tuple((t, r.replicas) for r in (recorded.recommendations if recorded else [])
                    if (t := autoscale.read_stamp(r.at)) is not None)
    kept: dict[str, Any] = {"read_at": recorded.read_at if recorded else None,
                            "last_scale_time": recorded.last_scale_time if recorded else None,
                            "observed_qps": dict(recorded.observed_qps) if recorded else {}}
    if reading is None and recorded is not None and decided == current:     # not read now: the decision stands
        message = recorded.message or ""
        if problems:
            message = message.split(autoscale.NOT_READ)[0] + autoscale.NOT_READ + "; ".join(problems[:3])
        return ServerScaling(current, recorded.model_copy(update={"message": message[:1000]}))
    rates, implausible, guessed = (None, [], []) if reading is None else \
        member_rates(previous, reading, [m.name for m in members], not_asked)
    if reading is not None:
        kept["read_at"] = autoscale.iso_stamp(now)
    problems = [*problems, *implausible]
    holds = [*uncounted, *(f"{m} (a pod serving it not counted yet)" for m in guessed)]
    need: int | None = current
    if rates is None:
        reason = "NoReading"
        message = (f"no request rate yet (a rate needs two readings of a ready pod at most {STALE_S:g} s apart): "
                   f"pods kept at {current}")
    else:
        kept["observed_qps"] = {m: round(r.qps, 3) for m, r in rates.items()}
        # a member no pod counted yet (just admitted) is sized at its target, as its admission was
        unknown = {m.name: float(m.inputs.target_qps or 0.0) for m in members if m.name not in rates}
        loads = {m: q / a.target_utilization for m, q in {**kept["observed_qps"], **unknown}.items()}
        loads_said = ", ".join([*(f"{m} {r.qps:.1f}" for m, r in sorted(rates.items())),
                                *(f"{m} no rate yet (its target {r:g})" for m, r in sorted(unknown.items()))])
        try:
            need, why = _need(members, server_card(spec), loads, current)
        except PackError as exc:      # never for a member the admission placed (the same plan alone); said if so
            need, reason, message = current, "CannotCount", f"req/s {loads_said}: pods kept at {current}: {exc}"
        else:
            message = f"req/s {loads_said}: " + (why if need is None else f"every member's P99 holds on {need} pod(s) "
                                                 f"at {a.target_utilization:.0%} of the pods' load")
            # Triton shed more of a member's requests than its P99 lets be late: the pods do not hold
            # it, whatever the rule predicts (an optimistic profile): one pod more than the rule asks
            # A member this rule cannot size (frozen, over the room, no plan) counts here too: its load is
            # not sized, but Triton shedding its requests says the pods do not hold it
            shedding = shed_over(previous, reading, [*(m.name for m in members), *uncounted], not_asked)
            bounds = max_queue_ms or {}
            queues = {m: queue_ms(previous, reading, m) for m in sorted(bounds) if m in rates}
            queueing = {m: q for m, (q, n) in queues.items() if q is not None and n >= MIN_QUEUE_SAMPLE
                        and q > bounds[m]}
            reason = ""
            if shedding and need is not None and need <= current:
                need = current + 1
                message += ("; Triton shed " + ", ".join(f"{r:.1%} of {m}'s requests" for m, r in shedding.items())
                            + f" (over {autoscale.SHED_RATIO_HIGH:.0%}): one pod more than the {current} running")
                reason = "Shedding"
            elif queueing and need is not None and need <= current:
                message += ("; " + "; ".join(f"{m}'s requests queued {q:.1f} ms on average (over its "
                                             f"autoscaling.maxAvgQueueMs {bounds[m]:g})" for m, q in queueing.items())
                            + f": one pod more than the {need} the rule asks")
                need += 1
                reason = "Queueing"
    recommended = autoscale.clamp(spec.max_replicas if need is None else need, b)
    desired, history = autoscale.stabilize(now, current, recommended, b, history)
    moved = autoscale.window_reason(desired, current, recommended, b)
    if reason in ("NoReading", "CannotCount"):
        pass
    elif moved is not None:
        reason = reason if moved[0] == "ScaledUp" and reason in ("Shedding", "Queueing") else moved[0]
        message += moved[1]
    elif need is None or need > b.max_replicas:
        reason = "AtMaxReplicas"
        message += f"; capped at maxReplicas {b.max_replicas}"
    elif need < b.min_replicas:
        reason = "AtMinReplicas"
        message += f"; kept at autoscaling.minReplicas {b.min_replicas}"
    else:
        reason = "Queueing" if reason == "Queueing" else "WithinTarget"     # the pod it holds, said
    if desired < current and (problems or holds):
        held = [f"{len(problems)} pod(s) not read"] if problems else []
        held += [f"{', '.join(holds)}: load not counted now"] if holds else []
        message += f"; scale-down to {desired} held at {current}: {'; '.join(held)}"
        desired, reason = current, "ScaleDownHeld"
    if problems:
        message += autoscale.NOT_READ + "; ".join(problems[:3])
    events: tuple[tuple[str, str, str], ...] = ()
    before = decided if decided is not None else max(1, start)
    if desired != before:
        kept["last_scale_time"] = autoscale.iso_stamp(now)
        events = (("Normal", SCALED, f"server pods {before} -> {desired}: {message}"[:1000]),)
    return ServerScaling(desired, ServerAutoscalingStatus(
        desired_replicas=desired, reason=reason, message=message[:1000], **kept,
        recommendations=[Recommendation(at=autoscale.iso_stamp(t), replicas=r) for t, r in history]), events)


def _need(members: Sequence[Any], card: Any, loads: Mapping[str, float], current: int) -> tuple[int | None, str]:
    """(the pods the loads need, or None past card.max_cards, why); the pods running now when the
    loads are within TOLERANCE of what they hold (noise): down only if 10% more would still hold on
    fewer, up only if 10% less would not hold on these."""
    from rankops.planner.shared_server import cards_for_load, holds_on

    need, why = cards_for_load(members, card, loads, hint=current)
    if need is not None and need < current and not holds_on(
            members, card, {m: x * (1 + TOLERANCE) for m, x in loads.items()}, current - 1):
        return current, why
    if need is not None and need > current and holds_on(
            members, card, {m: x * (1 - TOLERANCE) for m, x in loads.items()}, current):
        return current, why
    return need, why


def shed_over(previous: Mapping[str, Any] | None, reading: Mapping[str, Any] | None, members: Sequence[str],
              not_asked: int = 0) -> dict[str, float]:
    """member -> the share of its requests Triton shed between two readings, for those over
    autoscale.SHED_RATIO_HIGH (the pods do not hold them, whatever a profile predicts)."""
    rates = member_rates(previous, reading, list(dict.fromkeys(members)), not_asked)[0] if reading else None
    return {m: r.shed_ratio for m, r in sorted((rates or {}).items())
            if r.shed_ratio is not None and r.shed_ratio > autoscale.SHED_RATIO_HIGH}


def hold(spec: SharedServerSpec, recorded: ServerAutoscalingStatus | None, replicas: int, why: str,
         shedding: Mapping[str, float] | None = None) -> ServerScaling:
    """The pods kept at `replicas` when nothing of the load can be sized (no held member counted); one
    more (up to maxReplicas) while Triton sheds a member's requests (`shedding`: shed_over)."""
    kept = recorded.model_copy() if recorded else ServerAutoscalingStatus()
    message, reason, desired = f"pods kept at {replicas}: {why}", "CannotCount", replicas
    if shedding and replicas < spec.max_replicas:
        desired, reason = replicas + 1, "Shedding"
        message = ("Triton shed " + ", ".join(f"{r:.1%} of {m}'s requests" for m, r in shedding.items())
                   + f" (over {autoscale.SHED_RATIO_HIGH:.0%}): one pod more than the {replicas} running; {why}")
    return ServerScaling(desired, kept.model_copy(update={"desired_replicas": desired, "reason": reason,
                                                          "message": message[:1000]}))
