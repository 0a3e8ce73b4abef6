"""spec.autoscaling on real Triton (issue 26 item 6): a day-shaped load (5 -> 15 -> 25 -> 15 -> 5
req/s for 80, 20, 40, 20 and 80 s at least, scaled to what the CPU stand-ins serve: capacityPerReplicaQps 10, so 1 -> 2 -> 3 -> 2 -> 1
replicas) on the local control plane's process node, the operator deciding the replicas from each
pod's Triton counters.

Prints per phase: the seconds from the load step to the new replica count decided (the
Deployment's spec.replicas) and to that many Ready and warm (the warm container gates readiness),
the requests sent and failed, the client P99 (all, in the step's window until the replicas are
Ready, after it) against the SLO budget; then the replica-seconds paid against static
provisioning for the peak over the same time.

    .venv/bin/python benchmarks/autoscale_bench.py

The run is e2e/bench_autoscale.py::test_bench_day_shaped_load (a few minutes; starts a local
control plane, the S3 server, a process node and the operator).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "e2e/bench_autoscale.py::test_bench_day_shaped_load"],
                              cwd=ROOT, env={**os.environ, "RANKOPS_AUTOSCALE_BENCH": str(out)},
                              capture_output=True, text=True, timeout=1200)
        if not out.exists():
            print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
            return 1
        report = json.loads(out.read_text())
    budget = report["budget_p99_ms"]
    print(f"{'phase':>5} {'req/s':>6} {'replicas':>8} {'decided s':>9} {'ready+warm s':>12} {'sent':>6} "
          f"{'failed':>6} {'P99 ms':>7} {'in step':>7} {'after':>7}  budget {budget:g} ms")
    for i, p in enumerate(report["phases"], 1):
        worst = max((v for v in (p["p99_step_ms"], p["p99_after_ms"]) if v is not None), default=None)
        verdict = "" if worst is None else ("ok" if worst <= budget else "OVER")
        print(f"{i:>5} {p['rate']:>6g} {p['wanted']:>8} {_s(p['decided_s']):>9} {_s(p['ready_s']):>12} "
              f"{p['sent']:>6} {p['failed']:>6} {_s(p['p99_ms']):>7} {_s(p['p99_step_ms']):>7} "
              f"{_s(p['p99_after_ms']):>7}  {verdict}")
    paid, static = report["replica_seconds"], report["static_peak_replica_seconds"]
    ideal = report.get("ideal_replica_seconds")
    print(f"replica-seconds: {paid:g} autoscaled vs {static:g} static at the peak "
          f"({paid / static:.0%}; goal <= 60%)"
          + (f"; a follower without lag would pay {ideal:g} ({ideal / static:.0%})" if ideal else ""))
    print(f"failed requests: {sum(p['failed'] for p in report['phases'])} (goal 0)")
    return 0 if done.returncode == 0 else done.returncode


def _s(value) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
