"""spec.autoscaling on real Triton (issue 26 item 6): a day-shaped load (5 -> 15 -> 25 -> 15 -> 5
req/s for 80, 20, 40, 20 and 80 s at least; capacityPerReplicaQps 8, so 1 -> 2 -> 3 -> 2 -> 1
replicas, 3 the maximum) on real containers (two real nodes; the CPU stand-in's device time makes a
replica serve about 11 req/s: e2e/test_autoscale_real.py's docstring), the operator, the chart's pod, deciding
the replicas from each pod's Triton counters.

Prints per phase: the seconds from the load step to the new replica count decided (the
Deployment's spec.replicas) and to that many Ready and warm (the warm container gates readiness),
the requests sent and failed, the client P99 (all, in the step's window until the replicas are
Ready, after it) against the SLO budget; then the replica-seconds paid against static
provisioning for the peak over the same time.

    .venv/bin/python benchmarks/autoscale_bench.py
    .venv/bin/python benchmarks/autoscale_bench.py --optimistic-profile    # issue 40: ~15 min

(With other checkouts running real-Triton tests at the same time, give the run its own Triton
cache, e.g. `cp -al ~/.cache/rankops/triton DIR/` and RANKOPS_CACHE=DIR: the cache's stand-in
is linked to the checkout that installed it last, and only this one sleeps a device time.)

--optimistic-profile: the capacity comes from a plan whose latency profile is 30% optimistic. The
CPU stand-in also sleeps a device time t(b) = 2 + 1·b ms per execution (DEVICE_MS; the ONNX graph
alone takes a flat 0.3 ms, which would plan thousands of req/s per replica: nothing the day could
load). First the served model's profile is measured on a local Triton (its rendered config, the
same export and device time): `rankops profile`'s measurement, PROFILE_RUNS times, the median per
batch size. The spec (SPEC without capacityPerReplicaQps) gets planning.latencyProfile = 0.7 x that
median; the plan of the measured profile itself gives the true capacity, and the day's rates must
need 1 -> 2 -> 3 -> 2 -> 1 replicas by it. Then the day twice, autoscaling.correctCapacity false
and true; per phase the replicas, the P99 against the budget, and status.autoscaling's capacity
and capacityCorrection at the phase's end.

The run is e2e/bench_autoscale.py::test_bench_day_shaped_load (a few minutes; starts the
real-container cluster of e2e/conftest.py's `real`: the control plane, two real nodes, the S3
server and the chart's operator pod). docs/autoscaling.md's figures were measured on the earlier
process node (Triton as host processes, uncapped, no device time), before the move.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from e2e_run import run_e2e

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimistic-profile", action="store_true",
                        help="the capacity from a plan whose profile is 30%% optimistic, "
                             "without and with correctCapacity")
    args = parser.parse_args(argv)
    if args.optimistic_profile:
        return optimistic_profile()
    report, code = run_e2e("e2e/bench_autoscale.py::test_bench_day_shaped_load", "RANKOPS_AUTOSCALE_BENCH", 1200)
    if report is None:
        return code
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
    return code


# --- --optimistic-profile -------------------------------------------------------------------

DEVICE_MS = (2.0, 1.0)        # the stand-in's device time a + b·rows ms per execution
OPTIMISM = 0.7                # the profile given to the planner: 0.7 x the measured one
PROFILE_RUNS = 3              # measurements of the profile; the median per batch size is kept
PROFILE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# (req/s, at least s): DAY's rates, shorter nights (the nights show the scale-down, nothing more)
PLANNED_DAY = [(5, 40), (15, 30), (25, 40), (15, 30), (5, 40)]
# The e2e driver waits for each answer: one never has two requests in flight and a replica never
# queues, whatever the rate. DRIVERS share the rate: up to that many in flight, a queue of up to
# DRIVERS x ~42 ms, enough to break the 250 ms budget when the replicas are too few.
DRIVERS = 24


def _spec_doc(profile: dict[int, float], correct: bool) -> dict:
    import copy

    from e2e.test_autoscale_real import SPEC

    spec = copy.deepcopy(SPEC)
    del spec["autoscaling"]["capacityPerReplicaQps"]
    spec["autoscaling"]["correctCapacity"] = correct
    spec["planning"] = {**spec["planning"], "latencyProfile": {str(b): round(ms, 4) for b, ms in profile.items()}}
    return spec


def _capacity(spec_doc: dict) -> float:
    """The plan's capacity per replica (what the operator's autoscaler scales against)."""
    from e2e import models
    from e2e.test_autoscale_real import NAME
    from rankops import autoscale
    from rankops.api.rankingmodel import RankingModelSpec
    from rankops.planner.inputs import inputs_from_spec
    from rankops.planner.search import evaluate, plan

    body = models.model_manifest(NAME, **spec_doc)
    body["spec"]["versions"][0]["precision"] = "fp32"
    spec = RankingModelSpec.model_validate(body["spec"])
    inputs = inputs_from_spec(spec)
    result = plan(inputs) if inputs.auto else evaluate(inputs)
    cap, source = autoscale.capacity(spec, result)
    assert source == "plan", source
    return cap


def measure_profile() -> tuple[dict[int, float], list[dict[int, float]]]:
    """The served model's profile on this machine: the median per batch size of PROFILE_RUNS runs."""
    import statistics

    from e2e import models
    from e2e.test_autoscale_real import NAME, write_device_ms
    from rankops.api.rankingmodel import ModelFormat
    from rankops.planner.measure import measure
    from rankops.render.tritonconfig import triton_version
    from rankops_dev import spec_models, triton

    install = triton.ensure_installed()
    work = triton.scratch_dir()
    body = models.model_manifest(NAME, modelCredentialsSecret="model-store", **_spec_doc({1: 1.0}, False))
    body["spec"]["versions"][0]["precision"] = "fp32"
    rm, deployment, config_map = triton.rendered_serving(body)
    directory = work / "artifacts" / "v1"
    spec_models.export(rm.spec, ModelFormat.onnx, directory, seed=0)
    write_device_ms(directory, *DEVICE_MS)
    runs = []
    with triton.TritonServer.for_rendered(deployment, config_map, {str(triton_version("1")): directory}, work,
                                          install=install) as server:
        for _ in range(PROFILE_RUNS):
            measured = measure(server.http_url, NAME, "", batch_sizes=list(PROFILE_SIZES), requests=10,
                               warmup=2, shared=False)
            runs.append({int(b): float(ms) for b, ms in measured.profile().items()})
    median = {b: statistics.median(r[b] for r in runs) for b in PROFILE_SIZES}
    floor = DEVICE_MS[0] + DEVICE_MS[1] * PROFILE_SIZES[-1]
    if median[PROFILE_SIZES[-1]] < floor:
        # ensure_installed links the Triton cache's stand-in to the checkout that ran it last:
        # another checkout's tests can take it back in the middle of this run
        raise SystemExit(f"the stand-in did not sleep its device time ({median[PROFILE_SIZES[-1]]:.2f} ms < "
                         f"{floor:g} ms at batch {PROFILE_SIZES[-1]}): {install.backend_dir} runs another "
                         "checkout's triton_standin.py; give this run its own cache (RANKOPS_CACHE=DIR)")
    return median, runs


