"""Replicas that follow the load: the pure decision of spec.autoscaling (mode rankops).

    observe (controller/models.py: each serving pod's Triton counters, every --interval)
      -> rate(previous reading, this reading)          requests/s and queue time
      -> decide(Inputs)                                  desired replicas and why (HPA's algorithm)
      -> step(...)                                       the replicas modelplan serves, status.autoscaling, Events

The rate is the difference of Triton's own counters (nv_inference_request_success + failure,
nv_inference_queue_duration_us) between two readings of the same pod, summed over pods: no
metrics server. Requests Triton shed (failure reason REJECTED) are in that rate: they were asked
for, and a replica count sized on the served rate alone would never grow out of shedding. When the
shed ratio passes SHED_RATIO_HIGH with the rate saying the replicas suffice, one more is added
(reason Shedding). The capacity per replica is the plan's x a correction that the stable replicas'
observed latency keeps (planner/correction.py, status.autoscaling.capacityCorrection). The
replicas a rate needs are ceil(rate / (capacity per replica x targetUtilization)) +
planning.failureTolerance, within [minReplicas, maxReplicas]; within 10% of the current count
nothing changes (noise). Like the HorizontalPodAutoscaler's behavior, a scale up goes to the
lowest recommendation of the scale-up window (0 s: at once) and a scale down to the highest of the
scale-down window (300 s), so what must survive a restart, the last reading and the
recommendations of the windows, lives in status.autoscaling. No I/O, the clock is an argument.
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rankops.api.autoscaling import AutoscalingStatus, CapacityCorrection, Recommendation
from rankops.api.planning import PlanStatus
from rankops.api.rankingmodel import RankingModelSpec
from rankops.planner import correction
from rankops.triton.metrics import implausible as implausible_move

TOLERANCE = 0.1          # |need / serving - 1| within this: no change (HPA's default tolerance)
MIN_READING_S = 5.0      # readings closer than this are not taken (a burst of events reads once)
MAX_RECOMMENDATIONS = 200
SCALED = "Scaled"        # the Event of a change
NOT_READ = "; not read: "   # status.autoscaling.message's list of the serving pods not read
# Shed share above which one more replica is added though the rate says the replicas suffice. The
# queue policy sheds only what would miss the P99 budget, and a P99 lets 1% of requests be late:
# shedding more than that is the replicas not holding the budget, whatever the capacity says.
SHED_RATIO_HIGH = 0.01


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
    shed_ratio: float | None = None                # share of rate_qps Triton rejected


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
    shedding = inputs.shed_ratio is not None and inputs.shed_ratio > SHED_RATIO_HIGH
    if queue_high and need <= serving:
        need = serving + 1
        why = (f"average queue time {inputs.avg_queue_ms:.1f} ms over autoscaling.maxAvgQueueMs "
               f"{b.max_avg_queue_ms:g} ms at {inputs.rate_qps:.1f} req/s: one replica more than the "
               f"{serving} carrying load")
    elif shedding and need <= serving:
        need = serving + 1
        why = (f"Triton shed {inputs.shed_ratio:.1%} of {inputs.rate_qps:.1f} req/s (over {SHED_RATIO_HIGH:.0%}): "
               f"one replica more than the {serving} carrying load")
    shed_up = shedding and not queue_high and need == serving + 1
    recommended = clamp(need + b.failure_tolerance, b)
    desired, history = stabilize(now, current, recommended, b, inputs.history)
    moved = window_reason(desired, current, recommended, b)
    if moved is not None:
        reason, note = moved
        why += note
        if reason == "ScaledUp":
            reason = "QueueTimeHigh" if queue_high else "Shedding" if shed_up else reason
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


def stabilize(now: dt.datetime, current: int, recommended: int, b: Bounds,
              history: tuple[tuple[dt.datetime, int], ...] | list) -> tuple[int, tuple[tuple[dt.datetime, int], ...]]:
    """(the replicas to run, the windows' history with `recommended` added), as the HPA's behavior:
    up only to the fewest recommended over the scale-up window, down only to the most recommended
    over the scale-down window, within the bounds."""
    history = _pruned((*history, (now, recommended)), now, b)
    up_limit = min(r for t, r in history if _within(t, now, b.up_window_s))
    down_limit = max(r for t, r in history if _within(t, now, b.down_window_s))
    desired = current
    if desired < up_limit:
        desired = up_limit
    if desired > down_limit:
        desired = down_limit
    return clamp(desired, b), history


def window_reason(desired: int, current: int, recommended: int, b: Bounds) -> tuple[str, str] | None:
    """(reason, what to add to the message) when the count moved or a window held it; None when
    the recommendation is the count now (the caller says why)."""
    if desired > current:
        return "ScaledUp", ""
    if desired < current:
        return "ScaledDown", ""
    if recommended < current:
        return "ScaleDownStabilizing", (f"; kept at {current}, the most recommended over the last {b.down_window_s:g} s "
                                        "(autoscaling.scaleDownStabilizationSeconds)")
    if recommended > current:
        return "ScaleUpStabilizing", (f"; kept at {current}, the fewest recommended over the last {b.up_window_s:g} s "
                                      "(autoscaling.scaleUpStabilizationSeconds)")
    return None


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

def pod_reading(requests: float, queue_us: float, at: dt.datetime, *, rejected: float = 0.0,
                served: float | None = None, request_us: float = 0.0, compute_us: float = 0.0,
                track: str = "stable") -> dict[str, Any]:
    """One pod's counters: requests asked (success + failure), of them rejected (shed) and served
    (success), and the time Triton spent on the served ones (queue, request, compute)."""
    return {"requests": requests, "rejected": rejected, "served": requests if served is None else served,
            "queueUs": queue_us, "requestUs": request_us, "computeUs": compute_us, "track": track, "at": iso_stamp(at)}


def reading_of(counters: Any, at: dt.datetime, track: str) -> dict[str, Any]:
    """pod_reading of a pod's triton.metrics.ModelCounters."""
    v = counters.values
    return pod_reading(v.get("success", 0.0) + v.get("failure", 0.0), v.get("queue_us", 0.0), at,
                       rejected=v.get("rejected", 0.0), served=v.get("success", 0.0),
                       request_us=v.get("request_us", 0.0), compute_us=v.get("compute_us", 0.0), track=track)


def load_reading(snapshot: Any, recorded: AutoscalingStatus | None) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """({pod: pod_reading} of both tracks' serving pods, or None unless every one has an answer
    newer than the recorded reading), and the pods not read. `snapshot`:
    controller/pod_metrics.Snapshot."""
    previous = (recorded.reading if recorded else None) or {}
    reading = {pod: reading_of(c, at, track)
               for track, pods in snapshot.readings.items() for pod, (c, at) in pods.items()}
    # Every pod's answer newer than the one counted last: a round half in (reads are off the
    # reconcile) would count some pods' load and silently not the others'.
    fresh = bool(reading) and all(
        not isinstance(previous.get(pod), dict) or read_stamp(previous[pod].get("at")) is None
        or read_stamp(previous[pod].get("at")) < read_stamp(now["at"]) for pod, now in reading.items())
    return (reading if fresh else None), (*snapshot.not_read("canary"), *snapshot.not_read("stable"))


def counter_value(value: Any) -> float | None:
    """A stored counter as a finite, non-negative number (None: not one, e.g. null from a NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


class Rate(NamedTuple):
    """The serving pods between two readings."""
    qps: float | None                 # requests/s asked: served + failed, shed ones included
    avg_queue_ms: float | None        # mean queue time of the served requests
    pods: int                         # pods counted (read both times)
    rejected_qps: float | None = None   # of qps, what Triton shed
    served_qps: float | None = None
    requests: float = 0.0             # requests asked in the window, all pods counted
    served: float = 0.0               # requests served in the window
    mean_request_ms: float | None = None   # mean request latency of the served ones (Triton's request duration)
    mean_compute_ms: float | None = None
    rejected: float = 0.0             # requests shed in the window
    untimed: tuple[str, ...] = ()     # pods that served while their request time did not move (left out of the means)

    @property
    def shed_ratio(self) -> float | None:
        """Share of the requests asked that Triton shed (None: no rate, or nothing asked)."""
        return self.rejected / self.requests if self.qps is not None and self.requests else None


NO_RATE = Rate(None, None, 0)
_LATENCY_KEYS = ("requestUs", "computeUs")


def rate(previous: dict[str, Any] | None, current: dict[str, Any], implausible: list[str] | None = None,
         track: str | None = None) -> Rate:
    """The Rate between two readings ({pod: pod_reading}): each pod read both times counts its own
    difference over its own interval; a pod new in this reading (its counters include its
    warm-up), restarted (counters went down), or whose stored reading is not a number counts from
    the next one. A pod whose counters moved more than a Triton pod can serve
    (triton/metrics.implausible) is left out and named in `implausible`. `track`: that track's
    pods only (a reading without one is stable's). NO_RATE: no pod was read twice. A counter a
    stored reading lacks (written by an older operator) counts as not moved."""
    if not previous:
        return NO_RATE
    total_rate = rejected_rate = served_rate = 0.0
    sums = {"requests": 0.0, "rejected": 0.0, "served": 0.0, "queueUs": 0.0, "requestUs": 0.0, "computeUs": 0.0}
    timed = 0.0           # served requests of the pods whose latency counters were read both times
    untimed: list[str] = []
    counted = 0
    for pod, now_read in current.items():
        before = previous.get(pod)
        if not isinstance(before, dict) or (track and now_read.get("track", "stable") != track):
            continue
        then, at = read_stamp(before.get("at")), read_stamp(now_read.get("at"))
        requests = (counter_value(now_read.get("requests")), counter_value(before.get("requests")))
        if then is None or at is None or None in requests:
            continue
        moved = {"requests": requests[0] - requests[1]}
        for key in ("rejected", "served", "queueUs", *_LATENCY_KEYS):
            if key not in before or key not in now_read:   # an older operator's reading: not moved
                moved[key] = moved["requests"] if key == "served" else 0.0
                continue
            a, b = counter_value(now_read[key]), counter_value(before[key])
            moved[key] = None if a is None or b is None else a - b
        seconds = (at - then).total_seconds()
        if seconds <= 0 or any(v is None or v < 0 for v in moved.values()):
            continue
        wrong = implausible_move({"success": moved["requests"], "queue_us": moved["queueUs"],
                                  "request_us": moved["requestUs"], "compute_us": moved["computeUs"]}, seconds)
        if wrong:
            if implausible is not None:
                implausible.append(f"{pod}: {wrong}")
            continue
        total_rate += moved["requests"] / seconds
        rejected_rate += moved["rejected"] / seconds
        served_rate += moved["served"] / seconds
        for key in ("requests", "rejected", "served", "queueUs"):
            sums[key] += moved[key]
        if all(key in before and key in now_read for key in _LATENCY_KEYS):
            # A request's time covers its compute: a pod that served while its request time did not
            # move (a Triton without the counter, or one that lies) would pull the mean to 0.
            if moved["served"] and (moved["requestUs"] <= 0 or moved["requestUs"] < moved["computeUs"]):
                untimed.append(pod)
            else:
                timed += moved["served"]
                sums["requestUs"] += moved["requestUs"]
                sums["computeUs"] += moved["computeUs"]
        counted += 1
    if not counted:
        return NO_RATE
    served = sums["served"]
    return Rate(total_rate, sums["queueUs"] / served / 1000.0 if served else 0.0, counted, rejected_rate,
                served_rate, sums["requests"], served,
                sums["requestUs"] / timed / 1000.0 if timed else None,
                sums["computeUs"] / timed / 1000.0 if timed else None, sums["rejected"], tuple(untimed))


def reading_due(spec: RankingModelSpec, recorded: AutoscalingStatus | None, now: dt.datetime) -> bool:
    """Whether this reconcile reads the serving pods' counters: autoscaling by rankops, and the
    last reading at least MIN_READING_S ago."""
    if not spec.autoscaling.by_rankops:
        return False
    read_at = read_stamp(recorded.read_at if recorded else None)
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
                    if (t := read_stamp(r.at)) is not None)
    kept = {k: getattr(recorded, k) if recorded else None
            for k in ("observed_qps", "avg_queue_ms", "shed_ratio", "reading", "read_at", "last_scale_time")}
    corrected = _correction(spec, recorded.capacity_correction if recorded else None, plan, plan_status, cap, None)
    if cap is None:   # never expected: the spec's validation asks for capacityPerReplicaQps first
        return Scaling(current, AutoscalingStatus(
            mode="rankops", desired_replicas=current, reason="NoCapacity",
            message="no capacity per replica: set autoscaling.capacityPerReplicaQps", **kept))
    if reading is None:   # not read in this reconcile: what was decided stands (within the bounds)
        if recorded is not None and decided == current:
            update: dict[str, Any] = {"capacity_per_replica_qps": round(_scaled(cap, corrected), 3),
                                      "capacity_source": source, "desired_replicas": current,
                                      "capacity_correction": corrected}
            if problems:   # a read was due and nothing new came: say which pods, and why
                base = (recorded.message or "").split(NOT_READ)[0]
                update["message"] = (base + f"{NOT_READ}{'; '.join(problems[:3])}")[:1000]
            return Scaling(current, recorded.model_copy(update=update))
        outcome = decide(Inputs(now, current, _scaled(cap, corrected), b, history=history))
    else:
        implausible: list[str] = []
        previous = recorded.reading if recorded else None
        seen = rate(previous, reading, implausible)
        stable = rate(previous, reading, track="stable")
        if corrected is not None:
            corrected = _correction(spec, corrected, plan, plan_status, cap, _evidence(stable, now))
        outcome = decide(Inputs(now, current, _scaled(cap, corrected), b, seen.qps, seen.avg_queue_ms, history,
                                _shed_for_scaling(stable, current)))
        problems = (*problems, *implausible)
        kept.update(observed_qps=_rounded(seen.qps), avg_queue_ms=_rounded(seen.avg_queue_ms),
                    shed_ratio=_rounded(seen.shed_ratio, 4), reading=reading, read_at=iso_stamp(now))
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
        kept["last_scale_time"] = iso_stamp(now)
        events = (("Normal", SCALED, f"stable replicas {before} -> {outcome.desired}: {outcome.message}"),)
    return Scaling(outcome.desired, AutoscalingStatus(
        mode="rankops", capacity_per_replica_qps=round(_scaled(cap, corrected), 3), capacity_source=source,
        capacity_correction=corrected,
        desired_replicas=outcome.desired, reason=outcome.reason, message=message[:1000], **kept,
        recommendations=[Recommendation(at=iso_stamp(t), replicas=r) for t, r in outcome.history]), events)


def _correction(spec: RankingModelSpec, recorded: CapacityCorrection | None, plan: Any,
                plan_status: PlanStatus | None, cap: float | None,
                evidence: correction.Evidence | None) -> CapacityCorrection | None:
    """status.autoscaling.capacityCorrection after this reading (None: correction off, or no plan
    to predict from). A capacity from the spec is measured against the plan but not corrected:
    it is the user's own measurement, and correcting it by the profile's error would count the
    difference twice."""
    basis = correction.plan_basis(plan, plan_status)
    if not spec.autoscaling.correct_capacity or basis is None or cap is None:
        return None
    applied = spec.autoscaling.capacity_per_replica_qps is None
    return correction.correct(recorded, basis, cap, correction.points_for(plan, recorded, basis), evidence, applied)


def _shed_for_scaling(stable: Rate, current: int) -> float | None:
    """The stable track's shed ratio, when every stable replica decided was counted: a canary
    that sheds is the rollout's to judge (more stable replicas do not cure it), and while a
    replica added for shedding is still starting (a pod counts from its second reading) the
    shedding it is meant to end must not add another."""
    return stable.shed_ratio if stable.pods >= current else None


def _evidence(stable: Rate, now: dt.datetime) -> correction.Evidence | None:
    """The stable replicas' reading as evidence (None: no rate, or no latency counters read)."""
    if stable.qps is None or not stable.pods:
        return None
    if stable.mean_request_ms is None and not stable.untimed:   # no latency counters read (an older reading)
        return None
    return correction.Evidence(now, (stable.served_qps or 0.0) / stable.pods, stable.served,
                               stable.mean_request_ms or 0.0, stable.untimed)


def _scaled(cap: float, corrected: CapacityCorrection | None) -> float:
    return cap * correction.bounded(corrected.factor) if corrected is not None and corrected.applied else cap


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


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


def iso_stamp(at: dt.datetime) -> str:
    return at.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def read_stamp(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def scaler_of(autoscalers: list[dict[str, Any]], deployment: str) -> str | None:
    """autoscaling mode external: the HorizontalPodAutoscaler (autoscaling/v2) among `autoscalers`
    that targets the stable Deployment, as "HorizontalPodAutoscaler/<name>", or
    "ScaledObject/<name>" for the one KEDA made; None when none does."""
    for hpa in autoscalers:
        target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if target.get("kind") == "Deployment" and target.get("name") == deployment:
            keda = ((hpa.get("metadata") or {}).get("labels") or {}).get("scaledobject.keda.sh/name")
            return f"ScaledObject/{keda}" if keda else f"HorizontalPodAutoscaler/{hpa['metadata']['name']}"
    return None
