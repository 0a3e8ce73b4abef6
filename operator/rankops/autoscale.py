"""Replicas that follow the load: the pure decision of spec.autoscaling (mode rankops).

    observe (controller/models.py: each serving pod's Triton counters, every --interval)
      -> rate(previous reading, this reading)          requests/s and queue time
      -> decide(Inputs)                                  desired replicas and why (HPA's algorithm)
      -> step(...)                                       the replicas modelplan serves, status.autoscaling, Events

The rate is the difference of Triton's own counters (nv_inference_request_success + failure,
nv_inference_queue_duration_us) between two readings of the same pod, summed over pods: no
metrics server. The replicas a rate needs are ceil(rate / (capacity per replica x
targetUtilization)) + planning.failureTolerance, within [minReplicas, maxReplicas]; within 10% of
the current count nothing changes (noise). Like the HorizontalPodAutoscaler's behavior, a scale up
goes to the lowest recommendation of the scale-up window (0 s: at once) and a scale down to the
highest of the scale-down window (300 s), so what must survive a restart, the last reading and the
recommendations of the windows, lives in status.autoscaling. No I/O, the clock is an argument.
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from rankops.api.autoscaling import AutoscalingStatus, Recommendation
from rankops.api.planning import PlanStatus
from rankops.api.rankingmodel import RankingModelSpec
from rankops.triton.metrics import implausible as implausible_move

TOLERANCE = 0.1          # |need / serving - 1| within this: no change (HPA's default tolerance)
MIN_READING_S = 5.0      # readings closer than this are not taken (a burst of events reads once)
MAX_RECOMMENDATIONS = 200
SCALED = "Scaled"        # the Event of a change
NOT_READ = "; not read: "   # status.autoscaling.message's list of the serving pods not read


@dataclass(frozen=True)
class Bounds:
    min_replicas: int
    max_replicas: int
    target_utilization: float
    failure_tolerance: int
    up_window_s: float = 0.0
    down_window_s: float = 300.0
    max_avg_queue_ms: float | None = None


@dataclass(frozen=True)
class Inputs:
    now: dt.datetime
    current: int                                   # the stable replicas decided last (or the start)
    capacity_qps: float                            # requests/s one replica sustains within the P99 budget
    bounds: Bounds
    rate_qps: float | None = None                  # None: no rate yet (first reading, no pod read)
    avg_queue_ms: float | None = None
    history: tuple[tuple[dt.datetime, int], ...] = ()   # recommendations, oldest first


@dataclass(frozen=True)
class Outcome:
    desired: int
    recommended: int                               # what the load needs now (before the windows)
    reason: str
    message: str
    history: tuple[tuple[dt.datetime, int], ...] = field(default_factory=tuple)


def clamp(replicas: int, bounds: Bounds) -> int:
    return max(bounds.min_replicas, min(bounds.max_replicas, replicas))


def needed(rate_qps: float, capacity_qps: float, target: float, serving: int) -> int:
    """Replicas that carry `rate_qps` at `target` of `capacity_qps` each; `serving` (the replicas
    carrying load now, the spare ones not counted) is kept when it is within TOLERANCE."""
    per_replica = capacity_qps * target
    raw = rate_qps / per_replica if per_replica > 0 else 0.0
    if serving > 0 and abs(raw / serving - 1) <= TOLERANCE:
        return serving
    return max(0, math.ceil(raw - 1e-9))


def decide(inputs: Inputs) -> Outcome:
    """The stable replicas for the load now, and why (pure)."""
    b, now, current = inputs.bounds, inputs.now, clamp(inputs.current, inputs.bounds)
    if inputs.rate_qps is None:
        return Outcome(current, current, "NoReading", "no request rate yet (a rate needs two readings of a "
                       "serving pod): replicas kept", _pruned(inputs.history, now, b))
    serving = max(0, inputs.current - b.failure_tolerance)
    need = needed(inputs.rate_qps, inputs.capacity_qps, b.target_utilization, serving)
    per_replica = inputs.capacity_qps * b.target_utilization
    why = (f"{inputs.rate_qps:.1f} req/s needs {need} replica(s) at {b.target_utilization:.0%} of "
           f"{inputs.capacity_qps:g} req/s each, + {b.failure_tolerance} spare (planning.failureTolerance)")
    queue_high = b.max_avg_queue_ms is not None and inputs.avg_queue_ms is not None \
        and inputs.avg_queue_ms > b.max_avg_queue_ms
    if queue_high and need <= serving:
        need = serving + 1
        why = (f"average queue time {inputs.avg_queue_ms:.1f} ms over autoscaling.maxAvgQueueMs "
               f"{b.max_avg_queue_ms:g} ms at {inputs.rate_qps:.1f} req/s: one replica more than the "
               f"{serving} carrying load")
    recommended = clamp(need + b.failure_tolerance, b)
    history = _pruned((*inputs.history, (now, recommended)), now, b)
    up_limit = min(r for t, r in history if _within(t, now, b.up_window_s))
    down_limit = max(r for t, r in history if _within(t, now, b.down_window_s))
    desired = current
    if desired < up_limit:
        desired = up_limit
    if desired > down_limit:
        desired = down_limit
    desired = clamp(desired, b)
    if desired > current:
        reason = "QueueTimeHigh" if queue_high else "ScaledUp"
    elif desired < current:
        reason = "ScaledDown"
    elif recommended < current:
        reason = "ScaleDownStabilizing"
        why += (f"; kept at {current}, the most recommended over the last {b.down_window_s:g} s "
                "(autoscaling.scaleDownStabilizationSeconds)")
    elif recommended > current:
        reason = "ScaleUpStabilizing"
        why += (f"; kept at {current}, the fewest recommended over the last {b.up_window_s:g} s "
                "(autoscaling.scaleUpStabilizationSeconds)")
    elif need + b.failure_tolerance > b.max_replicas:
        reason = "AtMaxReplicas"
        why += f"; capped at autoscaling.maxReplicas {b.max_replicas}"
    elif need + b.failure_tolerance < b.min_replicas:
        reason = "AtMinReplicas"
        why += f"; kept at autoscaling.minReplicas {b.min_replicas}"
    else:
        reason = "WithinTarget"
    if per_replica > 0 and desired > 0:
        why += f"; {inputs.rate_qps / max(1, desired - b.failure_tolerance) / inputs.capacity_qps:.0%} of capacity per serving replica"
    return Outcome(desired, recommended, reason, why, history)


def _within(at: dt.datetime, now: dt.datetime, window_s: float) -> bool:
    return (now - at).total_seconds() <= window_s


def _pruned(history: tuple[tuple[dt.datetime, int], ...] | list, now: dt.datetime,
            b: Bounds) -> tuple[tuple[dt.datetime, int], ...]:
    """The recommendations the windows still need, oldest first; a run of equal ones is kept once,
    at its latest time (all a window's min or max needs)."""
    keep = max(b.up_window_s, b.down_window_s)
    out: list[tuple[dt.datetime, int]] = []
    for at, replicas in sorted(history, key=lambda h: h[0]):
        if (now - at).total_seconds() > keep:
            continue
        if out and out[-1][1] == replicas:
            out[-1] = (at, replicas)
        else:
            out.append((at, replicas))
    return tuple(out[-MAX_RECOMMENDATIONS:])


# -- counters to a rate ---------------------------------------------------------------------------

def pod_reading(requests: float, queue_us: float, at: dt.datetime) -> dict[str, Any]:
    return {"requests": requests, "queueUs": queue_us, "at": _iso(at)}


def load_reading(snapshot: Any, recorded: AutoscalingStatus | None) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """({pod: pod_reading} of both tracks' serving pods, or None unless every one has an answer
    newer than the recorded reading), and the pods not read. `snapshot`:
    controller/pod_metrics.Snapshot."""
    previous = (recorded.reading if recorded else None) or {}
    reading = {pod: pod_reading(c.values.get("success", 0.0) + c.values.get("failure", 0.0),
                                c.values.get("queue_us", 0.0), at)
               for pods in snapshot.readings.values() for pod, (c, at) in pods.items()}
    # Every pod's answer newer than the one counted last: a round half in (reads are off the
    # reconcile) would count some pods' load and silently not the others'.
    fresh = bool(reading) and all(
        not isinstance(previous.get(pod), dict) or _time(previous[pod].get("at")) is None
        or _time(previous[pod].get("at")) < _time(now["at"]) for pod, now in reading.items())
    return (reading if fresh else None), (*snapshot.not_read("canary"), *snapshot.not_read("stable"))


def _number(value: Any) -> float | None:
    """A stored counter as a finite, non-negative number (None: not one, e.g. null from a NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def rate(previous: dict[str, Any] | None, current: dict[str, Any], implausible: list[str] | None = None
         ) -> tuple[float | None, float | None, int]:
    """(requests/s, average queue ms, pods counted) between two readings ({pod: pod_reading}):
    each pod read both times counts its own difference over its own interval; a pod new in this
    reading (its counters include its warm-up), restarted (counters went down), or whose stored
    reading is not a number counts from the next one. A pod whose counters moved more than a
    Triton pod can serve (triton/metrics.implausible) is left out and named in
    `implausible`. None: no pod was read twice."""
    if not previous:
        return None, None, 0
    total_rate, requests, queue_us, counted = 0.0, 0.0, 0.0, 0
    for pod, now_read in current.items():
        before = previous.get(pod)
        if not isinstance(before, dict):
            continue
        then, at = _time(before.get("at")), _time(now_read.get("at"))
        counters = [_number(now_read.get("requests")), _number(before.get("requests")),
                    _number(now_read.get("queueUs", 0)), _number(before.get("queueUs", 0))]
        if then is None or at is None or any(c is None for c in counters):
            continue
        seconds = (at - then).total_seconds()
        done, waited = counters[0] - counters[1], counters[2] - counters[3]
        if seconds <= 0 or done < 0 or waited < 0:
            continue
        wrong = implausible_move({"success": done, "queue_us": waited}, seconds)
        if wrong:
            if implausible is not None:
                implausible.append(f"{pod}: {wrong}")
            continue
        total_rate += done / seconds
        requests, queue_us, counted = requests + done, queue_us + waited, counted + 1
    if not counted:
        return None, None, 0
    return total_rate, (queue_us / requests / 1000.0 if requests else 0.0), counted


def reading_due(spec: RankingModelSpec, recorded: AutoscalingStatus | None, now: dt.datetime) -> bool:
    """Whether this reconcile reads the serving pods' counters: autoscaling by rankops, and the
    last reading at least MIN_READING_S ago."""
    if not spec.autoscaling.by_rankops:
        return False
    read_at = _time(recorded.read_at if recorded else None)
    return read_at is None or (now - read_at).total_seconds() >= MIN_READING_S


# -- one reconcile ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scaling:
    replicas: int                                 # the stable replicas the model serves now
    status: AutoscalingStatus                     # status.autoscaling
    events: tuple[tuple[str, str, str], ...] = ()   # (type, reason, message)
    external: bool = False                        # the stable Deployment is applied without spec.replicas


def capacity(spec: RankingModelSpec, plan: Any = None, plan_status: PlanStatus | None = None
             ) -> tuple[float | None, str | None]:
    """(requests/s one replica sustains within the P99 budget, where it comes from): the spec's
    autoscaling.capacityPerReplicaQps, or the plan's sustainable rate per GPU x gpusPerReplica."""
    if spec.autoscaling.capacity_per_replica_qps is not None:
        return spec.autoscaling.capacity_per_replica_qps, "spec"
    per_gpu = getattr(plan, "qps_per_gpu", None)
    if per_gpu is None and plan_status:
        per_gpu = plan_status.qps_per_gpu
    if per_gpu:
        return float(per_gpu) * spec.gpus_per_replica, "plan"
    return None, None


def bounds_of(spec: RankingModelSpec, failure_tolerance: int) -> Bounds:
    a = spec.autoscaling
    return Bounds(a.min_replicas, a.max_replicas or a.min_replicas, a.target_utilization, failure_tolerance,
                  a.scale_up_stabilization_seconds, a.scale_down_stabilization_seconds, a.max_avg_queue_ms)


def step(spec: RankingModelSpec, recorded: AutoscalingStatus | None, reading: dict[str, Any] | None,
         start_replicas: int, failure_tolerance: int, now: dt.datetime, *, plan: Any = None,
         plan_status: PlanStatus | None = None, deployment_replicas: int | None = None,
         external_name: str | None = None, problems: tuple[str, ...] = ()) -> Scaling | None:
    """The replicas to serve and status.autoscaling for this reconcile; None without autoscaling.
    `recorded`: status.autoscaling as read; `reading`: this reconcile's {pod: pod_reading} (None: not
    read now); `start_replicas`: the spec's or the plan's count; `deployment_replicas`: the stable
    Deployment's spec.replicas (mode external: the user's autoscaler's); `problems`: pods that
    could not be read."""
    scaling = spec.autoscaling
    if not scaling.enabled:
        return None
    recorded = recorded if recorded is not None and recorded.mode == scaling.mode.value else None
    if scaling.external:
        replicas = deployment_replicas if deployment_replicas is not None else start_replicas
        message = (f"{external_name} owns the stable Deployment's replicas ({replicas} now): rankops applies it "
                   "without spec.replicas" if external_name else
                   "no HorizontalPodAutoscaler targets the stable Deployment yet: rankops applies it without "
                   f"spec.replicas, which stay at {replicas}")
        return Scaling(replicas, AutoscalingStatus(mode="external", external=external_name, desired_replicas=replicas,
                                                   reason="External", message=message), external=True)

    b = bounds_of(spec, failure_tolerance)
    cap, source = capacity(spec, plan, plan_status)
    decided = recorded.desired_replicas if recorded else None
    # First decision: from what runs (a model switched on, or from mode external), else the spec's or plan's.
    start = deployment_replicas if deployment_replicas is not None else start_replicas
    current = clamp(decided if decided is not None else start, b)
    history = tuple((t, r.replicas) for r in (recorded.recommendations if recorded else [])
                    if (t := _time(r.at)) is not None)
    kept = {k: getattr(recorded, k) if recorded else None
            for k in ("observed_qps", "avg_queue_ms", "reading", "read_at", "last_scale_time")}
    if cap is None:   # never expected: the spec's validation asks for capacityPerReplicaQps first
        return Scaling(current, AutoscalingStatus(
            mode="rankops", desired_replicas=current, reason="NoCapacity",
            message="no capacity per replica: set autoscaling.capacityPerReplicaQps", **kept))
    if reading is None:   # not read in this reconcile: what was decided stands (within the bounds)
        if recorded is not None and decided == current:
            update: dict[str, Any] = {"capacity_per_replica_qps": round(cap, 3), "capacity_source": source,
                                      "desired_replicas": current}
            if problems:   # a read was due and nothing new came: say which pods, and why
                base = (recorded.message or "").split(NOT_READ)[0]
                update["message"] = (base + f"{NOT_READ}{'; '.join(problems[:3])}")[:1000]
            return Scaling(current, recorded.model_copy(update=update))
        outcome = decide(Inputs(now, current, cap, b, history=history))
    else:
        implausible: list[str] = []
        qps, queue_ms, _ = rate(recorded.reading if recorded else None, reading, implausible)
        outcome = decide(Inputs(now, current, cap, b, qps, queue_ms, history))
        problems = (*problems, *implausible)
        kept.update(observed_qps=None if qps is None else round(qps, 3),
                    avg_queue_ms=None if queue_ms is None else round(queue_ms, 3), reading=reading, read_at=_iso(now))
    if problems and outcome.desired < current:
        # An unread pod may carry the load that keeps the replicas (the HPA counts it at 100% of
        # target when scaling down): no scale-down on what could not be read. A scale-up stands
        # (unread pods counted no load: the safe side that way).
        outcome = Outcome(current, outcome.recommended, "ScaleDownHeld",
                          f"{outcome.message}; scale-down to {outcome.desired} held at {current}: "
                          f"{len(problems)} serving pod(s) not read", outcome.history)
    message = outcome.message + (f"{NOT_READ}{'; '.join(problems[:3])}" if problems else "")
    events: tuple[tuple[str, str, str], ...] = ()
    before = decided if decided is not None else start
    if outcome.desired != before:
        kept["last_scale_time"] = _iso(now)
        events = (("Normal", SCALED, f"stable replicas {before} -> {outcome.desired}: {outcome.message}"),)
    return Scaling(outcome.desired, AutoscalingStatus(
        mode="rankops", capacity_per_replica_qps=round(cap, 3), capacity_source=source,
        desired_replicas=outcome.desired, reason=outcome.reason, message=message[:1000], **kept,
        recommendations=[Recommendation(at=_iso(t), replicas=r) for t, r in outcome.history]), events)


def without_replicas(objects: list[dict[str, Any]], deployment: str) -> list[dict[str, Any]]:
    """`objects` with the stable Deployment (named `deployment`) applied without spec.replicas
    (autoscaling mode external): server-side apply then leaves that field to its other manager,
    the HorizontalPodAutoscaler's (or KEDA's) scale writes."""
    out = []
    for obj in objects:
        if obj.get("kind") == "Deployment" and obj["metadata"]["name"] == deployment:
            obj = {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "replicas"}}
        out.append(obj)
    return out


def _iso(at: dt.datetime) -> str:
    return at.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)
