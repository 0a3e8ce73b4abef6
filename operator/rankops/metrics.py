"""Prometheus metrics of the operator, on a registry of their own.

Handlers call the helpers below; `rankops run --metrics-port` serves REGISTRY with
`start_metrics_server`. The alerts and dashboard (charts/rankops-operator/files/) rely on these
names and labels: rename one there too. Per-model series carry `namespace` and `model` (the
RankingModel's name, which is also the Triton model name) so they join with Triton's own
metrics; the chart's ServiceMonitor keeps them with honorLabels.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import kopf
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client import start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

RECONCILES = Counter(
    "rankops_reconciles", "Handler runs by resource kind and result (success, retry, permanent_error, error).",
    ["kind", "result"], registry=REGISTRY)
RECONCILE_DURATION = Histogram(
    "rankops_reconcile_duration_seconds", "Wall time of one handler run by resource kind.",
    ["kind"], registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
ROLLOUTS = Counter(
    "rankops_rollouts", "Finished version rollouts by outcome (promoted, rolled_back, superseded).",
    ["namespace", "model", "outcome"], registry=REGISTRY)
GATE_RESULTS = Counter(
    "rankops_gate_results", "Gate verdicts by gate (warmup, equivalence) and outcome (pass, fail, error).",
    ["namespace", "model", "gate", "outcome"], registry=REGISTRY)
POOL_NODES = Gauge(
    "rankops_pool_nodes", "Nodes a GpuNodePool's selector matches.", ["pool"], registry=REGISTRY)
POOL_NODES_READY = Gauge(
    "rankops_pool_nodes_ready", "Nodes of a GpuNodePool whose latest validation passed.",
    ["pool"], registry=REGISTRY)
POOL_NODES_FAILING = Gauge(
    "rankops_pool_nodes_failing", "Nodes of a GpuNodePool whose latest validation failed.",
    ["pool"], registry=REGISTRY)
# The model's own targets, so alerts can compare Triton's numbers with them per model.
MODEL_SLO_P99 = Gauge(
    "rankops_model_slo_p99_latency_seconds", "spec.slo.p99LatencyMs of a RankingModel, in seconds.",
    ["namespace", "model"], registry=REGISTRY)
MODEL_TARGET_QPS = Gauge(
    "rankops_model_target_qps", "spec.slo.targetQps of a RankingModel.",
    ["namespace", "model"], registry=REGISTRY)
MODEL_MAX_BATCH = Gauge(
    "rankops_model_max_batch_size", "max_batch_size in the served config.pbtxt (explicit or planned).",
    ["namespace", "model"], registry=REGISTRY)

_MODEL_GAUGES = (MODEL_SLO_P99, MODEL_TARGET_QPS, MODEL_MAX_BATCH)


def result_of(exc: BaseException | None) -> str:
    """The `result` label for a handler that raised `exc` (None: it returned)."""
    if exc is None:
        return "success"
    if isinstance(exc, kopf.TemporaryError):
        return "retry"
    if isinstance(exc, kopf.PermanentError):
        return "permanent_error"
    return "error"


@contextmanager
def reconcile_timer(kind: str) -> Iterator[None]:
    """Count and time one handler run: `with reconcile_timer("RankingModel"): ...`.

    The exception, if any, is recorded and re-raised untouched, so kopf still sees it.
    """
    start = time.perf_counter()
    try:
        yield
    except BaseException as exc:
        RECONCILES.labels(kind=kind, result=result_of(exc)).inc()
        raise
    else:
        RECONCILES.labels(kind=kind, result="success").inc()
    finally:
        RECONCILE_DURATION.labels(kind=kind).observe(time.perf_counter() - start)


def record_rollout(namespace: str, model: str, outcome: str) -> None:
    ROLLOUTS.labels(namespace=namespace, model=model, outcome=outcome).inc()


def record_gate(namespace: str, model: str, gate: str, outcome: str) -> None:
    GATE_RESULTS.labels(namespace=namespace, model=model, gate=gate, outcome=outcome).inc()


def set_pool_nodes(pool: str, *, nodes: int, ready: int, failing: int) -> None:
    POOL_NODES.labels(pool=pool).set(nodes)
    POOL_NODES_READY.labels(pool=pool).set(ready)
    POOL_NODES_FAILING.labels(pool=pool).set(failing)


def forget_pool(pool: str) -> None:
    """Drop a deleted pool's series, so it does not alert forever on its last values."""
    for gauge in (POOL_NODES, POOL_NODES_READY, POOL_NODES_FAILING):
        try:
            gauge.remove(pool)
        except KeyError:
            pass


def set_model_targets(namespace: str, model: str, *, p99_latency_ms: float | None,
                      target_qps: float | None, max_batch_size: int | None) -> None:
    """Publish a model's SLO and batch limit; None removes that series (no SLO, no alert)."""
    for gauge, value in ((MODEL_SLO_P99, None if p99_latency_ms is None else p99_latency_ms / 1000.0),
                         (MODEL_TARGET_QPS, target_qps),
                         (MODEL_MAX_BATCH, max_batch_size)):
        if value is None:
            try:
                gauge.remove(namespace, model)
            except KeyError:
                pass
        else:
            gauge.labels(namespace=namespace, model=model).set(value)


def forget_model(namespace: str, model: str) -> None:
    for gauge in _MODEL_GAUGES:
        try:
            gauge.remove(namespace, model)
        except KeyError:
            pass


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> None:
    """Serve REGISTRY on http://addr:port/metrics from a daemon thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
