"""Capacity that corrects itself, on real Triton: a profile 30% optimistic (and 30% pessimistic)
given to the planner, the autoscaler driven by the real server's counters (issue 40, item 4).

The server is the timed stand-in (tests/triton/timed_model.py: real Triton 2.51, a Python-backend
model that sleeps t(b) = a + b·items ms per batch). The planner is given t(b) / truth: with truth
1.3 the replicas are 30% slower than profiled, with 0.7 30% faster. The RankingModel spec
(batching auto, slo, autoscaling) is planned and rendered as the operator does; the stand-in runs
the rendered max batch, instances and dynamic_batching block.

One Triton stands for every replica (identical replicas, a fixed total load): each reading sends
open-loop Poisson load at total / replicas for --window s, reads Triton's metrics page, and hands
autoscale.step the same counters for each of the replicas it decided last (a pod the step had not
seen counts from its next reading, as in the operator). Printed per reading: the per-replica rate,
the replicas serving it, the correction factor and slowdown, and the P99 the client measured in
that window against the budget; without and with spec.autoscaling.correctCapacity. Then a table of
where each run settled.

    .venv/bin/python benchmarks/correction_bench.py                    # ~5 min: x1.3 and x0.7, off and on
    .venv/bin/python benchmarks/correction_bench.py --truths 1.3 --readings 6 --window 6
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "dev")]
sys.path.insert(0, str(ROOT / "tests" / "triton"))
sys.path.insert(0, str(ROOT / "benchmarks"))

A_MS, B_MS = 20.0, 5.0            # the stand-in's true t(b) = 20 + 5·b ms
PROFILE_SIZES = (1, 2, 4, 8)
BUDGET_MS = 150.0
LOAD_X = 3.0                      # total load, in the plan's capacities per replica
# targetUtilization 1.0 (no headroom): the capacity alone decides, so a wrong one shows
# A new replica counts from its second reading, so the reading after a scale-up sees part of the
# load: a scale-down window over a few readings keeps that from undoing the scale-up (the
# operator's default is 300 s; this is 3 readings of the bench's clock).
SCALE_DOWN_WINDOW_S = 21


def profile_given(truth: float) -> dict[int, float]:
    """What the planner is told: the true t(b) / truth (truth 1.3: the profile is 30% optimistic)."""
    return {b: round((A_MS + B_MS * b) / truth, 3) for b in PROFILE_SIZES}


def spec_for(truth: float, correct: bool, target_qps: float = 100.0) -> dict:
    return {
        "version": "1", "versions": [{"name": "1", "modelUri": "s3://models/timed/1", "format": "onnx"}],
        "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
        "batching": "auto",
        "slo": {"p99LatencyMs": BUDGET_MS, "targetQps": target_qps, "overload": "queue"},
        "instancesPerGpu": 1,
        "planning": {"latencyProfile": profile_given(truth), "sharedGpuSlowdown": 0.0,
                     "headroom": 0, "failureTolerance": 0},
        "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 12, "targetUtilization": 1.0,
                        "scaleDownStabilizationSeconds": SCALE_DOWN_WINDOW_S, "correctCapacity": correct},
    }


def pod_readings(counters, replicas: int, at: dt.datetime) -> dict:
    """The one real server's counters as each of `replicas` identical pods' reading."""
    from rankops import autoscale

    return {f"replica-{i}": autoscale.reading_of(counters, at, "stable") for i in range(replicas)}


@dataclass
class Reading:
    truth: float
    correct: bool
    index: int
    rate: float                   # per replica, sent
    replicas: int                 # serving it
    p99_ms: float | None          # client side, this window
    triton_mean_ms: float | None
    factor: float | None
    slowdown: float | None
    decided: int
    reason: str


def run(install, work: Path, truth: float, correct: bool, args) -> list[Reading]:
    import overload_bench as ob
    import timed_model
    from rankops import autoscale
    from rankops.api.rankingmodel import RankingModelSpec
    from rankops.render.desired import resolve_shape

    spec = RankingModelSpec.model_validate(spec_for(truth, correct))
    plan = resolve_shape(spec).plan
    total = LOAD_X * plan.qps_per_gpu
    # Start where the plan puts the load: the replicas the uncorrected capacity asks for.
    spec = RankingModelSpec.model_validate({**spec_for(truth, correct, target_qps=total)})
    plan = resolve_shape(spec).plan
    rendered = ob.render({**spec_for(truth, correct, target_qps=total)})
    root = work / f"x{truth:g}-{'on' if correct else 'off'}"
    ob.write_model(root, plan, rendered.block, A_MS, B_MS, 0.0)
    out: list[Reading] = []
    recorded, replicas = None, plan.replicas
    t0 = dt.datetime.now(dt.timezone.utc)
    with timed_model.server(install, root, [ob.MODEL]) as server:
        host, port = server.http_url.rsplit(":", 1)
        counters, _ = ob._scrape_when_up(server.metrics_url)
        first = autoscale.step(spec, None, pod_readings(counters, replicas, t0), plan.replicas, 0, t0, plan=plan)
        recorded, replicas = first.status, first.replicas
        for i in range(args.readings):
            rate = total / replicas
            arrivals = ob._arrivals(rate, max(2, int(round(rate * args.window))), args.seed + i)
            load = asyncio.run(ob.open_loop(host, int(port), arrivals, args.drain))
            counters, _ = ob._triton(server.metrics_url)
            now = t0 + dt.timedelta(seconds=(i + 1) * max(args.window, autoscale.MIN_READING_S))
            step = autoscale.step(spec, recorded, pod_readings(counters, replicas, now), plan.replicas, 0, now,
                                  plan=plan)
            served = load.latency_ms[load.status == 200]
            c = step.status.capacity_correction
            mean = autoscale.rate(recorded.reading, step.status.reading).mean_request_ms
            out.append(Reading(truth, correct, i, rate, replicas,
                               float(np.percentile(served, 99)) if len(served) else None, mean,
                               c.factor if c else None, c.slowdown if c else None, step.replicas,
                               step.status.reason or ""))
            print(line(out[-1]), flush=True)
            recorded, replicas = step.status, step.replicas
    return out


def _f(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def line(r: Reading) -> str:
    verdict = "" if r.p99_ms is None else ("ok" if r.p99_ms <= BUDGET_MS else "OVER")
    return (f"x{r.truth:<4g} {'on' if r.correct else 'off':3} #{r.index:<2d} {r.rate:7.1f} {r.replicas:4d} "
            f"{_f(r.triton_mean_ms):>7} {_f(r.p99_ms):>8} {verdict:>4} {_f(r.factor, '.3f'):>6} "
            f"{_f(r.slowdown, '.2f'):>6} -> {r.decided:<3d} {r.reason}")


HEADER = (f"{'truth':5} {'cor':3} {'#':3} {'req/s':>7} {'reps':>4} {'Tr mean':>7} {'P99 cli':>8} {'':>4} "
          f"{'factor':>6} {'k':>6} -> decided")


def settled(readings: list[Reading], last: int = 2) -> tuple[int, float | None, float | None]:
    """(replicas, worst client P99, factor) over the last `last` readings of a run."""
    tail = readings[-last:]
    p99s = [r.p99_ms for r in tail if r.p99_ms is not None]
    return tail[-1].replicas, (max(p99s) if p99s else None), tail[-1].factor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--truths", default="1.3,0.7", help="true service time / profiled, comma separated")
    p.add_argument("--readings", type=int, default=6)
    p.add_argument("--window", type=float, default=7.0, help="seconds of load per reading")
    p.add_argument("--drain", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    from rankops_dev import triton

    install = triton.ensure_installed()
    truths = [float(t) for t in args.truths.split(",")]
    results: dict[tuple[float, bool], list[Reading]] = {}
    started = time.monotonic()
    print(f"stand-in t(b) = {A_MS:g} + {B_MS:g}·b ms; budget P99 {BUDGET_MS:g} ms; load {LOAD_X:g} x the plan's "
          "capacity per replica")
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="correction-bench-") as tmp:
        for truth in truths:
            for correct in (False, True):
                results[(truth, correct)] = run(install, Path(tmp), truth, correct, args)
    print(f"\nsettled (last 2 readings; {time.monotonic() - started:.0f} s in all):")
    print(f"{'truth':>5} {'correction':>10} {'replicas':>8} {'P99 ms':>7} {'budget':>6} {'factor':>6}")
    for (truth, correct), readings in results.items():
        replicas, p99, factor = settled(readings)
        print(f"{truth:5g} {'on' if correct else 'off':>10} {replicas:8d} {_f(p99):>7} {BUDGET_MS:6g} "
              f"{_f(factor, '.3f'):>6}" + ("" if p99 is None or p99 <= BUDGET_MS else "  OVER"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
