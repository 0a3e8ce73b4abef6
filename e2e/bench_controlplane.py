"""Prints how long the local control plane takes: start -> /readyz + controllers, kwok GPU
nodes Ready, a 2-replica GPU Deployment Ready, and a clean stop. Run from the repo root:

    .venv/bin/python -m e2e.bench_controlplane [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

from rankops_dev.binaries import ensure_binaries
from rankops_dev.cluster import add_nodes, api_client
from rankops_dev.controlplane import LocalControlPlane
from rankops_dev.nodes import E2E_NODES


def one_run(bin_dir) -> dict[str, float]:
    times: dict[str, float] = {}
    t0 = time.monotonic()
    plane = LocalControlPlane(bin_dir, log=lambda _: None).start()
    times["ready"] = time.monotonic() - t0
    try:
        add_nodes(plane.kubeconfig, E2E_NODES)
        times["nodes_ready"] = time.monotonic() - t0
        from kubernetes import client

        api = api_client(plane.kubeconfig)
        apps = client.AppsV1Api(api)
        labels = {"app": "bench"}
        t1 = time.monotonic()
        apps.create_namespaced_deployment("default", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bench"},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
                    "containers": [{"name": "m", "image": "pause",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
        while (apps.read_namespaced_deployment_status("bench", "default").status.ready_replicas
               or 0) < 2:
            if time.monotonic() - t1 > 60:
                raise TimeoutError("deployment not ready in 60s")
            time.sleep(0.1)
        times["deployment_ready"] = time.monotonic() - t1
        api.close()
    finally:
        t2 = time.monotonic()
        plane.stop()
        times["stop"] = time.monotonic() - t2
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    bin_dir = ensure_binaries()
    runs = [one_run(bin_dir) for _ in range(args.runs)]
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"{key:>18}: median {statistics.median(values):5.2f}s  "
              f"(min {min(values):.2f}, max {max(values):.2f}, runs {len(values)})")


if __name__ == "__main__":
    main()
