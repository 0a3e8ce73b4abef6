"""Canary analysis: is the canary as good as the stable on the traffic both serve now? (pure)

While the canary holds its weight, the operator reads each serving pod's Triton metrics (its
metrics port, triton/metrics.py) when the Canary phase starts and at each check. A track's
window is its pods' counter differences, summed; its server-side P99 is the worst pod's latency
summary quantile (Triton's own sliding window of about a minute). `judge` holds the canary to
absolute bounds and to the stable's same-window numbers; too little traffic is no verdict yet.

Shed is not broken: the requests Triton rejected from its queue (a queue-policy timeout,
nv_inference_request_failure{reason="REJECTED"}) are load, not a fault of the version. They are
left out of the failure ratio and held to the stable's own shed ratio instead, so load shed on
both tracks alike is not blamed on the canary, and a canary that sheds more than the stable is.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from rankops.triton.metrics import ModelCounters, implausible

PASS, FAIL, WAIT = "pass", "fail", "wait"


@dataclass(frozen=True)
class Bounds:
    max_failure_ratio: float = 0.01            # failed / all requests of the canary's window
    max_p99_ms: float | None = None            # absolute bound on the canary's server P99
    max_p99_vs_stable: float | None = 1.5      # canary P99 / stable P99 in the same window
    min_requests: int = 100                    # fewer canary requests: no verdict yet
    max_avg_queue_ms: float | None = None      # absolute bound on the canary's average queue time
    max_avg_queue_vs_stable: float | None = None   # canary / stable average queue time, same window
    max_shed_ratio_vs_stable: float | None = 0.02  # canary shed ratio minus the stable's (absolute)


@dataclass(frozen=True)
class TrackWindow:
    pods: int
    requests: float
    failures: float
    executions: float
    inferences: float
    queue_us: float
    p99_ms: float | None
    unread: tuple[str, ...] = ()    # the track's serving pods with no usable reading, each with why
    rejected: float = 0.0           # of the failures, requests Triton shed (reason REJECTED)

    @property
    def served(self) -> float:
        return self.requests - self.failures

    @property
    def failure_ratio(self) -> float | None:
        """Failures other than shed, of the requests not shed: a shed request never ran the model,
        so it is no evidence either way."""
        tried = self.requests - self.rejected
        return (self.failures - self.rejected) / tried if tried > 0 else None

    @property
    def shed_ratio(self) -> float | None:
        return self.rejected / self.requests if self.requests else None

    @property
    def avg_queue_ms(self) -> float | None:
        return self.queue_us / self.served / 1000 if self.served > 0 else None

    @property
    def avg_batch_size(self) -> float | None:
        return self.inferences / self.executions if self.executions else None

    def as_metrics(self) -> dict[str, Any]:
        return {"pods": self.pods, "requests": int(self.requests), "failures": int(self.failures),
                "rejected": int(self.rejected), "failureRatio": _round(self.failure_ratio),
                "shedRatio": _round(self.shed_ratio), "p99Ms": _round(self.p99_ms),
                "avgQueueMs": _round(self.avg_queue_ms), "avgBatchSize": _round(self.avg_batch_size),
                **({"unreadPods": len(self.unread)} if self.unread else {})}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def track_window(before: Mapping[str, ModelCounters], after: Mapping[str, ModelCounters],
                 p99_left_out: Collection[str] = (), unread: Collection[str] = (),
                 seconds: Mapping[str, float] | None = None) -> TrackWindow:
    """The window of one track from per-pod readings at its start (`before`) and now (`after`).

    A pod new since the start, or restarted (a counter went down), counts from zero: its counters
    began inside the window. Pods in `p99_left_out` count in every number but the P99. `unread`:
    the track's serving pods not read now; `seconds`: each pod's window length, so a pod whose
    counters moved more than any Triton could (`implausible`) counts as not read, not summed.
    A start recorded before the operator read "rejected" has none: the window's shed is then
    unknown and counted as 0 (every failure a failure, as that operator judged it).
    """
    keys = ("success", "failure", "executions", "inferences", "queue_us", "rejected")
    totals = dict.fromkeys(keys, 0.0)
    p99s = []
    left_out = list(unread)
    counted = 0
    for pod, now in after.items():
        start = before.get(pod)
        reset = start is None or any(now.values.get(k, 0.0) < start.values.get(k, 0.0) for k in keys)
        moved = {key: now.values.get(key, 0.0) - (0.0 if reset else start.values.get(key, 0.0)) for key in keys}
        if not reset and "rejected" not in start.values:
            moved["rejected"] = 0.0
        # REJECTED is one reason among the failures: more shed than failed is no Triton's reading.
        moved["rejected"] = min(moved["rejected"], moved["failure"])
        wrong = implausible(moved, (seconds or {}).get(pod))
        if wrong:
            left_out.append(f"{pod}: {wrong}")
            continue
        counted += 1
        for key in keys:
            totals[key] += moved[key]
        if now.quantiles_us.get(0.99) is not None and pod not in p99_left_out:
            p99s.append(now.quantiles_us[0.99] / 1000)
    return TrackWindow(pods=counted, requests=totals["success"] + totals["failure"], failures=totals["failure"],
                       executions=totals["executions"], inferences=totals["inferences"], queue_us=totals["queue_us"],
                       p99_ms=max(p99s) if p99s else None, unread=tuple(left_out), rejected=totals["rejected"])


@dataclass(frozen=True)
class Judgement:
    outcome: str          # pass (healthy so far), fail, wait (not enough traffic to say)
    reason: str
    summary: str
    metrics: dict[str, Any] = field(default_factory=dict)


Check = Callable[[TrackWindow, TrackWindow, "Bounds", str], "Judgement | None"]


def failing_requests(canary: TrackWindow, stable: TrackWindow, bounds: Bounds, seen: str) -> Judgement | None:
    ratio = canary.failure_ratio or 0.0
    if ratio > bounds.max_failure_ratio:
        shed = f" (not counting {int(canary.rejected)} shed)" if canary.rejected else ""
        return Judgement(FAIL, "CanaryFailingRequests",
                         f"{seen}: failure ratio {ratio:.2%}{shed} > {bounds.max_failure_ratio:.2%}")
    return None


# Standard errors the shed difference must also exceed: at a 30% shed ratio a few hundred requests
# per track differ by several points by chance alone (the binomial's spread), and the bound is
# meant for a canary that sheds more, not for one that drew an unlucky minute.
SHED_NOISE_Z = 3.0


def shedding_vs_stable(canary: TrackWindow, stable: TrackWindow, bounds: Bounds, seen: str) -> Judgement | None:
    """The canary's shed ratio against the stable's in the same window, as a difference: shedding
    is zero in a healthy fleet, so a ratio of ratios is undefined or huge on noise (0.1% vs 0.01%),
    while the difference is the share of callers that got a fallback because of the canary. Load
    shed alike on both tracks (a spike) is not the canary's doing; a canary that sheds more serves
    slower or holds less than the stable at the same per-pod load."""
    bound = bounds.max_shed_ratio_vs_stable
    mine, theirs = canary.shed_ratio, stable.shed_ratio
    if bound is None or mine is None or theirs is None or stable.requests < bounds.min_requests:
        return None
    pooled = (canary.rejected + stable.rejected) / (canary.requests + stable.requests)
    noise = SHED_NOISE_Z * (pooled * (1 - pooled) * (1 / canary.requests + 1 / stable.requests)) ** 0.5
    if mine - theirs > max(bound, noise):
        return Judgement(FAIL, "CanarySheddingMoreThanStable",
                         f"{seen}: canary shed {mine:.2%} of its requests, the stable {theirs:.2%}: "
                         f"{(mine - theirs) * 100:.2f} points more > {bound * 100:g}"
                         + (f" (and over the {noise * 100:.2f} points chance allows)" if noise > bound else ""))
    return None


def p99_above_bound(canary: TrackWindow, stable: TrackWindow, bounds: Bounds, seen: str) -> Judgement | None:
    if bounds.max_p99_ms is not None and canary.p99_ms is not None and canary.p99_ms > bounds.max_p99_ms:
        return Judgement(FAIL, "CanaryP99AboveBound", f"{seen}: canary P99 {canary.p99_ms:.2f}ms > {bounds.max_p99_ms:g}ms")
    return None


def p99_vs_stable(canary: TrackWindow, stable: TrackWindow, bounds: Bounds, seen: str) -> Judgement | None:
    if (bounds.max_p99_vs_stable is not None and canary.p99_ms is not None and stable.p99_ms
            and stable.requests >= bounds.min_requests and canary.p99_ms > stable.p99_ms * bounds.max_p99_vs_stable):
        return Judgement(FAIL, "CanarySlowerThanStable", f"{seen}: canary P99 {canary.p99_ms / stable.p99_ms:.2f}x "
                                                         f"the stable's > {bounds.max_p99_vs_stable:g}x")
    return None


def queue_time(canary: TrackWindow, stable: TrackWindow, bounds: Bounds, seen: str) -> Judgement | None:
    """The canary's average time in Triton's queue (nv_inference_queue_duration_us per request):
    a canary that batches worse, or is slower per batch, queues longer before its P99 shows it."""
    queue = canary.avg_queue_ms
    if queue is None:
        return None
    if bounds.max_avg_queue_ms is not None and queue > bounds.max_avg_queue_ms:
        return Judgement(FAIL, "CanaryQueueAboveBound",
                         f"{seen}: canary average queue {queue:.2f}ms > {bounds.max_avg_queue_ms:g}ms")
    theirs = stable.avg_queue_ms
    if (bounds.max_avg_queue_vs_stable is not None and theirs and stable.requests >= bounds.min_requests
            and queue > theirs * bounds.max_avg_queue_vs_stable):
        return Judgement(FAIL, "CanaryQueuesLongerThanStable",
                         f"{seen}: canary average queue {queue:.2f}ms, {queue / theirs:.2f}x the stable's "
                         f"{theirs:.2f}ms > {bounds.max_avg_queue_vs_stable:g}x")
    return None


# What the canary is held to, in order: the first that fails decides. A new metric is one more
# function here, its bound in Bounds and the API (rollout.canary.analysis), and its test.
CHECKS: tuple[Check, ...] = (failing_requests, shedding_vs_stable, p99_above_bound, p99_vs_stable, queue_time)


def judge(canary: TrackWindow, stable: TrackWindow, bounds: Bounds) -> Judgement:
    metrics = {"canary": canary.as_metrics(), "stable": stable.as_metrics(),
               "bounds": {"maxFailureRatio": bounds.max_failure_ratio, "maxP99Ms": bounds.max_p99_ms,
                          "maxP99VsStable": bounds.max_p99_vs_stable, "minRequests": bounds.min_requests,
                          "maxAvgQueueMs": bounds.max_avg_queue_ms,
                          "maxAvgQueueVsStable": bounds.max_avg_queue_vs_stable,
                          "maxShedRatioVsStable": bounds.max_shed_ratio_vs_stable}}
    shed = f" ({int(canary.rejected)} shed)" if canary.rejected else ""
    theirs = f" ({int(stable.rejected)} shed)" if stable.rejected else ""
    seen = (f"canary {int(canary.requests)} requests, {int(canary.failures)} failed{shed}"
            f"{_ms(', P99', canary.p99_ms)}; stable {int(stable.requests)} requests{theirs}{_ms(', P99', stable.p99_ms)}")
    if canary.requests < bounds.min_requests:
        return Judgement(WAIT, "NotEnoughTraffic",
                         f"{seen}: fewer than {bounds.min_requests} canary requests, no verdict yet", metrics)
    for check in CHECKS:
        failed = check(canary, stable, bounds, seen)
        if failed is not None:
            return Judgement(failed.outcome, failed.reason, failed.summary, metrics)
    # What was read passes; a bound that needs what was not read cannot pass on it.
    unjudged = not_judged(canary, stable, bounds)
    if unjudged is not None:
        return Judgement(WAIT, unjudged[0], f"{seen}: {unjudged[1]}: no verdict", metrics)
    # The P99 and queue checks see only the requests served: a canary that shed (or failed) nearly
    # all of its window passed them on nothing.
    if canary.served < bounds.min_requests:
        return Judgement(WAIT, "CanaryServedTooFew",
                         f"{seen}: only {int(canary.served)} canary requests served, fewer than "
                         f"{bounds.min_requests}: its latency is not known, no verdict", metrics)
    return Judgement(PASS, "CanaryHealthy", f"{seen}: within bounds", metrics)


def not_judged(canary: TrackWindow, stable: TrackWindow, bounds: Bounds) -> tuple[str, str] | None:
    """(reason, why) when a bound the canary must meet could not be evaluated: a canary pod not
    read (its failures are unseen), or the stable unread or without a P99 where the canary is held
    to the stable's numbers."""
    if canary.unread:
        return "CanaryPodsNotRead", f"{len(canary.unread)} canary pod(s) not read ({'; '.join(canary.unread[:3])})"
    vs_stable = (bounds.max_p99_vs_stable is not None or bounds.max_avg_queue_vs_stable is not None
                 or bounds.max_shed_ratio_vs_stable is not None)
    if vs_stable and stable.unread:
        return "StablePodsNotRead", (f"{len(stable.unread)} stable pod(s) not read ({'; '.join(stable.unread[:3])}), "
                                     "so the canary cannot be held to the stable's numbers")
    if bounds.max_p99_vs_stable is not None and canary.p99_ms is not None and stable.p99_ms is None \
            and stable.requests >= bounds.min_requests:
        return "StableP99Unknown", "the stable pods report no P99 (latency summary), so the canary's cannot be compared"
    return None


def _ms(label: str, value: float | None) -> str:
    return "" if value is None else f"{label} {value:.2f}ms"
