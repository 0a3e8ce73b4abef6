"""Planner speed: plans per second for a realistic profile, and simulated requests per second.

    .venv/bin/python benchmarks/plan_bench.py [--repeat N]

"cold" clears every memo first (a new spec); "warm" is the operator re-planning an unchanged
spec on a reconcile. The target is a cold plan well under 1 s on a 2-core machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from rankops.planner import BatcherConfig, LatencyProfile, MemoryNeeds, PlanInputs, plan, simulate  # noqa: E402
from rankops.planner.search import clear_caches  # noqa: E402

# A T4-class FP16 ranking model: ~2 ms alone, batch 8 ~50% dearer (the seeds' figures)
REALISTIC = LatencyProfile.from_mapping({1: 2.0, 2: 2.1, 4: 2.3, 8: 3.0, 16: 4.6, 32: 8.1})
CASES = {
    "issue example (P99 10 ms, 2000 qps, memory)": PlanInputs(
        profile=LatencyProfile.from_mapping({1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}), p99_budget_ms=10,
        target_qps=2000, gpu_memory_mib=15360, memory=MemoryNeeds(1024, 2048, 16, 1024)),
    "realistic 6-point profile (P99 15 ms, 10000 qps)": PlanInputs(
        profile=REALISTIC, p99_budget_ms=15, target_qps=10_000),
    "tight budget (P99 4 ms, 500 qps)": PlanInputs(
        profile=LatencyProfile.from_mapping({1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}), p99_budget_ms=4, target_qps=500),
}


def time_plans(inputs: PlanInputs, repeat: int) -> tuple[list[float], float]:
    cold = []
    for _ in range(repeat):
        clear_caches()
        start = time.perf_counter()
        plan(inputs)
        cold.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(1000):
        plan(inputs)
    return cold, (time.perf_counter() - start) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"CPUs: {os.cpu_count()}  python {sys.version.split()[0]}")
    print("\nplan() timings")
    for name, inputs in CASES.items():
        cold, warm = time_plans(inputs, args.repeat)
        result = plan(inputs)
        median = statistics.median(cold)
        print(f"  {name}\n    -> {result.config.describe()}, {result.gpus} GPU(s), {result.qps_per_gpu:.0f} req/s/GPU")
        print(f"    cold: median {median * 1000:.0f} ms, max {max(cold) * 1000:.0f} ms "
              f"({1 / median:.1f} plans/s); warm (memoised): {warm * 1e6:.1f} us")

    print("\nsimulate(): simulated requests per second of wall time")
    for config, rate in ((BatcherConfig(1), 400), (BatcherConfig(16, (), 500), 1000),
                         (BatcherConfig(16, (), 500), 3000), (BatcherConfig(32, (8, 16), 1000, 2), 5000)):
        requests = 100_000
        simulate(REALISTIC, config, rate_qps=rate, requests=requests)  # warm the arrival cache
        start = time.perf_counter()
        sim = simulate(REALISTIC, config, rate_qps=rate, requests=requests)
        elapsed = time.perf_counter() - start
        print(f"  {config.describe():55s} @ {rate:5d} req/s: {requests / elapsed / 1e6:5.2f} M req/s "
              f"(avg batch {sim.avg_batch_size:4.1f}, P99 {sim.p99_ms:6.2f} ms)")


if __name__ == "__main__":
    main()
