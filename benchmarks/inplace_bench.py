"""A version switch in place against one with pods (issue 41), on real containers under traffic.

The same model (three one-GPU stable pods on two real nodes of 2 GPUs each, the CPU stand-in
Triton, production-like traffic from inside the cluster's network namespace) is switched from v1
to v2 (v1's weights rounded to FP16: both strategies promote it) twice: first with
`rollout.strategy: pods` (a canary pod on the fourth GPU, its gate Jobs, a 30 s canary step, then
the stable pods restarted with v2), then, the model made again, `inPlace` (v2 loaded beside v1 in
one pod, gated there, switched pod by pod, v1 unloaded).

Prints, for each: seconds from the spec.version change to Promoted; GPUs held at most and
GPU-seconds over the rollout (pods holding nvidia.com/gpu, sampled every 0.5 s); per phase, its
length, the requests sent and the client P99 against the SLO budget (250 ms).

    .venv/bin/python benchmarks/inplace_bench.py        # ~10 minutes

The run is e2e/bench_inplace.py::test_bench_in_place_against_pods (it starts the real-container
cluster of e2e/conftest.py's `real`). The client P99 includes the test's own driver on a 2-core
machine shared with the control plane, two nodes, the operator and the gates: compare the phases
and the strategies with each other, not with a production card.
"""
from __future__ import annotations

import sys

from e2e_run import run_e2e


def main() -> int:
    report, code = run_e2e("e2e/bench_inplace.py::test_bench_in_place_against_pods", "RANKOPS_INPLACE_BENCH", 2400)
    if report is None:
        return code
    budget = report["budget_p99_ms"]
    for key, title in (("pods", "rollout.strategy: pods"), ("in_place", "rollout.strategy: inPlace")):
        r = report[key]
        print(f"{title}: {r['outcome']} in {r['seconds']:g} s; GPUs held at most {r['gpus_max']} "
              f"({report['replicas']} serving), {r['gpu_seconds']:g} GPU-seconds over the rollout; "
              f"{r['sent']} requests, {r['failed']} failed; client P99 {_ms(r['p99_ms'])}")
        print(f"    {'phase':<24} {'from s':>7} {'for s':>7} {'GPUs':>5} {'requests':>9} {'P99 ms':>8}  budget {budget:g} ms")
        for p in r["phases"]:
            verdict = "" if p["p99_ms"] is None else ("ok" if p["p99_ms"] <= budget else "OVER")
            print(f"    {p['phase'] or '-':<24} {p['from']:>7g} {p['seconds']:>7g} {p['gpus_max']:>5} "
                  f"{p['requests']:>9} {_ms(p['p99_ms']):>8}  {verdict}")
    pods, in_place = report["pods"], report["in_place"]
    print(f"in place / pods: {in_place['seconds'] / pods['seconds']:.0%} of the time, "
          f"{in_place['gpu_seconds'] / pods['gpu_seconds']:.0%} of the GPU-seconds, "
          f"{in_place['gpus_max']} vs {pods['gpus_max']} GPUs at most")
    return code


def _ms(value) -> str:
    return "-" if value is None else f"{value:g}"


if __name__ == "__main__":
    sys.exit(main())
