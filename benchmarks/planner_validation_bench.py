"""Does the planner's predicted P99 match a real Triton's? (issue 14, part 2)

A stand-in model whose execution is known (tests/triton/timed_model.py: a Python-backend model
that spends a + b·items ms per batch, and stretches by 1 + slowdown while another instance of it
runs) is served by the real-Triton fixture (tritonserver 2.51) under several dynamic-batching
configs (max batch size, queue delay, preferred sizes, instances). The loop a user follows:

1. `rankops profile`'s measurement (planner.measure) on the live server: compute ms per batch
   size, the shared-instance slowdown, and the client/server overhead at light load;
2. for each config and each rate (fractions of the config's saturation bound), the simulator's
   P99 (`planner.simulator.simulate`, as `rankops plan` runs it) from that profile;
3. open-loop Poisson load at that rate against the server (requests are sent at their arrival
   times whatever the responses, from a pool of client threads), P99 measured from each request's
   scheduled arrival to its response.

Printed: predicted and measured P99 per (config, rate), the relative error, its median and
maximum, the client's lateness (P99 of how late requests left: when it is not small, the client,
not the server, limited the run, and the row says so), the average batch predicted and formed by
Triton, and how much slower the executions ran than the profile said (a busy machine slows the
stand-in itself: then the prediction was made for another server than the one measured).

    .venv/bin/python benchmarks/planner_validation_bench.py                 # small: 2 configs x 3 rates
    .venv/bin/python benchmarks/planner_validation_bench.py --full          # 6 configs x 5 rates
    .venv/bin/python benchmarks/planner_validation_bench.py --candidates 2,6  # requests of 2..6 items
    .venv/bin/python benchmarks/planner_validation_bench.py --full --exhaustive 120   # part 3
    .venv/bin/python benchmarks/planner_validation_bench.py --capacity   # issue 26: the sustainable rate

`--capacity` (issue 26) checks the rate a plan calls sustainable, as a user would: the stand-in
runs t(b) = 5 + 2·b ms (slowdown 0.5 between instances), `rankops profile`'s measurement gives the
profile, `rankops plan` (headroom 0, failure tolerance 0) picks the config and its sustainable rate
for several P99 budgets, and NVIDIA's perf_analyzer sends Poisson load at 80%, 90% and 100% of it
to a fresh server per point, so that Triton's own summary P99 (nv_inference_request_summary_us, a
sliding window) holds that run alone. `--no-margins` plans without the load/P99 margins and the long
verifying run (what the planner did before issue 26), for comparison.

On a 2-core shared machine run it small: the client's threads and Triton share the cores, and
the stand-in sleeps (rather than computes) so that its cost stays what it says.
"""
from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "triton"))

from rankops.triton.client import Endpoint  # noqa: E402
from rankops.triton.samples import Sample  # noqa: E402
from rankops.planner.measure import measure  # noqa: E402
from rankops.planner.profile import LatencyProfile  # noqa: E402
from rankops_dev import triton  # noqa: E402
from rankops.planner.simulator import (BatcherConfig, poisson_arrivals_ms, request_items,  # noqa: E402
                                       saturation_qps, simulate)
import timed_model  # noqa: E402

A_MS, B_MS, SLOWDOWN = 20.0, 2.0, 0.5
MODEL = "timed"

SMALL = [BatcherConfig(8, (), 0, 1), BatcherConfig(8, (), 2000, 2)]
FULL = [BatcherConfig(8, (), 0, 1), BatcherConfig(8, (), 2000, 1), BatcherConfig(16, (), 1000, 1),
        BatcherConfig(8, (4, 8), 1000, 1), BatcherConfig(8, (), 0, 2), BatcherConfig(16, (8, 16), 2000, 2)]
SMALL_RATES = (0.3, 0.6, 0.85)
FULL_RATES = (0.2, 0.4, 0.6, 0.75, 0.9)


@dataclass
class Run:
    p99_ms: float
    p50_ms: float
    late_p99_ms: float
    errors: int
    avg_batch: float          # Triton's own: batch items per execution during the run
    compute_ms: float         # Triton's own: mean compute (input+infer+output) per execution


def _counts(url: str) -> tuple[float, float]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/v2/models/{MODEL}/stats") as resp:
        stats = json.load(resp)["model_stats"][0]
    ns = sum(float(b[p]["ns"]) for b in stats["batch_stats"]
             for p in ("compute_input", "compute_infer", "compute_output"))
    return float(stats["inference_count"]), float(stats["execution_count"]), ns / 1e6


