"""Capacity that corrects itself: the plan's prediction against what the serving replicas show.

The plan's capacity per replica comes from an offline latency profile; a serving replica shows its
real latency at its real rate in Triton's own counters every reading. Each reading compares the
two at the same per-replica rate:

    predicted  the plan's simulator (its config, its profile) at the observed per-replica rate:
               mean request latency, server side (the plan's overhead_ms, outside Triton, left out)
    observed   nv_inference_request_duration_us / nv_inference_request_success over the window
    slowdown   k = observed / predicted;  the factor follows 1/k (EWMA, alpha 0.5) within [0.5, 2]

and the autoscaler scales against capacity x factor. Lowered at once, raised only after
RAISE_AFTER readings in a row that say raise: a capacity too high breaks the budget, one too low
costs a GPU. A reading counts as evidence only with MIN_REQUESTS requests and a per-replica rate
of at least MIN_LOAD of the capacity: below that, latency says little about saturation. No I/O;
the clock is the reading's own time, so the same reading twice changes nothing.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rankops.api.autoscaling import CapacityCorrection
from rankops.planner.simulator import simulate

ALPHA = 0.5              # EWMA weight of the new reading: two readings halve an old error
LOWEST, HIGHEST = 0.5, 2.0   # a profile off by more than 2x is a wrong profile, not a correction
RAISE_AFTER = 3          # readings in a row that say raise before the factor rises
MIN_REQUESTS = 100       # per window: fewer and one slow request moves the mean by a percent
MIN_LOAD = 0.3           # per-replica rate / capacity: below it, the queue is empty either way
DEADBAND = 0.02          # a factor within 2% of the one applied is noise: kept
CURVE_POINTS = 14
CURVE_FROM, CURVE_TO = 0.1, 1.05   # fractions of the plan's capacity; beyond ~1.1 lies saturation
CURVE_REQUESTS = 8000


@dataclass(frozen=True)
class Evidence:
    """One reading of the stable replicas: what they served over the window."""
    at: dt.datetime                  # the end of the window (the reading's time)
    per_replica_qps: float           # requests/s one replica served
    requests: float                  # requests served in the window, all replicas
    observed_ms: float               # mean request latency, Triton's request duration (0: none timed)
    untimed: tuple[str, ...] = ()    # pods left out: they served while their request time did not move


def plan_basis(plan: Any, plan_status: Any = None) -> str | None:
    """What the correction was measured against: the plan's inputs digest (status.plan, also after a
    restart, when the plan is taken from status unsimulated), or a digest of the plan's inputs and
    config. None: no plan to predict from."""
    digest = getattr(plan_status, "inputs_digest", None)
    if digest:
        return digest[:16]
    if plan is None or getattr(plan, "inputs", None) is None:
        return None
    return hashlib.sha256(repr((plan.inputs, plan.config)).encode()).hexdigest()[:16]


def points_for(plan: Any, recorded: CapacityCorrection | None, basis: str) -> tuple[tuple[float, float], ...]:
    """The predicted curve: the plan's, simulated once per plan; without a simulated plan (a
    restarted operator takes it from status.plan) the one recorded against the same basis."""
    if plan is not None and getattr(plan, "qps_per_gpu", 0) and getattr(plan, "inputs", None) is not None:
        return curve(plan)
    if recorded is not None and recorded.plan_basis == basis:
        return tuple((float(r), float(ms)) for r, ms in (p[:2] for p in recorded.curve if len(p) >= 2))
    return ()


def curve(plan: Any) -> tuple[tuple[float, float], ...]:
    """(per-replica requests/s, predicted server-side mean ms), CURVE_POINTS of them from
    CURVE_FROM to CURVE_TO of the plan's capacity per replica; computed once per plan."""
    return _curve(plan.inputs, plan.config, float(plan.qps_per_gpu))


@lru_cache(maxsize=256)   # a curve is 14 pairs; more models than this re-simulate
def _curve(inputs: Any, config: Any, per_gpu: float) -> tuple[tuple[float, float], ...]:
    if per_gpu <= 0:
        return ()
    gpus = max(1, inputs.gpus_per_replica)
    step = (CURVE_TO - CURVE_FROM) / (CURVE_POINTS - 1)
    points = []
    for i in range(CURVE_POINTS):
        rate = per_gpu * (CURVE_FROM + i * step)
        sim = simulate(inputs.profile, config, rate_qps=rate, requests=CURVE_REQUESTS, seed=inputs.seed,
                       slowdown=inputs.shared_gpu_slowdown, overhead_ms=0.0, items=inputs.items_per_request)
        points.append((rate * gpus, sim.mean_ms))
    return tuple(points)


