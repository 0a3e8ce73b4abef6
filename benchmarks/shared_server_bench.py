"""Several models on one device in one tritonserver (issue 42): each model's P99 alone, beside the
others' load, and with one model bursting, without and with Triton's rate limiter.

Three stand-ins of a ranking stage (coarse, fine, re-rank) are timed models (tests/triton/timed_model.py:
each batch sleeps a + b·items ms) that share one emulated device: while k other executions run,
each progresses at 1 / (1 + s·k) of its solo speed, the contention rule the planner assumes
(planning.sharedGpuSlowdown s). They are served by one real tritonserver (2.51), each with its own
config, dynamic batching as the operator renders it (no delay here). Live requests are paced at a
steady rate per model (open loop: latency from when each was due). Printed per model:
- alone: its P50 / P99 at its rate, the other two idle;
- together: all three at their rates at once, and the packer's prediction for the same server
  (planner/shared_server.admit on one card: each model's simulated P99 with its compute stretched
  by the others' busy fractions);
- burst: `coarse` and `fine` at their rates while `rerank` is flooded (its replay, `--flood` in
  flight): once with no rate limiter, once with Triton's rate limiter (--rate-limit=execution_count,
  one `device` resource: one execution at a time on the device, the bursting model at a lower
  priority weight).

    .venv/bin/python benchmarks/shared_server_bench.py [--seconds 8] [--slowdown 1.0] [--flood 16]

The stand-ins sleep, so the machine's two cores are not the device; the machine's load still shows
in the tails (compare the `alone` rows).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "triton"))

from rankops.planner import BatcherConfig, LatencyProfile, MemoryNeeds, PlanInputs  # noqa: E402
from rankops.planner.pack import Card, ModelToPack  # noqa: E402
from rankops.planner.shared_server import admit  # noqa: E402
from rankops.triton.client import Endpoint  # noqa: E402
from rankops_dev import triton  # noqa: E402
import priority_load  # noqa: E402
import timed_model  # noqa: E402

# name -> (a ms, b ms per item, max batch, live rate req/s, P99 budget ms)
MEMBERS = {
    "coarse": (2.0, 0.05, 32, 60.0, 25.0),
    "fine": (4.0, 0.25, 16, 40.0, 30.0),
    "rerank": (6.0, 0.5, 8, 20.0, 40.0),
}
BURSTING = "rerank"
DEVICE = "device"
LOW_PRIORITY = 4          # the bursting model's rate-limiter weight: a quarter of the others' chances


def write_members(root: Path, slowdown: float, rate_limited: bool) -> None:
    for name, (a, b, max_batch, _, _) in MEMBERS.items():
        limiter = ((LOW_PRIORITY if name == BURSTING else 1), 1) if rate_limited else None
        timed_model.write_repository(root, name, a_ms=a, b_ms=b, max_batch=max_batch, slowdown=slowdown,
                                     device=DEVICE, rate_limiter=limiter)


def predicted(slowdown: float) -> dict[str, tuple[float, float]]:
    """The packer's P99 for each member on one shared card at its live rate: beside the others' load,
    and with every other member saturated (a burst)."""
    members = []
    for name, (a, b, max_batch, rate, budget) in MEMBERS.items():
        sizes = sorted({1, 2, 4, max_batch // 2, max_batch})
        profile = LatencyProfile.from_mapping({n: a + b * n for n in sizes})
        members.append(ModelToPack(name, PlanInputs(
            profile=profile, p99_budget_ms=budget, target_qps=rate, headroom=0.0, failure_tolerance=0,
            batching=BatcherConfig(max_batch), memory=MemoryNeeds(weights_mib=100, runtime_reserve_mib=100),
            shared_gpu_slowdown=slowdown)))
    admission = admit(members, Card(16384, max_cards=1))
    if admission.server is None or admission.cards != 1:
        return {}
    return {m.name: (m.p99_shared_ms, m.p99_burst_ms) for m in admission.server.models}


def measure(server, names: list[str], seconds: float, flood: tuple[str, int] | None,
            flooder: priority_load.Flooder | None) -> dict[str, list[float]]:
    """Latencies of `names` at their rates at once, beside a flood of `flood`[0] when given."""
    out: dict[str, list[float]] = {}
    errors: list[str] = []

    def run(name: str) -> None:
        try:
            out[name] = priority_load.live(Endpoint(server.http_url, name), MEMBERS[name][3], seconds, threads=8)
        except Exception as exc:   # noqa: BLE001 - printed below
            errors.append(f"{name}: {exc}")

    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    if flood is None:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        with flooder.flood(Endpoint(server.http_url, flood[0]), flood[1], items=1) as result:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        out[f"{flood[0]} (flood)"] = [result[0].rate]
    if errors:
        raise RuntimeError("; ".join(errors))
    return out


def row(label: str, name: str, rounds: list[list[float]], extra: str = "") -> None:
    p50s = sorted(priority_load.p50(r) for r in rounds)
    p99s = sorted(priority_load.p99(r) for r in rounds)
    print(f"  {label:<22} {name:<7} P50 {p50s[len(p50s) // 2]:5.1f} ms   P99 {p99s[len(p99s) // 2]:5.1f} ms "
          f"(rounds {p99s[0]:.1f}-{p99s[-1]:.1f})   budget {MEMBERS[name][4]:g} ms{extra}", flush=True)


def cases(server, names: list[str], args, flooder, alone: bool, prediction: dict[str, float]) -> None:
    others = [n for n in names if n != BURSTING]
    runs: dict[str, list[dict[str, list[float]]]] = {"alone": [], "together": [], "burst": []}
    for _ in range(args.rounds):
        if alone:
            runs["alone"].append({n: measure(server, [n], args.seconds, None, None)[n] for n in names})
        runs["together"].append(measure(server, names, args.seconds, None, None))
        runs["burst"].append(measure(server, others, args.seconds, (BURSTING, args.flood), flooder))
    for n in names if alone else ():
        row("alone", n, [r[n] for r in runs["alone"]])
    for n in names:
        row("together", n, [r[n] for r in runs["together"]],
            f"; predicted P99 {prediction[n][0]:.1f} ms" if n in prediction else "")
    for n in others:
        row(f"{BURSTING} flooded ({args.flood})", n, [r[n] for r in runs["burst"]],
            f"; predicted P99 {prediction[n][1]:.1f} ms (every other member saturated)" if n in prediction else "")
    rates = sorted(r[f"{BURSTING} (flood)"][0] for r in runs["burst"])
    print(f"  {BURSTING}'s flood: {rates[len(rates) // 2]:.0f} req/s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="live window per case (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every case; the median and range printed")
    parser.add_argument("--slowdown", type=float, default=1.0,
                        help="the emulated device's sharing slowdown s (default 1: pure time slicing)")
    parser.add_argument("--flood", type=int, default=16, help="the bursting model's requests in flight (default 16)")
    args = parser.parse_args()

    install = triton.ensure_installed()
    names = list(MEMBERS)
    print(f"members on one emulated device (slowdown {args.slowdown:g}), one tritonserver; live "
          f"{', '.join(f'{n} {MEMBERS[n][3]:g}/s' for n in names)}, {args.seconds:g} s a case, {args.rounds} rounds")
    for n, (a, b, mb, _, _) in MEMBERS.items():
        print(f"  {n}: {a:g} + {b:g}/item ms per batch, max batch {mb}, one instance")
    flooder = priority_load.Flooder()
    try:
        root = Path(tempfile.mkdtemp(prefix="shared-bench-"))
        write_members(root, args.slowdown, rate_limited=False)
        with timed_model.server(install, root, names) as server:
            print("no rate limiter (executions overlap on the device):")
            cases(server, names, args, flooder, True, predicted(args.slowdown))
        limited = Path(tempfile.mkdtemp(prefix="shared-bench-rl-"))
        write_members(limited, args.slowdown, rate_limited=True)
        with timed_model.server(install, limited, names, ("--rate-limit=execution_count",
                                                          f"--rate-limit-resource={DEVICE}:1")) as server:
            print(f"Triton's rate limiter (one execution at a time on the device; {BURSTING} at priority "
                  f"{LOW_PRIORITY}, the others 1):")
            cases(server, names, args, flooder, False, {})
    finally:
        flooder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