def optimistic_profile() -> int:
    import math

    sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "dev")]
    sys.path.insert(0, str(ROOT))
    profile, runs = measure_profile()
    print(f"measured profile (server-side compute ms per batch, median of {PROFILE_RUNS} runs; "
          f"stand-in device time {DEVICE_MS[0]:g} + {DEVICE_MS[1]:g}·b ms):")
    for b in PROFILE_SIZES:
        spread = [r[b] for r in runs]
        print(f"  {b:>4}: {profile[b]:8.2f}   runs {', '.join(f'{v:.2f}' for v in spread)}   "
              f"spread {(max(spread) - min(spread)) / profile[b]:.1%}")
    true_cap = _capacity(_spec_doc(profile, False))
    optimistic = {b: OPTIMISM * ms for b, ms in profile.items()}
    plan_cap = _capacity(_spec_doc(optimistic, False))
    day = [(rate, s, max(1, math.ceil(rate / true_cap))) for rate, s in PLANNED_DAY]
    print(f"capacity per replica: {true_cap:.2f} req/s by the measured profile (the truth), {plan_cap:.2f} by "
          f"{OPTIMISM:g} x it (what the plan believes, x{plan_cap / true_cap:.2f})")
    print("replicas per phase by the truth: " + " -> ".join(str(w) for _, _, w in day)
          + "; by the optimistic plan: " + " -> ".join(str(max(1, math.ceil(r / plan_cap))) for r, _, _ in day))
    code = 0
    for correct in (False, True):
        report, rc = _planned_run(_spec_doc(optimistic, correct), day)
        code = code or rc
        print(f"\ncorrectCapacity: {str(correct).lower()}")
        if report is None:
            code = code or 1
            continue
        _print_planned(report)
    return code


def _planned_run(spec_doc: dict, day: list) -> tuple[dict | None, int]:
    with tempfile.TemporaryDirectory() as work:
        out, given = Path(work) / "report.json", Path(work) / "run.json"
        given.write_text(json.dumps({"spec": spec_doc, "day": day, "device_ms": list(DEVICE_MS), "drivers": DRIVERS}))
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "e2e/bench_autoscale.py::test_bench_planned_capacity"],
                              cwd=ROOT, env={**os.environ, "RANKOPS_AUTOSCALE_BENCH": str(out),
                                             "RANKOPS_AUTOSCALE_BENCH_PLANNED": str(given)},
                              capture_output=True, text=True, timeout=1500)
        if not out.exists():
            print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
            return None, 1
        return json.loads(out.read_text()), done.returncode


def _print_planned(report: dict) -> None:
    budget = report["budget_p99_ms"]
    print(f"{'phase':>5} {'req/s':>6} {'needs':>5} {'replicas':>8} {'sent':>6} {'failed':>6} {'P99 ms':>7} "
          f"{'in step':>7} {'after':>7} {'2nd half':>8} {'':>4} {'Triton':>6} {'capacity':>8} {'factor':>6} {'slowdown':>8}"
          f"  budget {budget:g} ms")
    for i, p in enumerate(report["phases"], 1):
        corr = p.get("correction") or {}
        late = p["p99_late_ms"]
        verdict = "" if late is None else ("ok" if late <= budget else "OVER")
        seen = "/".join(str(r) for r in p["replicas_seen"]) or "-"
        print(f"{i:>5} {p['rate']:>6g} {p['wanted']:>5} {seen:>8} {p['sent']:>6} {p['failed']:>6} {_s(p['p99_ms']):>7} "
              f"{_s(p['p99_step_ms']):>7} {_s(p['p99_after_ms']):>7} {_s(late):>8} {verdict:>4} "
              f"{_s(p.get('server_p99_ms')):>6} {_s(p.get('capacity')):>8} {_f(corr.get('factor')):>6} {_f(corr.get('slowdown')):>8}")
        if corr.get("message"):
            print(f"      {corr['message']}")
    print(f"replica-seconds: {report['replica_seconds']:g}")


def _f(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _s(value) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
