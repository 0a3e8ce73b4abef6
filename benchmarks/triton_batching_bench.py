"""Does Triton batch ranking traffic, and how close is the warmup gate's P99 to Triton's own?

On the real-Triton fixture (tritonserver 2.51, CPU stand-ins), the README's example model
(manifests/examples/rankingmodel-ctr-ranker.yaml) is served in three candidate layouts, each
rendered as the operator renders it:

  variable   today's default: item_features [-1, 32], one user per request, maxBatchSize 16
  padded     item_features [500, 32]: every request padded to 500 candidates
  batch      candidates as the batch dimension (the example): item_features [32], maxBatchSize 2048

and loaded with requests of 100-500 candidates (uniform, different in every request) at a fixed
concurrency through the warmup gate's own replay. Printed per layout, from Triton's metrics:
requests per execution (how many requests each batch joined), batch items per execution, the
server-side P99 (its latency summary, once its 60 s window holds only this run), and the client's.

Then the warmup gate itself against the batch layout at concurrency 8: its client P99 next to
Triton's P99 for the same requests (each run alone in Triton's 60 s latency window), with the
replay in one process per core (the gate's default) and in one, and with --perf-analyzer
NVIDIA's perf_analyzer over HTTP and gRPC as the reference client. The machine's load average
is printed with each run: on a shared machine the ratio moves with it, so --gate-rounds N
repeats the runs and prints each client's median. Every run is bounded in requests; the servers
stop at the end.

    .venv/bin/python benchmarks/triton_batching_bench.py [--requests 1500] [--concurrency 16]
    .venv/bin/python benchmarks/triton_batching_bench.py --layouts '' --gate-rounds 3 --perf-analyzer
"""
from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from rankops.triton import metrics as server_metrics
from rankops.triton.client import Endpoint
from rankops.triton.samples import Sample, generate_samples, parse_input_spec
from rankops.gates.warmup import WarmupConfig, latency_stats, replay, run_warmup
from rankops_dev import triton

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = yaml.safe_load((ROOT / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml").read_text())
MODEL = EXAMPLE["metadata"]["name"]
LOW, HIGH = 100, 500


def layouts() -> dict[str, dict]:
    batch = copy.deepcopy(EXAMPLE)
    variable = copy.deepcopy(EXAMPLE)
    spec = variable["spec"]
    del spec["candidates"]
    spec["inputs"] = [{"name": "user_features", "dataType": "FP32", "dims": [64]},
                      {"name": "item_features", "dataType": "FP32", "dims": [-1, 32], "maxDims": [HIGH, 32]}]
    spec["outputs"] = [{"name": "scores", "dataType": "FP32", "dims": [-1], "maxDims": [HIGH]}]
    spec["batching"] = {"maxBatchSize": 16, "preferredBatchSizes": [4, 8], "maxQueueDelayMicroseconds": 1000}
    spec["modelWarmup"] = {"batchSizes": [1, 8, 16]}
    padded = copy.deepcopy(variable)
    padded["spec"]["candidates"] = {"layout": "padded"}
    padded["spec"]["inputs"][1] = {"name": "item_features", "dataType": "FP32", "dims": [HIGH, 32]}
    padded["spec"]["outputs"] = [{"name": "scores", "dataType": "FP32", "dims": [HIGH]}]
    return {"variable": variable, "padded": padded, "batch": batch}


def ranking_requests(layout: str, doc: dict, count: int, seed: int = 0) -> list[Sample]:
    """`count` requests of one user each, with LOW..HIGH candidates, as the layout sends them."""
    rng = np.random.default_rng(seed)
    spec = doc["spec"]
    user_dim = spec["inputs"][0]["dims"][0]
    samples = []
    for index in range(count):
        n = int(rng.integers(LOW, HIGH + 1))
        user = rng.standard_normal(user_dim).astype(np.float32)
        items = rng.standard_normal((n, 32)).astype(np.float32)
        if layout == "batch":        # one row per candidate, the user's features repeated on each
            inputs = {"user_features": np.repeat(user[None, :], n, axis=0), "item_features": items}
        elif layout == "padded":     # one row per user, candidates padded to HIGH
            padded = np.zeros((HIGH, 32), dtype=np.float32)
            padded[:n] = items
            inputs = {"user_features": user[None, :], "item_features": padded[None]}
        else:
            inputs = {"user_features": user[None, :], "item_features": items[None]}
        samples.append(Sample(line=index + 1, inputs=inputs))
    return samples


def wait_window(server: triton.TritonServer, limit_s: float = 75) -> None:
    start = time.monotonic()
    while server_metrics.scrape(server.metrics_url, MODEL).quantiles_us and time.monotonic() - start < limit_s:
        time.sleep(1)


def load(layout: str, doc: dict, args: argparse.Namespace, workdir: Path) -> None:
    rm, server = triton.server_for_model(doc, workdir / layout)
    with server:
        endpoint = Endpoint(server.http_url, MODEL)
        connection = endpoint.connect()
        info = connection.model_info()
        requests = [connection.build_request(s, info) for s in ranking_requests(layout, doc, 64)]
        for request in requests[:16]:
            connection.infer(request)
        connection.close()
        wait_window(server)
        before = server_metrics.scrape(server.metrics_url, MODEL)
        seen = replay(endpoint, requests, WarmupConfig(requests=args.requests, concurrency=args.concurrency,
                                                       max_p99_ms=1e9), info)
        report = server_metrics.run_report(before, server_metrics.scrape(server.metrics_url, MODEL))
    client = latency_stats([v for vs in seen.latencies_ms.values() for v in vs])
    print(f"{layout:>9}: {report['requestsPerExecution']:5.2f} requests/execution  "
          f"{report['avgBatchSize']:7.1f} items/execution  Triton P99 {report['p99Ms']:7.2f} ms  "
          f"client P99 {client['p99Ms']:7.2f} ms  {args.requests / seen.elapsed_s:6.0f} req/s  "
          f"errors {seen.error_count}")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def perf_analyzer_p99(server: triton.TritonServer, protocol: str, requests: int, batch: int,
                      workdir: Path) -> float:
    """NVIDIA's C++ client at concurrency 8, as the reference for what a client achieves here:
    its P99 (ms). It sends one batch size (-b) where the gate cycles through 8."""
    install = triton.ensure_installed()
    csv = workdir / f"perf_{protocol}.csv"
    url = server.grpc_url if protocol == "grpc" else server.http_url
    # Three windows of a third each; a stability criterion no run misses, so it stops there.
    command = [str(install.perf_analyzer), "-m", MODEL, "-u", url, "-i", protocol, "-b", str(batch),
               "--concurrency-range", "8", "--percentile=99", "--measurement-mode", "count_windows",
               "--measurement-request-count", str(max(1, requests // 3)), "--max-trials", "3",
               "-s", "100000", "-f", str(csv)]
    done = subprocess.run(command, env=install.perf_analyzer_environment(), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"perf_analyzer failed: {done.stdout[-800:]} {done.stderr[-800:]}")
    header, row = csv.read_text().splitlines()[:2]
    values = dict(zip(header.split(","), row.split(",")))
    return float(values["p99 latency"]) / 1000


def gate_client(doc: dict, args: argparse.Namespace, workdir: Path) -> None:
    from rankops.api.rankingmodel import RankingModel
    from rankops.rollout import jobs

    rm = RankingModel.model_validate(doc)
    command, *_ = jobs.gate_command(rm, "warmup", rm.spec.version, False)
    sizes = [int(b) for b in command[command.index("--batch-sizes") + 1].split(",")]
    specs = parse_input_spec([t.to_wire() for t in rm.spec.inputs])
    samples = generate_samples(specs, 2 * len(sizes), sizes)
    clients = [("gate, a process per core", 0), ("gate, one process", 1),
               ("perf_analyzer HTTP -b 300", "http"), ("perf_analyzer gRPC -b 300", "grpc")]
    clients = [c for c in clients if args.perf_analyzer or isinstance(c[1], int)]
    ratios: dict[str, list[float]] = {}
    _, server = triton.server_for_model(doc, workdir / "gate")
    with server:
        for round_ in range(args.gate_rounds):
            for label, how in clients:
                load = _load()
                if isinstance(how, int):
                    verdict = run_warmup(Endpoint(server.http_url, MODEL), samples, WarmupConfig(
                        requests=args.gate_requests, concurrency=8, max_p99_ms=1e9, processes=how,
                        metrics_url=server.metrics_url))
                    client, seen = verdict.metrics["p99Ms"], verdict.metrics["server"]
                else:   # the same wait for Triton's window to hold only this run
                    wait_window(server)
                    before = server_metrics.scrape(server.metrics_url, MODEL)
                    client = perf_analyzer_p99(server, how, args.gate_requests, 300, workdir)
                    seen = server_metrics.run_report(before, server_metrics.scrape(server.metrics_url, MODEL))
                ratio = client / seen["p99Ms"]
                ratios.setdefault(label, []).append(ratio)
                print(f"  {label:>26}: client P99 {client:6.2f} ms, Triton P99 {seen['p99Ms']:6.2f} ms, "
                      f"ratio {ratio:4.2f}  ({seen['requests']:.0f} requests, "
                      f"{seen['requestsPerExecution']:.1f} requests/execution; load {load} -> {_load()})", flush=True)
    if args.gate_rounds > 1:
        for label, values in ratios.items():
            print(f"  {label:>26}: median ratio {float(np.median(values)):4.2f} over {len(values)} runs "
                  f"({', '.join(f'{v:.2f}' for v in values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests per layout (default 1500)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    parser.add_argument("--gate-requests", type=int, default=2000, help="warmup gate requests (default 2000)")
    parser.add_argument("--gate-rounds", type=int, default=1, help="runs of each gate client (default 1)")
    parser.add_argument("--perf-analyzer", action="store_true",
                        help="also NVIDIA's perf_analyzer (HTTP, gRPC) as the reference client")
    parser.add_argument("--layouts", default="variable,padded,batch", help="'' for the gate part alone")
    args = parser.parse_args()
    workdir = triton.scratch_dir("rankops-batching-bench-")
    print(f"tritonserver {triton.TRITON_VERSION} (CPU stand-in for onnxruntime), {MODEL}, {LOW}-{HIGH} candidates "
          f"per request, concurrency {args.concurrency}, {args.requests} requests per layout")
    docs = layouts()
    for layout in filter(None, args.layouts.split(",")):
        load(layout, docs[layout], args, workdir)
    print(f"warmup gate at concurrency 8, {args.gate_requests} requests, batch layout:")
    gate_client(docs["batch"], args, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
