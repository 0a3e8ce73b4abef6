"""The `warm` container of a Triton pod (gates/warm.py runs in it): the pod is Ready only once
its own Triton has been replayed the warmup requests and answers within the bound."""
from __future__ import annotations

from typing import Any

from rankops.api import bounds
from rankops.api.rankingmodel import RankingModelSpec
from rankops.render import gate_requests

WARM_PORT = 8090
# requests == limits, so the pod keeps Triton's Guaranteed QoS (and its pinned CPUs). The replay
# is one process with `concurrency` threads; once warm it only answers probes and polls Triton.
WARM_CPU = "250m"
# The process with its imports peaked at 70 MiB replaying the example's requests (measured);
# each request is held as arrays and as its encoded body, with the client's copies on the way.
# Capped at the gate Job's limit (which holds the same requests).
BASE_MEMORY_MIB, COPIES_PER_REQUEST, MAX_MEMORY_MIB = 192, 4, 4096


def warm_memory_mib(spec: RankingModelSpec) -> int:
    """What the process holds: a base, and the requests it sends (generated: the largest shapes)."""
    sizes = gate_requests.batch_sizes(spec)
    count = gate_requests.warmup_sample_count(spec, spec.rollout.warmup.requests)
    # Request i has batch size sizes[i % len(sizes)]: each size counted once, times its requests.
    times = [count // len(sizes) + (1 if j < count % len(sizes) else 0) for j in range(len(sizes))]
    held = sum(n * bounds.tensor_bytes(t.data_type.value, t.warmup_dims(), max(1, size))
               for size, n in zip(sizes, times) if n for t in spec.inputs)
    return min(MAX_MEMORY_MIB, BASE_MEMORY_MIB + -(-COPIES_PER_REQUEST * held // 2 ** 20))


def warm_resources(spec: RankingModelSpec) -> dict[str, str]:
    return {"cpu": WARM_CPU, "memory": f"{warm_memory_mib(spec)}Mi"}


def warm_container(model: str, spec: RankingModelSpec, http_port: int, metrics_port: int,
                   security_context: dict[str, Any], image: str | None = None,
                   tmp_size: str = "256Mi") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The container and the volumes it needs (an optional samples ConfigMap, its own /tmp: its
    root filesystem is read-only). `image`: the cluster's fetcher image (default the spec's)."""
    w, gate = spec.warm_replicas, spec.rollout.warmup
    args, volumes, mounts = gate_requests.samples_args(
        spec, gate.samples, gate_requests.warmup_sample_count(spec, gate.requests), optional=True)
    command = ["rankops", "warm", "--host", "$(POD_IP)", "--http-port", str(http_port),
               "--metrics-port", str(metrics_port), "--port", str(WARM_PORT), "--model", model,
               "--requests", str(w.requests), "--concurrency", str(w.concurrency),
               "--max-p99-ms", str(w.max_p99_ms or gate.max_p99_ms), "--deadline-s", str(w.deadline_seconds),
               "--max-error-ratio", f"{w.max_error_ratio:g}",
               # With the response cache on, every request differs: the model is warmed, not the cache.
               *(["--unique-requests"] if spec.response_cache else []), *args]
    container = {
        "name": "warm",
        "image": image or spec.fetcher_image,
        "command": command,
        # The pod's own address, which Triton listens on (every interface of the pod).
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "warm", "containerPort": WARM_PORT}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "warm"}, "periodSeconds": 2, "failureThreshold": 1},
        # A model failing its warm requests exits with the reason here (the operator reads it from
        # the pod's status); a crash leaves its log's tail instead.
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "warm"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {**warm_resources(spec), "ephemeral-storage": tmp_size},
                      "limits": {**warm_resources(spec), "ephemeral-storage": tmp_size}},
        "securityContext": security_context,
        "volumeMounts": [*mounts, {"name": "warm-tmp", "mountPath": "/tmp"}],
    }
    return container, [*volumes, {"name": "warm-tmp", "emptyDir": {"sizeLimit": tmp_size}}]
