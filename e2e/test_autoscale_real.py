"""spec.autoscaling on real Triton in real containers (conftest's `real`, with `REAL_NODES = 2`:
two kubelets and containerds in the cluster's network namespace, the operator the chart's pod):
the load steps up and down by a factor of 5 and the stable replicas follow, each new one taking
traffic only once warm, none failing a request as it goes. The traffic is sent from inside the
cluster's namespace; every replica that served ran in containerd's containers on the real nodes.

What a replica serves is its own, not a share of the machine: the CPU stand-in sleeps a device
time of 10 + 2 x rows ms per execution (DEVICE_MS, triton_standin.py), which costs no CPU.
Measured on this machine (one stand-in, its processes under a 500m CFS quota as the container's
limit puts them, requests of 20-60 candidates): 10.0 req/s one request at a time (P50 103 ms,
P99 135 ms), 11.1-11.2 req/s saturated (4 and 8 in flight); without the device time the same
capped replica served 1,265 req/s (4 in flight), which no load this machine can send would scale.
So capacityPerReplicaQps 8 (72% of saturation) at targetUtilization 1 and
planning.failureTolerance 0: 5 req/s needs 1 replica and 25 req/s 3 (ceil(25 / 8) = 4, capped
at maxReplicas). At 10 (90% of saturation) the closed loop stalled at 2 replicas: 4 drivers got
~16 req/s out of them, under the 20 that a third needs. A driver waits for each answer (100-250
ms, batches of 20-60 rows): DRIVERS = 8 share the rate, so 25 req/s can be offered at all, and at
most 8 requests wait while the replicas are too few.

Two real nodes: each advertises the machine's 2 cores and 2 GPUs, and a replica requests one GPU
and 750m (Triton 500m, the warm container 250m): the third replica needs the second node's GPUs.
The operator reads each serving pod's Triton counters every --interval (2 s here, the chart's
operator.extraArgs; a reading at most every 5 s); the scale-down window is 20 s instead of 300 s.
`run_phases` is also the benchmark's (benchmarks/autoscale_bench.py).
"""
from __future__ import annotations

import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from e2e import models
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.triton.samples import Sample
from rankops.render import names
from rankops_dev import netns as namespaces
from rankops_dev import spec_models, traffic

REAL_NODES = 2
REAL_CHART_VALUES = ("operator.extraArgs[0]=--interval=2",)   # fast metric reads (the default is 10 s)
pytestmark = pytest.mark.usefixtures("real_operator_logs_no_errors")

NAME = "scaled"
SPEC = {
    "inputs": [{"name": "user_id", "dataType": "INT64", "dims": [1]},
               {"name": "item_features", "dataType": "FP32", "dims": [32]}],
    "outputs": [{"name": "scores", "dataType": "FP32", "dims": [1]}],
    "candidates": {"layout": "batch", "minPerRequest": 20, "maxPerRequest": 60},
    "batching": {"maxBatchSize": 256, "maxQueueDelayMicroseconds": 1000},
    "resources": {"cpu": "500m", "memory": "1Gi"},
    "planning": {"failureTolerance": 0},
    "slo": {"p99LatencyMs": 250, "targetQps": 25},
    "warmReplicas": {"requests": 40, "concurrency": 2, "maxP99Ms": 3000},
    "disruption": {"preStopDelaySeconds": 3, "exitTimeoutSeconds": 10},
    "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "capacityPerReplicaQps": 8,
                    "targetUtilization": 1.0, "scaleDownStabilizationSeconds": 20},
}
DEVICE_MS = (10.0, 2.0)   # the stand-in's device time a + b x rows ms per execution: ~11 req/s a replica
DRIVERS = 8               # traffic drivers sharing a phase's rate (each waits for its answers)


def _request(rng: np.random.Generator) -> Sample:
    candidates = int(rng.integers(20, 61))
    return Sample(line=1, inputs={"user_id": np.full((candidates, 1), int(rng.integers(0, 10)), dtype=np.int64),
                                  "item_features": rng.standard_normal((candidates, 32)).astype(np.float32)})


@dataclass
class Phase:
    rate: float
    started: float = 0.0
    ended: float = 0.0
    wanted: int = 0                       # the replicas this load needs
    reached: float | None = None          # when that many were Ready (and warm) and no more
    ms: list[float] = field(default_factory=list)
    answers: list[tuple[float, float]] = field(default_factory=list)   # (sent at, ms)
    sent: int = 0
    failed: int = 0
    failures: list[tuple[str, float, str]] = field(default_factory=list)
    server_p99_ms: float | None = None    # Triton's own, at the phase's end (its window: the last minute)


