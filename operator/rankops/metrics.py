"""Prometheus metrics of the operator, on a registry of their own.

The handlers call the observe_*/set_* helpers; `rankops run --metrics-port` serves REGISTRY with
`start_metrics_server`. The alerts and the dashboard (charts/rankops-operator/files/) use these
names and labels: rename one there too (tests/test_metrics.py checks they agree). The per-model
gauges carry `namespace` and `model` (the RankingModel's name, also the Triton model name) so
alerts can join them with Triton's own metrics; the chart's ServiceMonitor keeps those labels
with honorLabels.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client import start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

RECONCILES = Counter(
    "rankops_reconciles", "Reconciles by resource kind and result (ok, degraded, error).",
    ["kind", "result"], registry=REGISTRY)
RECONCILE_DURATION = Histogram(
    "rankops_reconcile_duration_seconds", "Wall time of one reconcile by resource kind.",
    ["kind"], registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
ROLLOUTS = Counter(
    "rankops_rollouts", "Finished version rollouts by outcome (e.g. promoted, rolled_back, superseded).",
    ["outcome"], registry=REGISTRY)
GATE_RESULTS = Counter(
    "rankops_gate_results", "Gate verdicts by gate (warmup, equivalence) and outcome (pass, fail, error).",
    ["gate", "outcome"], registry=REGISTRY)
POOL_NODES = Gauge(
    "rankops_pool_nodes", "Nodes a GpuNodePool's selector matches.", ["pool"], registry=REGISTRY)
POOL_NODES_READY = Gauge(
    "rankops_pool_nodes_ready", "Nodes of a GpuNodePool whose latest validation passed.",
    ["pool"], registry=REGISTRY)
POOL_NODES_FAILING = Gauge(
    "rankops_pool_nodes_failing", "Nodes of a GpuNodePool whose latest validation failed.",
    ["pool"], registry=REGISTRY)
# A model's own targets, so alerts can hold Triton's numbers against them per model.
MODEL_SLO_P99 = Gauge(
    "rankops_model_slo_p99_latency_seconds", "spec.slo.p99LatencyMs of a RankingModel, in seconds.",
    ["namespace", "model"], registry=REGISTRY)
MODEL_TARGET_QPS = Gauge(
    "rankops_model_target_qps", "spec.slo.targetQps of a RankingModel.",
    ["namespace", "model"], registry=REGISTRY)
MODEL_MAX_BATCH = Gauge(
    "rankops_model_max_batch_size", "max_batch_size of the served config.pbtxt (explicit or planned).",
    ["namespace", "model"], registry=REGISTRY)


def observe_reconcile(kind: str, result: str, seconds: float) -> None:
    RECONCILES.labels(kind=kind, result=result).inc()
    RECONCILE_DURATION.labels(kind=kind).observe(seconds)


def observe_rollout(outcome: str) -> None:
    ROLLOUTS.labels(outcome=outcome).inc()


def observe_gate(gate: str, outcome: str) -> None:
    GATE_RESULTS.labels(gate=gate, outcome=outcome).inc()


def set_pool_nodes(pool: str, ready: int, failing: int, nodes: int | None = None) -> None:
    POOL_NODES_READY.labels(pool=pool).set(ready)
    POOL_NODES_FAILING.labels(pool=pool).set(failing)
    if nodes is not None:
        POOL_NODES.labels(pool=pool).set(nodes)


def set_model_targets(namespace: str, model: str, *, p99_latency_ms: float | None,
                      target_qps: float | None, max_batch_size: int | None) -> None:
    """Publish a model's SLO and batch limit; None drops that series (no SLO: no SLO alert)."""
    for gauge, value in ((MODEL_SLO_P99, None if p99_latency_ms is None else p99_latency_ms / 1000.0),
                         (MODEL_TARGET_QPS, target_qps),
                         (MODEL_MAX_BATCH, max_batch_size)):
        if value is None:
            _remove(gauge, namespace, model)
        else:
            gauge.labels(namespace=namespace, model=model).set(value)


def forget_pool(pool: str) -> None:
    """Drop a deleted pool's series, so it does not alert forever on its last values."""
    for gauge in (POOL_NODES, POOL_NODES_READY, POOL_NODES_FAILING):
        _remove(gauge, pool)


def forget_model(namespace: str, model: str) -> None:
    for gauge in (MODEL_SLO_P99, MODEL_TARGET_QPS, MODEL_MAX_BATCH):
        _remove(gauge, namespace, model)


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:  # never set: nothing to drop
        pass


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> None:
    """Serve REGISTRY on http://addr:port/metrics from a daemon thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