def serve(install: triton.TritonInstall, work: Path, config: BatcherConfig, max_batch: int | None = None):
    root = work / f"mb{config.max_batch_size}-d{config.max_queue_delay_us}-p{'_'.join(map(str, config.preferred_batch_sizes))}-i{config.instances}"
    timed_model.write_repository(root, MODEL, a_ms=A_MS, b_ms=B_MS, slowdown=SLOWDOWN,
                                 max_batch=max_batch or config.max_batch_size, instances=config.instances,
                                 preferred=config.preferred_batch_sizes, delay_us=config.max_queue_delay_us)
    return timed_model.server(install, root, [MODEL])


def open_loop(url: str, rate: float, requests: int, items: tuple[int, int] | None, seed: int,
              threads: int) -> Run:
    """Poisson arrivals at `rate` req/s, each request sent at its arrival time by a free thread."""
    arrivals = poisson_arrivals_ms(rate, requests, seed) / 1000.0
    sizes = request_items(requests, seed, *items) if items else (1,) * requests
    endpoint = Endpoint(url, MODEL)
    probe = endpoint.connect()
    info = probe.model_info()
    bodies = {n: probe.build_request(Sample(1, {"x": np.zeros((n, 4), np.float32)}), info) for n in set(sizes)}
    probe.close()
    latency = [0.0] * requests
    late = [0.0] * requests
    errors = [0]
    work: queue.Queue = queue.Queue()
    inferences, executions, compute = _counts(url)
    start_at = time.perf_counter() + 0.3

    def worker() -> None:
        connection = endpoint.connect()
        while True:
            i = work.get()
            if i is None:
                break
            due = start_at + arrivals[i]
            sent = time.perf_counter()
            try:
                connection.infer(bodies[sizes[i]])
            except Exception:
                errors[0] += 1
            latency[i] = (time.perf_counter() - due) * 1000
            late[i] = (sent - due) * 1000
        connection.close()

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for i in range(requests):
        delay = start_at + arrivals[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        work.put(i)
    for _ in pool:
        work.put(None)
    for t in pool:
        t.join()
    skip = requests // 10        # as the simulator: the first 10% warm the queue up
    kept = latency[skip:]
    inferences2, executions2, compute2 = _counts(url)
    ran = max(1.0, executions2 - executions)
    return Run(float(np.percentile(kept, 99)), float(np.percentile(kept, 50)),
               float(np.percentile(late[skip:], 99)), errors[0],
               (inferences2 - inferences) / ran, (compute2 - compute) / ran)


CAPACITY_A_MS, CAPACITY_B_MS = 5.0, 2.0
CAPACITY_BUDGETS = (150.0, 120.0, 100.0, 80.0, 65.0, 50.0)
CAPACITY_FRACTIONS = (0.8, 0.9, 1.0)


@dataclass
class PerfRun:
    delivered_qps: float      # what perf_analyzer measured completing (it may send a little less)
    client_p99_ms: float      # perf_analyzer's own (its client shares the 2 cores with the server)
    triton_p99_ms: float      # Triton's summary P99 over the run (a fresh server: this run only)
    avg_batch: float          # Triton's: items per execution


def perf_point(install: triton.TritonInstall, root: Path, config: BatcherConfig, rate: float,
               requests: int) -> PerfRun:
    """A fresh server of `config` (the capacity stand-in) under perf_analyzer's Poisson load at `rate`."""
    import subprocess

    from rankops.triton import metrics as server_metrics

    timed_model.write_repository(root, MODEL, a_ms=CAPACITY_A_MS, b_ms=CAPACITY_B_MS, slowdown=SLOWDOWN,
                                 max_batch=config.max_batch_size, instances=config.instances,
                                 preferred=config.preferred_batch_sizes, delay_us=config.max_queue_delay_us)
    with timed_model.server(install, root, [MODEL]) as server:
        csv = root / "perf.csv"
        # three windows of a third each, and a stability criterion no run misses: it stops there
        command = [str(install.perf_analyzer), "-m", MODEL, "-u", server.http_url, "-i", "http", "--async",
                   "--request-rate-range", f"{rate:.1f}", "--request-distribution", "poisson",
                   "--percentile=99", "--measurement-mode", "count_windows",
                   "--measurement-request-count", str(max(1, requests // 3)), "--max-trials", "3",
                   "--stability-percentage", "999", "--max-threads", "8", "-f", str(csv)]
        before = _scrape_when_up(server.metrics_url)
        done = subprocess.run(command, env=install.perf_analyzer_environment(), capture_output=True, text=True)
        after = server_metrics.scrape(server.metrics_url, MODEL)
    if done.returncode:
        raise RuntimeError(f"perf_analyzer failed: {done.stdout[-800:]} {done.stderr[-800:]}")
    header, row = csv.read_text().splitlines()[:2]
    values = dict(zip(header.split(","), row.split(",")))
    report = server_metrics.run_report(before, after)
    ran = after.minus(before)
    return PerfRun(float(values["Inferences/Second"]), float(values["p99 latency"]) / 1000,
                   float(report["p99Ms"] or "nan"), ran["inferences"] / max(1.0, ran["executions"]))


def _scrape_when_up(url: str, wait_s: float = 15.0):
    """Triton's metrics once its metrics port answers (it may bind it after the server is ready)."""
    from rankops.triton import metrics as server_metrics

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return server_metrics.scrape(url, MODEL)
        except server_metrics.MetricsUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def capacity(args, install, work: Path) -> int:
    """Issue 26: at 80/90/100% of the rate each plan calls sustainable, predicted vs Triton's P99."""
    from rankops.planner import search
    from rankops.planner.inputs import PlanInputs

    if args.no_margins:   # the planner before issue 26: no margins, no long verifying run
        search.LOAD_MARGIN, search.P99_MARGIN, search.VERIFY_REQUESTS = 0.0, 0.0, search.SEARCH_REQUESTS
    began = time.perf_counter()
    with serve_timed(install, work / "profile", 32, 2) as server:
        measured = measure(server.http_url, MODEL, requests=15, warmup=3)
    profile = LatencyProfile.from_mapping(measured.profile())
    slowdown = measured.slowdown if measured.slowdown is not None else SLOWDOWN
    first = measured.timings[0]
    overhead = max(0.0, first.client_median_ms - first.median_ms)
    print(f"profile measured (truth {CAPACITY_A_MS:g} + {CAPACITY_B_MS:g}·b ms): "
          + ", ".join(f"{b}: {ms:.2f}" for b, ms in profile.points)
          + f"; sharedGpuSlowdown {slowdown:.2f} (truth {SLOWDOWN:g}); overhead {overhead:.2f} ms"
          + (" [--no-margins]" if args.no_margins else ""))
    print(f"load: perf_analyzer --async, Poisson, ~{args.requests} requests per point, a fresh server per point; "
          f"load average before {_load()}")
    print(f"{'budget':>6} {'config':44} {'of rate':>7} {'req/s':>6} {'sent':>6} {'pred P99':>9} {'Triton P99':>10} "
          f"{'error':>7} {'client P99':>10} {'batch pred/meas':>15} within")
    errors, at_full = [], []
    for budget in args.budgets:
        inputs = PlanInputs(profile=profile, p99_budget_ms=budget, target_qps=1.0, headroom=0.0,
                            failure_tolerance=0, shared_gpu_slowdown=slowdown, overhead_ms=overhead)
        result = search.plan(inputs)
        config, sustainable = result.config, result.qps_per_gpu
        for fraction in CAPACITY_FRACTIONS:
            rate = sustainable * fraction
            predicted = simulate(profile, config, rate_qps=rate, requests=20_000, seed=args.seed,
                                 slowdown=slowdown, overhead_ms=overhead)
            root = work / f"cap-{budget:g}-{fraction:g}"
            run = perf_point(install, root, config, rate, args.requests)
            error = (predicted.p99_ms - run.triton_p99_ms) / run.triton_p99_ms
            within = run.triton_p99_ms <= budget
            if fraction <= 0.9:
                errors.append(abs(error))
            else:
                at_full.append(within)
            print(f"{budget:6g} {config.describe():44} {fraction:7.0%} {rate:6.0f} {run.delivered_qps:6.0f} "
                  f"{predicted.p99_ms:9.2f} {run.triton_p99_ms:10.2f} {error:+7.1%} {run.client_p99_ms:10.2f} "
                  f"{predicted.avg_batch_size:7.2f}/{run.avg_batch:<7.2f} {'yes' if within else 'NO'}", flush=True)
    print(f"at 100% of the sustainable rate: Triton's P99 within the budget in {sum(at_full)} of {len(at_full)} "
          f"points (goal >= 90%)")
    if errors:
        print(f"up to 90% of it: median |predicted - measured| {statistics.median(errors):.1%}, "
              f"max {max(errors):.1%} over {len(errors)} points (goal: median <= 10%)")
    print(f"load average after {_load()}; wall time {time.perf_counter() - began:.0f} s")
    return 0


def serve_timed(install: triton.TritonInstall, root: Path, max_batch: int, instances: int):
    timed_model.write_repository(root, MODEL, a_ms=CAPACITY_A_MS, b_ms=CAPACITY_B_MS, slowdown=SLOWDOWN,
                                 max_batch=max_batch, instances=instances)
    return timed_model.server(install, root, [MODEL])


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="6 configs x 5 rates (default: 2 x 3)")
    parser.add_argument("--requests", type=int, default=400, help="requests per (config, rate)")
    parser.add_argument("--threads", type=int, default=48, help="client threads (open loop)")
    parser.add_argument("--candidates", metavar="LO,HI", help="items per request, uniform (layout batch)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", metavar="I,J", help="run only these configs of the grid (0-based)")
    parser.add_argument("--exhaustive", type=float, metavar="P99_MS",
                        help="instead: brute-force each config's sustainable rate within this P99 on the server "
                             "(what Model Analyzer does) and compare the planner's choice over the same grid")
    parser.add_argument("--capacity", action="store_true",
                        help="instead: perf_analyzer at 80/90/100%% of each plan's sustainable rate (issue 26)")
    parser.add_argument("--budgets", type=lambda v: [float(x) for x in v.split(",")], default=list(CAPACITY_BUDGETS),
                        help="--capacity: P99 budgets to plan for (ms, comma-separated)")
    parser.add_argument("--no-margins", action="store_true",
                        help="--capacity: plan as before issue 26 (no load/P99 margins, no verifying run)")
    args = parser.parse_args()
    if args.capacity:
        if args.requests == 400:
            args.requests = 4500
        return capacity(args, triton.ensure_installed(), triton.scratch_dir("rankops-capacity-"))
    items = tuple(int(x) for x in args.candidates.split(",")) if args.candidates else None
    configs, fractions = (FULL, FULL_RATES) if args.full else (SMALL, SMALL_RATES)
    if args.only:
        configs = [configs[int(i)] for i in args.only.split(",")]
    if items:   # max batch sizes count items: hold the largest request
        configs = [BatcherConfig(max(c.max_batch_size, 2 * items[1]),
                                 tuple(p * items[1] // 2 for p in c.preferred_batch_sizes), c.max_queue_delay_us,
                                 c.instances) for c in configs]
    install = triton.ensure_installed()
    work = triton.scratch_dir("rankops-validate-")
    largest = max(c.max_batch_size for c in configs)
    began = time.perf_counter()

    # 1. the profile, measured as `rankops profile` measures it (two instances: the slowdown too)
    with serve(install, work / "profile", BatcherConfig(largest, (), 0, 2)) as server:
        measured = measure(server.http_url, MODEL, requests=15, warmup=3)
    profile = LatencyProfile.from_mapping(measured.profile())
    slowdown = measured.slowdown if measured.slowdown is not None else SLOWDOWN
    first = measured.timings[0]
    overhead = max(0.0, first.client_median_ms - first.median_ms)
    print(f"profile measured (truth {A_MS:g} + {B_MS:g}·items ms): "
          + ", ".join(f"{b}: {ms:.2f}" for b, ms in profile.points)
          + f"; sharedGpuSlowdown {slowdown:g} (truth {SLOWDOWN:g}); client/server overhead {overhead:.2f} ms")
    if args.exhaustive:
        return exhaustive(args, install, work, configs, profile, slowdown, overhead, items)
    print(f"load: open-loop Poisson, {args.requests} requests per row, {args.threads} client threads"
          + (f", {items[0]}..{items[1]} items per request" if items else ", 1 item per request"))
    print(f"{'config':44} {'req/s':>6} {'pred P99':>9} {'meas P99':>9} {'error':>7} {'late P99':>9} "
          f"{'batch pred/meas':>15} {'exec vs profile':>15}")

    errors = []
    for config in configs:
        bound = saturation_qps(profile, config, slowdown, items)
        with serve(install, work, config) as server:
            open_loop(server.http_url, bound * 0.3, 50, items, args.seed + 99, args.threads)   # warm the stubs
            for fraction in fractions:
                rate = bound * fraction
                predicted = simulate(profile, config, rate_qps=rate, requests=20_000, seed=args.seed,
                                     slowdown=slowdown, overhead_ms=overhead, items=items)
                run = open_loop(server.http_url, rate, args.requests, items, args.seed, args.threads)
                error = (predicted.p99_ms - run.p99_ms) / run.p99_ms
                # the executions' own speed against the profile at the batch Triton formed (the
                # instances' sharing stretches it when several run: not a drift then)
                drift = run.compute_ms / profile.compute_ms(max(1, round(run.avg_batch))) - 1
                client_bound = run.late_p99_ms > 0.1 * run.p99_ms
                if not client_bound and not run.errors:
                    errors.append(abs(error))
                flag = " client-bound (not counted)" if client_bound else ""
                flag += f" {run.errors} errors (not counted)" if run.errors else ""
                print(f"{config.describe():44} {rate:6.0f} {predicted.p99_ms:9.2f} {run.p99_ms:9.2f} "
                      f"{error:+7.0%} {run.late_p99_ms:9.2f} {predicted.avg_batch_size:7.2f}/{run.avg_batch:<7.2f} {drift:+15.0%}{flag}")
    if errors:
        print(f"relative P99 error over {len(errors)} rows: median {statistics.median(errors):.0%}, "
              f"max {max(errors):.0%} (goal: median <= 15%, max <= 30%)")
    print(f"wall time {time.perf_counter() - began:.0f} s")
    return 0


def exhaustive(args, install, work, configs, profile, slowdown, overhead, items) -> int:
    """Part 3: the best sustainable rate found by measuring every config, against the planner's
    pick over the same grid (its simulator on the measured profile), with both wall times."""
    from rankops.planner.inputs import PlanInputs
    from rankops.planner.search import clear_caches, sustainable_qps

    budget = args.exhaustive
    clear_caches()
    began = time.perf_counter()
    inputs = PlanInputs(profile=profile, p99_budget_ms=budget, target_qps=1.0, shared_gpu_slowdown=slowdown,
                        overhead_ms=overhead, items_per_request=items)
    predicted = {c: sustainable_qps(inputs, c) for c in configs}
    pick = max(configs, key=lambda c: predicted[c])
    planner_s = time.perf_counter() - began

    began = time.perf_counter()
    measured = {}
    probes = 0
    print(f"brute force: P99 <= {budget:g} ms, open-loop Poisson, {args.requests} requests per probe")
    for config in configs:
        bound = saturation_qps(profile, config, slowdown, items)
        with serve(install, work, config) as server:
            open_loop(server.http_url, bound * 0.3, 50, items, args.seed + 99, args.threads)

            def ok(rate: float) -> bool:
                # a run the client made late says nothing about the server: run it again (twice at most)
                for attempt in range(3):
                    run = open_loop(server.http_url, rate, args.requests, items, args.seed + attempt, args.threads)
                    if run.late_p99_ms <= 0.1 * run.p99_ms:
                        break
                return run.p99_ms <= budget and not run.errors

            lo, hi = 0.0, None
            for fraction in (0.3, 0.5, 0.7, 0.85, 1.0):
                probes += 1
                if ok(bound * fraction):
                    lo = bound * fraction
                else:
                    hi = bound * fraction
                    break
            for _ in range(3 if hi is not None else 0):
                mid = (lo + hi) / 2 if lo else hi / 2
                probes += 1
                if ok(mid):
                    lo = mid
                else:
                    hi = mid
            measured[config] = lo
        print(f"  {config.describe():44} measured {lo:6.0f} req/s   predicted {predicted[config]:6.0f} req/s")
    brute_s = time.perf_counter() - began
    best = max(configs, key=lambda c: measured[c])
    fraction = measured[pick] / measured[best] if measured[best] else 0.0
    print(f"brute force best: {best.describe()} at {measured[best]:.0f} req/s ({probes} probes, {brute_s:.0f} s)")
    print(f"planner's pick:   {pick.describe()} measured at {measured[pick]:.0f} req/s = {fraction:.0%} of the best "
          f"(goal >= 90%), chosen in {planner_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