def predicted_ms(points: tuple[tuple[float, float], ...], per_replica_qps: float) -> float | None:
    """The curve at `per_replica_qps`, linear between points; None outside it (below: flat
    enough to read the first point; above: saturation, where a finite simulation says nothing)."""
    if not points or per_replica_qps > points[-1][0]:
        return None
    if per_replica_qps <= points[0][0]:
        return points[0][1]
    for (r0, m0), (r1, m1) in zip(points, points[1:]):
        if per_replica_qps <= r1:
            return m0 + (m1 - m0) * (per_replica_qps - r0) / (r1 - r0)
    return None


def correct(recorded: CapacityCorrection | None, basis: str, capacity_qps: float,
            points: tuple[tuple[float, float], ...], evidence: Evidence | None,
            applied: bool = True) -> CapacityCorrection:
    """The correction after this reading. `recorded`: status.autoscaling.capacityCorrection;
    `basis`: plan_basis (another one resets); `capacity_qps`: the capacity per replica before the
    correction; `evidence`: None when no rate was read now; `applied`: whether the autoscaler
    scales against it (False: measured and shown only)."""
    if recorded is None or recorded.plan_basis != basis:
        recorded = CapacityCorrection(factor=1.0, plan_basis=basis, readings=0, raise_streak=0,
                                      message="no evidence yet: the plan's capacity as planned")
    # status is the operator's alone, but one written by hand or by another version is still bounded
    recorded = recorded.model_copy(update={
        "applied": applied, "factor": bounded(recorded.factor),
        "curve": [[round(r, 3), round(ms, 3)] for r, ms in points] or recorded.curve})
    if evidence is None:
        return recorded
    at = _iso(evidence.at)
    last = _time(recorded.updated_at)
    if last is not None and last >= evidence.at:
        return recorded   # this reading (or a newer one) is already counted
    factor = recorded.factor
    scaled = capacity_qps * factor
    predicted = predicted_ms(points, evidence.per_replica_qps)
    seen = (f"{evidence.per_replica_qps:.1f} req/s per replica, {evidence.requests:.0f} requests, observed "
            f"{evidence.observed_ms:.2f} ms mean" + (f" vs predicted {predicted:.2f} ms" if predicted else "")
            + (f"; left out, request time did not move: {', '.join(evidence.untimed[:3])}" if evidence.untimed else ""))
    short = None
    if evidence.requests < MIN_REQUESTS:
        short = f"fewer than {MIN_REQUESTS} requests in the window"
    elif evidence.per_replica_qps < MIN_LOAD * scaled:
        short = (f"per-replica rate under {MIN_LOAD:.0%} of the capacity ({scaled:.1f} req/s): latency says "
                 "little about saturation there")
    elif not points:
        short = "no predicted curve for this plan yet (it is simulated when the plan is next computed)"
    elif evidence.observed_ms <= 0:
        short = "the replicas' request time did not move while they served: no latency to compare"
    elif predicted is None or predicted <= 0:
        short = "rate beyond the plan's predicted curve (past saturation): no prediction to compare with"
    if short:   # a raise needs readings in a row: one without evidence breaks the row
        return recorded.model_copy(update={"updated_at": at, "evidence": seen[:300], "raise_streak": 0, "message": (
            f"not enough evidence: {short}; factor {factor:.3f} kept")[:500]})
    slowdown = evidence.observed_ms / predicted
    wanted = min(HIGHEST, max(LOWEST, ALPHA / slowdown + (1 - ALPHA) * factor))
    streak = 0
    if wanted < factor * (1 - DEADBAND):
        factor, verdict = wanted, f"lowered to {wanted:.3f} at once"
    elif wanted > factor * (1 + DEADBAND):
        streak = recorded.raise_streak + 1
        if streak >= RAISE_AFTER:
            factor, streak, verdict = wanted, 0, f"raised to {wanted:.3f} after {RAISE_AFTER} readings that say raise"
        else:
            verdict = f"{factor:.3f} kept: {streak} of {RAISE_AFTER} readings say raise (to {wanted:.3f})"
    else:
        verdict = f"{factor:.3f} kept: within {DEADBAND:.0%}"
    return recorded.model_copy(update={
        "factor": round(factor, 4), "slowdown": round(slowdown, 4), "readings": recorded.readings + 1,
        "raise_streak": streak, "updated_at": at, "evidence": seen[:300],
        "message": (f"slowdown {slowdown:.2f} (observed / predicted at the observed rate): {verdict}; "
                    f"capacity {capacity_qps:.1f} x {factor:.3f} = {capacity_qps * factor:.1f} req/s per replica"
                    + ("" if applied else " (measured only, not applied)"))[:500]})


def bounded(factor: float) -> float:
    return min(HIGHEST, max(LOWEST, factor))


def _time(value: str | None) -> dt.datetime | None:
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None
    return parsed if parsed is None or parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _iso(at: dt.datetime) -> str:
    return at.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
