"""What a shared server's autoscaling costs the operator per reading (issue 42): the CPU of one
decision (server_autoscale.step: the members' rates, the admission's time rule at those rates, the
windows) and the size of status.autoscaling, for N members read on 4 pods, over 30 readings 10 s
apart at three plateaus of load with +-5% noise per member (a restart-safe status round trip
between), with maxReplicas 16 and 1000 (the rule bisects the card count).

    .venv/bin/python benchmarks/server_autoscale_bench.py [--members 3 32] [--readings 30] [--max-replicas 16 1000]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time

from rankops import server_autoscale
from rankops.api.rankingmodel import RankingModel
from rankops.api.sharedserver import ServerAutoscalingStatus, SharedServerSpec
from rankops.planner import inputs_from_spec
from rankops.planner.pack import ModelToPack

PODS = 4


def member(name: str) -> ModelToPack:
    spec = RankingModel.model_validate({
        "metadata": {"name": name, "namespace": "reco"},
        "spec": {"version": "1", "replicas": 2, "versions": [{"name": "1", "modelUri": f"s3://models/{name}/1", "format": "onnx"}],
                 "inputs": [{"name": "x", "dataType": "FP32", "dims": [16]}],
                 "outputs": [{"name": "scores", "dataType": "FP32", "dims": [1]}],
                 "batching": {"maxBatchSize": 64, "preferredBatchSizes": [32, 64], "maxQueueDelayMicroseconds": 500},
                 "slo": {"p99LatencyMs": 40, "targetQps": 300},
                 "planning": {"latencyProfile": {1: 1.0, 64: 4.0}, "failureTolerance": 1,
                              "memory": {"weightsMiB": 200, "activationMiBPerItem": 0.1, "runtimeReserveMiB": 1024}}}}
    ).spec
    return ModelToPack(name, inputs_from_spec(spec, gpu_memory_mib=15360))


def run(members: int, readings: int, max_replicas: int) -> str:
    spec = SharedServerSpec(gpuMemoryMiB=15360, maxReplicas=max_replicas, autoscaling={"enabled": True})
    names = [f"m{i:02d}" for i in range(members)]
    group = [member(n) for n in names]
    rng = random.Random(1)
    t0 = dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc)
    counts = {f"p{i}": {n: 0.0 for n in names} for i in range(PODS)}
    recorded, previous, cpu, pods = None, None, [], []
    for k in range(readings):
        level = 100 + 250 * (1 + 3 * k // readings)
        for pod in counts.values():
            for n in names:
                pod[n] += level * rng.uniform(0.95, 1.05) * 10 / PODS
        at = t0 + dt.timedelta(seconds=10 * k)
        reading = {pod: server_autoscale.pod_reading(at, c) for pod, c in counts.items()}
        began = time.process_time()
        scaled = server_autoscale.step(spec, recorded, reading, group, 2, at, previous=previous)
        cpu.append(time.process_time() - began)
        previous = reading
        pods.append(scaled.replicas)
        recorded = ServerAutoscalingStatus.model_validate(scaled.status.model_dump(by_alias=True, exclude_none=True))
    ordered = sorted(cpu)
    size = len(json.dumps(scaled.status.model_dump(by_alias=True, exclude_none=True)))
    changes = sum(1 for a, b in zip(pods, pods[1:]) if a != b)
    return (f"{members:>3} members, maxReplicas {max_replicas:>4}: CPU per reading median {ordered[len(ordered) // 2] * 1000:6.0f} ms, "
            f"max {ordered[-1] * 1000:6.0f} ms; pods {pods[0]} -> {pods[-1]} ({changes} change(s)); "
            f"status.autoscaling {size} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, nargs="+", default=[3, 32])
    parser.add_argument("--readings", type=int, default=30)
    parser.add_argument("--max-replicas", type=int, nargs="+", default=[16, 1000])
    args = parser.parse_args()
    for n in args.members:
        for most in args.max_replicas:
            print(run(n, args.readings, most))


if __name__ == "__main__":
    main()