class Replicas(threading.Thread):
    """Samples (time, desired, Ready) of the stable Deployment every half second, and the node and
    container IDs of every stable pod seen running (`pods`: name -> (node, {container: ID}))."""

    def __init__(self, k8s, namespace: str):
        super().__init__(daemon=True)
        self.k8s, self.namespace = k8s, namespace
        self.samples: list[tuple[float, int, int]] = []
        self.pods: dict[str, tuple[str, dict[str, str]]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                dep = self.k8s.apps.read_namespaced_deployment(names.deployment_name(NAME, names.STABLE),
                                                               self.namespace)
                pods = self.k8s.core.list_namespaced_pod(
                    self.namespace, label_selector=f"{names.LABEL_MODEL}={NAME},{names.LABEL_TRACK}={names.STABLE}")
            except Exception:  # noqa: BLE001 - a sample missed is a sample missed
                continue
            self.samples.append((time.time(), dep.spec.replicas or 0, dep.status.ready_replicas or 0))
            for pod in pods.items:
                started = {c.name: c.container_id for c in pod.status.container_statuses or [] if c.container_id}
                if started:   # merged: a container started after another is still the pod's
                    seen = self.pods.get(pod.metadata.name, (None, {}))[1]
                    self.pods[pod.metadata.name] = (pod.spec.node_name, {**seen, **started})

    def ready_now(self) -> int:
        return self.samples[-1][2] if self.samples else 0

    def replica_seconds(self, start: float, end: float) -> float:
        """Integral of the desired replicas (what is paid for) over [start, end]."""
        points = [(t, d) for t, d, _ in self.samples if start <= t <= end]
        return sum(d * (b - a) for (a, d), (b, _) in zip(points, points[1:]))


def serve(k8s, ns: str, object_store, tmp_path, spec_doc: dict | None = None,
          device_ms: tuple[float, float] | None = None, **overrides: Any) -> None:
    """Serve NAME with SPEC (or `spec_doc`) and `overrides`. `device_ms` (a, b): the CPU stand-in
    also sleeps a + b x rows ms per execution, a device's compute time (triton_standin.py)."""
    body = models.model_manifest(NAME, modelCredentialsSecret="model-store", **{**(spec_doc or SPEC), **overrides})
    body["spec"]["versions"][0]["precision"] = "fp32"
    spec = RankingModelSpec.model_validate(body["spec"])
    directory = tmp_path / "v1"
    spec_models.export(spec, ModelFormat.onnx, directory, seed=0)
    if device_ms is not None:
        write_device_ms(directory, *device_ms)
    object_store.upload_tree("models", f"{NAME}/1", directory)
    k8s.core.create_namespaced_secret(ns, object_store.secret_manifest("model-store", ns))
    models.create(k8s, ns, body)
    models.wait_ready(k8s, ns, NAME, timeout=240)


def write_device_ms(directory, a_ms: float, b_ms: float) -> None:
    import json

    (directory / "standin_device_ms.json").write_text(json.dumps({"a_ms": a_ms, "b_ms": b_ms}))


class _SharedAddresses:
    """One listing of the serving pods per traffic.REFRESH_S for all of a phase's drivers, not
    one per driver (24 drivers: 48 pod lists a second, deserialised in this process)."""

    def __init__(self, lookup):
        self.lookup, self.lock = lookup, threading.Lock()
        self.at, self.found = float("-inf"), []

    def __call__(self) -> list[str]:
        with self.lock:
            if time.monotonic() - self.at >= traffic.REFRESH_S:
                self.found, self.at = list(self.lookup()), time.monotonic()
            return list(self.found)


def run_phases(k8s, ns: str, phases: list[tuple[float, float, int]], replicas: Replicas, netns: str | None,
               settle_timeout: float = 120, drivers: int = 1) -> list[Phase]:
    """Each (rate, seconds, replicas wanted): traffic at that rate for at least `seconds`, and on
    until the stable has that many replicas Ready and no more (at most `settle_timeout` more).
    `netns`: the real cluster's network namespace, which the drivers send from (the pod IPs are
    reachable only there).

    A driver waits for each answer before its next request: one driver never has two requests
    in flight. `drivers` > 1 share the rate, up to that many in flight (what a queue needs to
    show, and what a rate above one driver's 1 / latency needs)."""
    done = []
    for rate, seconds, wanted in phases:
        phase = Phase(rate, started=time.time(), wanted=wanted)
        addresses = _SharedAddresses(lambda: traffic.serving_addresses(k8s.core, ns, NAME))
        group = [traffic.Traffic(addresses, NAME, _request,
                                 rate=rate / drivers, max_seconds=seconds + settle_timeout + 30, timeout_s=10,
                                 seed=5 + i, netns=netns) for i in range(drivers)]
        for driver in group:   # staggered by 1 / rate: together, one request every 1 / rate
            driver.start()
            if drivers > 1:
                time.sleep(1 / rate)
        try:
            deadline = time.time() + seconds + settle_timeout
            while time.time() < deadline:
                last = replicas.samples[-1] if replicas.samples else (0, 0, 0)
                if phase.reached is None and last[1] == wanted and last[2] == wanted:
                    phase.reached = last[0]
                if phase.reached is not None and time.time() - phase.started >= seconds:
                    break
                time.sleep(0.5)
            phase.server_p99_ms = server_p99_ms(k8s, ns, NAME, netns)
        finally:
            for driver in group:
                driver.stop.set()
            for driver in group:
                driver.join(timeout=30)
        phase.ended = time.time()
        served = sorted((a for driver in group for a in driver.served), key=lambda a: a.sent_at)
        phase.ms = [a.ms for a in served]
        phase.answers = [(a.sent_at, a.ms) for a in served]
        phase.sent, phase.failed = sum(d.sent for d in group), sum(d.failed for d in group)
        phase.failures = [f for driver in group for f in driver.failures]
        done.append(phase)
    return done


def server_p99_ms(k8s, ns: str, name: str, netns: str | None) -> float | None:
    """The worst serving pod's P99 by Triton's own latency summary (its window: about the last
    minute), ms: the server side of the latency, without the client's. Read from inside the
    cluster's network namespace `netns` (a thread that enters it: the pod IPs are only there;
    None: from here, as on kind)."""
    pages: list[str] = []

    def read_inside(addresses: list[str]) -> None:
        if netns:   # None: this machine routes to the pods (kind)
            namespaces.enter_thread(netns)
        for address in addresses:
            try:
                with urllib.request.urlopen(f"http://{address}:8002/metrics", timeout=5) as resp:
                    pages.append(resp.read().decode())
            except OSError:
                continue

    reader = threading.Thread(target=read_inside, daemon=True,
                              args=(traffic.serving_addresses(k8s.core, ns, name),))
    reader.start()
    reader.join(30)
    worst = None
    for text in pages:
        for m in re.finditer(r'^nv_inference_request_summary_us\{[^}]*quantile="0\.99"[^}]*\} (\S+)$', text, re.M):
            value = float(m.group(1))
            if value == value:   # NaN: no request in the window
                worst = max(worst or 0.0, value / 1000)
    return worst


def p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


def in_real_containers(real, replicas: Replicas) -> set[str]:
    """The pods `replicas` saw, after checking each ran its Triton and warm container in a real
    runtime's containers (containerd's IDs) on a real node; returns their names."""
    for pod, (node, containers) in replicas.pods.items():
        assert node in real.node_names, (pod, node, real.node_names)
        assert set(containers) == {"triton", "warm"}, (pod, containers)
        assert all(cid.startswith("containerd://") for cid in containers.values()), (pod, containers)
    return set(replicas.pods)


def test_replicas_follow_the_load_up_and_down_and_no_request_fails_as_they_go(
        real, real_k8s, real_namespace_in, tmp_path):
    k8s, ns = real_k8s, real_namespace_in
    serve(k8s, ns, real.store, tmp_path, device_ms=DEVICE_MS, tritonImage=real.refs["rankops-triton-test"])
    replicas = Replicas(k8s, ns)
    replicas.start()
    try:
        low, high, down = run_phases(k8s, ns, [(5, 15, 1), (25, 10, 3), (5, 10, 1)], replicas, real.netns,
                                     drivers=DRIVERS)
    finally:
        replicas.stop.set()
        replicas.join(5)
    rm = models.get(k8s, ns, NAME)
    scaling = rm["status"]["autoscaling"]
    report = [{"rate": p.rate, "reached_s": None if p.reached is None else round(p.reached - p.started, 1),
               "sent": p.sent, "failed": p.failed, "p99_ms": round(p99(p.ms) or 0, 1),
               "p99_after_ms": round(p99([ms for at, ms in p.answers if p.reached is not None and at >= p.reached])
                                     or 0, 1),
               "server_p99_ms": p.server_p99_ms} for p in (low, high, down)]
    pods = in_real_containers(real, replicas)
    print(f"\nphases: {report}\nstatus.autoscaling: { {k: v for k, v in scaling.items() if k != 'reading'} }"
          f"\nstable pods seen: { {p: n for p, (n, _) in replicas.pods.items()} }")
    assert high.reached is not None, f"3 replicas Ready under 25 req/s: {report} {scaling}"
    assert down.reached is not None, f"back to 1 replica under 5 req/s: {report} {scaling}"
    assert low.failed == 0 and down.failed == 0 and high.failed == 0, \
        f"no request fails as replicas come and go: {(low.failures + high.failures + down.failures)[:5]}"
    assert len(pods) >= 3 and {n for n, _ in replicas.pods.values()} == set(real.node_names), replicas.pods
    assert scaling["mode"] == "rankops" and scaling["capacitySource"] == "spec" and scaling["desiredReplicas"] == 1
    assert scaling["observedQps"] and 2 < scaling["observedQps"] < 10, scaling
    scaled = [e.message for e in models.events_for(k8s, ns, NAME) if e.reason == "Scaled"]
    assert any("1 -> 3" in m or "1 -> 2" in m for m in scaled) and any(m.split(":")[0].endswith("-> 1")
                                                                       for m in scaled), scaled
    assert models.printer_columns(real, ns, NAME)["AUTOSCALED"] == "1"
