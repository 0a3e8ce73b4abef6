"""What a shared server's per-model door costs (issue 42): a model's latency straight to Triton vs
through `rankops route` (triton/route.py), on one real tritonserver.

The model is a timed stand-in (tests/triton/timed_model.py: a + b·items ms per batch); live
requests are paced at each rate (open loop, latency from when each was due), `--threads` kept-alive
connections. The router runs as the sidecar would: its own process (`rankops route`), one port for
the model. Printed per rate: P50 / P99 / max straight and routed, and the router's CPU seconds.

    .venv/bin/python benchmarks/route_bench.py [--rates 100 400 800] [--seconds 8]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "triton"))

from rankops.triton.client import Endpoint  # noqa: E402
from rankops_dev import triton  # noqa: E402
from rankops_dev.ports import free_port  # noqa: E402
import priority_load  # noqa: E402
import timed_model  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 400.0, 800.0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    install = triton.ensure_installed()
    root = Path(tempfile.mkdtemp(prefix="route-bench-"))
    timed_model.write_repository(root, "coarse", a_ms=1.0, b_ms=0.02, max_batch=32)
    port = free_port()
    with timed_model.server(install, root, ["coarse"]) as server:
        router = subprocess.Popen([sys.executable, "-m", "rankops", "route", "--upstream", server.http_url,
                                   "--host", "127.0.0.1", "--route", f"{port}=coarse"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    Endpoint(f"127.0.0.1:{port}", "coarse").connect().close()
                    break
                except Exception:  # noqa: BLE001 - not listening yet
                    time.sleep(0.1)
            print(f"timed model 1 + 0.02/item ms, max batch 32; {args.threads} connections, {args.seconds:g} s a rate")
            print(f"{'rate/s':>7} {'path':<9} {'P50 ms':>7} {'P99 ms':>7} {'max ms':>7} {'router CPU s':>12}")
            for rate in args.rates:
                for label, address in (("straight", server.http_url), ("routed", f"127.0.0.1:{port}")):
                    before = cpu_seconds(router.pid)
                    latencies = priority_load.live(Endpoint(address, "coarse"), rate, args.seconds, threads=args.threads)
                    used = cpu_seconds(router.pid) - before
                    print(f"{rate:7.0f} {label:<9} {priority_load.p50(latencies):7.2f} {priority_load.p99(latencies):7.2f} "
                          f"{max(latencies):7.2f} {used if label == 'routed' else 0:12.2f}", flush=True)
        finally:
            router.terminate()
            router.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
