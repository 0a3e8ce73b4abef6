"""Does a gate delay production requests? Live P99 beside a warmup replay flood (issue 40, item 2).

A stand-in model with a known service time (tests/triton/timed_model.py: sleeps a + b·items ms per
batch, one instance, so requests queue) is served by the real-Triton fixture (tritonserver 2.51).
Live requests arrive at a steady rate (open loop, latency from when each was due); beside them
the warmup gate's own replay (gates.warmup.replay) floods the same model, `--concurrency` in
flight, at a request priority. Printed per case: the live P50/P99/max and the flood's throughput.

Models: `levels`, dynamic batching with the lines the operator renders (priority_levels: 2,
default_priority_level: 1, level 2 delayed and never shed); `plain`, dynamic batching without
priority_levels; `nodyn`, no dynamic batching. The flood's priority: 2 (the gates' default),
1 (equal to live), 3 (above the model's levels: Triton uses the default level, i.e. live's).

    .venv/bin/python benchmarks/priority_bench.py            # levels: alone, flood at 2, flood at 1
    .venv/bin/python benchmarks/priority_bench.py --full     # and levels @3, plain @2, nodyn @2

The stand-in sleeps, so the two shared cores are not the bottleneck; the machine's load still
shows in the tails (compare the `alone` row). The live side has 16 threads, so at most 16 live
requests in flight: where live requests queue behind the flood without end (no batching, or a
flood far larger than that), the numbers say how far behind they fell, not a steady state.

Measured (--full, 2-core shared machine, three runs; live P99):
    levels alone 13-16 ms | flood @2 34-39 ms | @1 70-82 ms | @3 81-88 ms (like @1: the default level)
    plain  alone 13-25 ms | flood @2 66-71 ms (priority ignored without priority_levels)
    nodyn  alone 16 ms    | flood @2 345 ms-8 s (ignored; each request a batch of its own)
    --concurrency 64: levels @2 27-38 ms, @1 257 ms: at priority 2 the wait stays about one batch
    in execution (Triton does not preempt it), whatever the flood.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "triton"))

from rankops.triton.client import Endpoint  # noqa: E402
from rankops_dev import triton  # noqa: E402
import priority_load  # noqa: E402
import timed_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also: priority above the levels, no levels, no batching")
    parser.add_argument("--rate", type=float, default=40.0, help="live requests per second (default 40)")
    parser.add_argument("--seconds", type=float, default=6.0, help="live window per case (default 6)")
    parser.add_argument("--concurrency", type=int, default=16, help="the flood's requests in flight (default 16)")
    parser.add_argument("--a-ms", type=float, default=10.0, help="service time per batch, fixed part (default 10)")
    parser.add_argument("--b-ms", type=float, default=0.25, help="service time per item (default 0.25)")
    parser.add_argument("--max-batch", type=int, default=4, help="max_batch_size (default 4)")
    args = parser.parse_args()

    install = triton.ensure_installed()
    root = Path(tempfile.mkdtemp(prefix="priority-bench-"))
    shape = dict(a_ms=args.a_ms, b_ms=args.b_ms, max_batch=args.max_batch, instances=1)
    timed_model.write_repository(root, "levels", batching_extra=timed_model.PRIORITY_LEVELS, **shape)
    timed_model.write_repository(root, "plain", **shape)
    timed_model.write_repository(root, "nodyn", dynamic=False, **shape)
    cases = [("levels", None), ("levels", 2), ("levels", 1)]
    if args.full:
        cases += [("levels", 3), ("plain", None), ("plain", 2), ("nodyn", None), ("nodyn", 2)]
    service = args.a_ms + args.b_ms * args.max_batch
    print(f"timed model: {args.a_ms:g} + {args.b_ms:g}/item ms, max_batch {args.max_batch} (full batch "
          f"{service:g} ms), 1 instance; live {args.rate:g}/s for {args.seconds:g} s per case; "
          f"flood: warmup replay, {args.concurrency} in flight")
    print(f"{'model':<8} {'flood priority':<15} {'live P50':>9} {'live P99':>9} {'live max':>9} "
          f"{'flood req/s':>12} {'flood errors':>13}")
    flooder = priority_load.Flooder()
    with timed_model.server(install, root, ["levels", "plain", "nodyn"]) as server:
        for model, priority in cases:
            endpoint = Endpoint(server.http_url, model)
            if priority is None:
                latencies, flood = priority_load.live(endpoint, args.rate, args.seconds), None
            else:
                with flooder.flood(Endpoint(server.http_url, model, priority=priority), args.concurrency) as result:
                    latencies = priority_load.live(endpoint, args.rate, args.seconds)
                flood = result[0]
            label = "none (alone)" if priority is None else str(priority)
            p50, p99 = priority_load.p50(latencies), priority_load.p99(latencies)
            print(f"{model:<8} {label:<15} {p50:>7.1f}ms {p99:>7.1f}ms {max(latencies):>7.1f}ms {flood.rate if flood else 0:>12.0f} "
                  f"{flood.errors if flood else 0:>13}", flush=True)
    flooder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
