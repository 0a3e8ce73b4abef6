"""spec.latencyIsolation: a Triton pod the kubelet can pin (field guide 5.2: Triton on its GPU's NUMA node).

Kubernetes gives a pod the Guaranteed QoS class only when every container, init containers too,
has CPU and memory limits equal to its requests; then the static CPU manager gives each container
with a whole-number CPU request exclusive cores, and the topology manager (single-numa-node or
restricted) puts them on the GPU's NUMA node. One Burstable container (the fetcher's requests
differ from its limits by default) makes the whole pod Burstable and nothing is pinned.
"""
from __future__ import annotations

import copy
import math
from typing import Any

from rankops.api import bounds
from rankops.api.rankingmodel import ModelVersion, RankingModelSpec


def _quantity_max(a: str | None, b: str | None) -> str | None:
    present = [q for q in (a, b) if q is not None]
    return max(present, key=bounds.quantity) if present else None


def guaranteed(resources: dict[str, Any], whole_cpus: bool) -> dict[str, Any]:
    """requests == limits for cpu and memory, each the larger of the two; `whole_cpus` rounds the CPU
    up to whole cores (an exclusive core needs an integer request)."""
    requests, limits = dict(resources.get("requests") or {}), dict(resources.get("limits") or {})
    for name in ("cpu", "memory"):
        value = _quantity_max(requests.get(name), limits.get(name))
        if value is None:
            continue
        if name == "cpu" and whole_cpus:
            value = str(max(1, math.ceil(bounds.quantity(value))))
        requests[name] = limits[name] = value
    return {"requests": requests, "limits": limits}


def thread_settings(cpus: int, version: ModelVersion) -> tuple[list[str], list[dict[str, str]]]:
    """Triton arguments and environment that size its CPU thread pools to the pinned cores.

    ONNX Runtime otherwise starts one pool per model instance, each as large as the host's cores
    (onnxruntime_backend README: intra_op_thread_count 0 = number of cores); its global thread pool,
    set through --backend-config, is one pool of `cpus` threads for every instance. OMP_NUM_THREADS
    bounds libtorch's intra-op pool (the PyTorch backend's default is the number of cores)."""
    args = []
    if version.format.value == "onnx":
        args = ["--backend-config=onnxruntime,enable-global-threadpool=1",
                f"--backend-config=onnxruntime,intra_op_thread_count={cpus}",
                # inter-op threads serve only ORT's parallel execution mode; Triton's default is sequential.
                "--backend-config=onnxruntime,inter_op_thread_count=1"]
    return args, [{"name": "OMP_NUM_THREADS", "value": str(cpus)}]


def pinned(deployment: dict[str, Any], spec: RankingModelSpec, version: ModelVersion) -> dict[str, Any]:
    """The serving Deployment with a Guaranteed pod: init containers rounded up to whole CPUs (they
    run before Triton, and the CPU manager hands their cores on to the pod's containers), Triton at its
    whole CPUs, sidecars (warm) at requests == limits, possibly fractional: they run in the shared pool,
    off Triton's exclusive cores."""
    pinned_deployment = copy.deepcopy(deployment)
    pod = pinned_deployment["spec"]["template"]["spec"]
    cpus = int(bounds.quantity(spec.resources.cpu))
    for container in pod.get("initContainers") or []:
        container["resources"] = guaranteed(container.get("resources") or {}, whole_cpus=True)
    for container in pod["containers"]:
        gpu = {k: v for k, v in (container.get("resources") or {}).get("limits", {}).items() if k not in ("cpu", "memory")}
        resources = guaranteed(container.get("resources") or {}, whole_cpus=container["name"] == "triton")
        for part in ("requests", "limits"):
            resources[part].update(gpu)  # extended resources (nvidia.com/gpu) are requested = limited already
        container["resources"] = resources
        if container["name"] == "triton":
            args, env = thread_settings(cpus, version)
            container["args"] = [*container.get("args", []), *args]
            container["env"] = [*container.get("env", []), *env]
    return pinned_deployment
