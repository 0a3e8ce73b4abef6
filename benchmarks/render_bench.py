"""Render speed: RankingModels rendered per second by the operator's pure path, and peak memory.

    .venv/bin/python benchmarks/render_bench.py [--count N] [-o table|json]

One render is what a reconcile computes before it talks to the API server: parse the body into a
RankingModel, resolve the serving shape (plan `batching: auto`, evaluate explicit batching that
has an SLO and a profile) and build the desired objects (stable track, a canary track for every
fourth model, the serving Service). The models vary format, precision, pool and batching; every
planned model has its own SLO, so each plan is computed once (simulations of the shared latency
profile are still memoised across models, as in the operator: larger counts plan faster per model).

"first" renders each model once from empty planner caches (a created or changed spec); "again"
renders them all a second time (the periodic reconcile of unchanged specs: plans come from the
planner's memo while it holds them). Memory is measured in a separate cold pass under tracemalloc
(which slows Python several-fold, so it is not timed); ru_maxrss is the whole process's peak.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from rankops.api.gpunodepool import GpuNodePool  # noqa: E402
from rankops.api.rankingmodel import RankingModel  # noqa: E402
from rankops.planner.search import clear_caches  # noqa: E402
from rankops.render.desired import RenderError, ServingState, desired_objects, resolve_shape  # noqa: E402

FORMATS = [("onnx", "fp32"), ("onnx", "fp16"), ("onnx", "int8"),
           ("tensorrt_plan", "fp16"), ("tensorrt_plan", "int8"), ("torchscript", "fp32")]
PROFILE = {1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6, 32: 8.1}
POOL = GpuNodePool.model_validate({
    "apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool", "metadata": {"name": "t4-pool"},
    "spec": {"nodeSelector": {"node.kubernetes.io/instance-type": "g4dn.xlarge"},
             "requirements": {"gpuProducts": ["Tesla-T4"], "minGpuMemoryMiB": 15000}}})


def kind_of(i: int) -> str:
    return ("auto", "explicit", "explicit+slo")[i % 3]


def model_body(i: int) -> dict[str, Any]:
    """A RankingModel as kopf hands it over: a plain dict, with a uid for ownerReferences."""
    fmt, precision = FORMATS[i % len(FORMATS)]
    spec: dict[str, Any] = {
        "replicas": 1 + i % 4, "instancesPerGpu": 1 + i % 2, "version": "2",
        "versions": [{"name": "1", "modelUri": f"s3://models/m{i}/1", "format": "onnx", "precision": "fp32"},
                     {"name": "2", "modelUri": f"s3://models/m{i}/2", "format": fmt, "precision": precision}],
        "inputs": [{"name": "user_features", "dataType": "FP32", "dims": [64]},
                   {"name": "item_features", "dataType": "FP32", "dims": [-1, 32], "maxDims": [500, 32]}],
        "outputs": [{"name": "scores", "dataType": "FP32", "dims": [-1], "maxDims": [500]}],
        "modelWarmup": {"batchSizes": [1, 8]},
    }
    if i % 2:
        spec["nodePool"] = POOL.metadata["name"]
    # A distinct SLO per model: no two planned models share a plan.
    slo = {"p99LatencyMs": 10 + (i // 3) % 10, "targetQps": 1000 + 10 * i}
    kind = kind_of(i)
    if kind == "auto":
        spec.update(batching="auto", slo=slo, planning={"gpuMemoryMiB": 15360, "latencyProfile": PROFILE})
    else:
        spec["batching"] = {"maxBatchSize": 16, "preferredBatchSizes": [4, 8], "maxQueueDelayMicroseconds": 500}
        if kind == "explicit+slo":
            spec.update(slo=slo, planning={"latencyProfile": PROFILE})
    return {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": f"ranker-{i}", "namespace": "reco", "uid": f"uid-{i}", "generation": 1},
            "spec": spec}


def render(body: dict[str, Any], canary: bool) -> int:
    """Objects of one reconcile's render (raises RenderError where the operator reports Degraded)."""
    rm = RankingModel.model_validate(body)
    resolved = resolve_shape(rm.spec)
    state = ServingState("1", "2", True, 1) if canary else ServingState("2")
    pool = POOL.spec.requirements if rm.spec.node_pool else None
    return len(desired_objects(rm, state, resolved, pool))


def timed_pass(bodies: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Seconds and render counts per batching kind for one pass over every model."""
    stats: dict[str, dict[str, float]] = {}
    for i, body in enumerate(bodies):
        row = stats.setdefault(kind_of(i), {"models": 0, "seconds": 0.0, "objects": 0, "failed": 0})
        start = time.perf_counter()
        try:
            row["objects"] += render(body, canary=i % 4 == 0)
        except RenderError:
            row["failed"] += 1
        row["seconds"] += time.perf_counter() - start
        row["models"] += 1
    return stats


def with_total(stats: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    total = {key: sum(row[key] for row in stats.values()) for key in ("models", "seconds", "objects", "failed")}
    out = {kind: dict(row) for kind, row in sorted(stats.items())}
    out["all"] = total
    for row in out.values():
        row["renders_per_s"] = row["models"] / row["seconds"] if row["seconds"] else 0.0
        row["mean_ms"] = 1000 * row["seconds"] / row["models"] if row["models"] else 0.0
    return out


def peak_tracemalloc_mib(bodies: list[dict[str, Any]]) -> float:
    clear_caches()
    tracemalloc.start()
    try:
        timed_pass(bodies)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def maxrss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['count']} RankingModels, CPUs: {result['cpus']}, python {result['python']}")
    print(f"{'pass':6s} {'batching':13s} {'models':>6s} {'renders/s':>10s} {'mean ms':>9s} {'objects':>8s} {'failed':>6s}")
    for name, rows in (("first", result["first"]), ("again", result["again"])):
        for kind, row in rows.items():
            print(f"{name:6s} {kind:13s} {row['models']:6d} {row['renders_per_s']:10.1f} {row['mean_ms']:9.2f} "
                  f"{row['objects']:8d} {row['failed']:6d}")
    print(f"peak traced Python memory (cold pass): {result['tracemalloc_peak_mib']:.1f} MiB; "
          f"process ru_maxrss: {result['ru_maxrss_mib']:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=120, help="RankingModels to render (default 120)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count must be at least 1")
    bodies = [model_body(i) for i in range(args.count)]
    for body in itertools.islice(bodies, 3):  # warm imports (planner, numpy) outside the timing
        render(body, canary=False)
    clear_caches()
    first = with_total(timed_pass(bodies))
    again = with_total(timed_pass(bodies))
    result = {"count": args.count, "cpus": os.cpu_count(), "python": sys.version.split()[0],
              "first": first, "again": again, "tracemalloc_peak_mib": peak_tracemalloc_mib(bodies),
              "ru_maxrss_mib": maxrss_mib()}
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
