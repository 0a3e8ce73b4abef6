"""Prometheus metrics of the operator, on a registry of their own.

The handlers hand each reconcile's result to `observe_reconcile` and `record_model` /
`record_pool`; `rankops run --metrics-port` serves REGISTRY with `start_metrics_server`. The
alerts and the dashboard (charts/rankops-operator/files/) use these names and labels: rename one
there too (tests/test_metrics.py checks they agree). The per-model gauges carry `namespace` and
`model` (the RankingModel's name, also the Triton model name) so alerts can join them with
Triton's own metrics; the chart's ServiceMonitor keeps those labels with honorLabels.
"""
from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client import start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

RECONCILES = Counter(
    "rankops_reconciles", "Reconciles by resource kind and result (ok, degraded, error; skipped: its namespace is being deleted).",
    ["kind", "result"], registry=REGISTRY)
RECONCILE_DURATION = Histogram(
    "rankops_reconcile_duration_seconds", "Wall time of one reconcile by resource kind.",
    ["kind"], registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
ROLLOUTS = Counter(
    "rankops_rollouts", "Finished version rollouts by outcome (promoted, rolled_back, superseded, canceled).",
    ["outcome"], registry=REGISTRY)
GATE_RESULTS = Counter(
    "rankops_gate_results", "Gate verdicts by gate (warmup, equivalence) and outcome (pass, fail, error).",
    ["gate", "outcome"], registry=REGISTRY)
API_REQUESTS = Counter(
    "rankops_api_requests", "Requests the operator's reconcilers made to the API server, by verb and resource "
    "(kopf's own watches and patches are not counted).", ["verb", "resource"], registry=REGISTRY)
POOL_NODES = Gauge(
    "rankops_pool_nodes", "Nodes a GpuNodePool's selector matches.", ["pool"], registry=REGISTRY)
POOL_NODES_READY = Gauge(
    "rankops_pool_nodes_ready", "Nodes of a GpuNodePool whose latest validation passed.",
    ["pool"], registry=REGISTRY)
POOL_NODES_FAILING = Gauge(
    "rankops_pool_nodes_failing", "Nodes of a GpuNodePool whose latest validation failed.",
    ["pool"], registry=REGISTRY)
# A model's own targets, so alerts can hold Triton's numbers against them per model.
# `model_namespace` repeats `namespace`: OpenShift's user-workload monitoring overwrites
# `namespace` with the ServiceMonitor's (the operator's) on every scraped series, and leaves this
# one alone; the alerts join on it (charts/rankops-operator/files/alerts.yaml).
MODEL_LABELS = ["namespace", "model", "model_namespace"]
MODEL_SLO_P99 = Gauge(
    "rankops_model_slo_p99_latency_seconds", "spec.slo.p99LatencyMs of a RankingModel, in seconds.",
    MODEL_LABELS, registry=REGISTRY)
MODEL_TARGET_QPS = Gauge(
    "rankops_model_target_qps", "spec.slo.targetQps of a RankingModel.",
    MODEL_LABELS, registry=REGISTRY)
MODEL_MAX_BATCH = Gauge(
    "rankops_model_max_batch_size", "max_batch_size of the served config.pbtxt (explicit or planned).",
    MODEL_LABELS, registry=REGISTRY)

# spec.autoscaling (status.autoscaling): what the autoscaler saw and decided, per model.
MODEL_AUTOSCALE_DESIRED = Gauge(
    "rankops_model_autoscale_desired_replicas", "Stable replicas spec.autoscaling decided (or the user's autoscaler set).",
    MODEL_LABELS, registry=REGISTRY)
MODEL_OBSERVED_QPS = Gauge(
    "rankops_model_observed_qps", "Requests per second the model's serving pods answered between the last two "
    "readings of Triton's counters (spec.autoscaling).", MODEL_LABELS, registry=REGISTRY)
MODEL_CAPACITY_QPS = Gauge(
    "rankops_model_capacity_per_replica_qps", "Requests per second one replica sustains within the P99 budget "
    "(the plan's, or spec.autoscaling.capacityPerReplicaQps).", MODEL_LABELS, registry=REGISTRY)
MODEL_QUEUE_SECONDS = Gauge(
    "rankops_model_avg_queue_seconds", "Average time the model's requests waited in Triton's queue between the "
    "last two readings (spec.autoscaling).", MODEL_LABELS, registry=REGISTRY)
# From status.autoscaling (rankops mode): its readings are the model's every serving pod, every
# few seconds, whatever the rollout; the canary's window exists only during a rollout, and its
# shed ratio is already in status.gates. Alerts read Triton's own counters (alerts.yaml), so they
# fire with any autoscaler; this gauge is for dashboards and for Prometheus-less setups to scrape.
MODEL_SHED_RATIO = Gauge(
    "rankops_model_shed_ratio", "Share of the model's requests Triton shed (rejected from its queue: queue-policy "
    "timeout, nv_inference_request_failure reason REJECTED) between the last two readings (spec.autoscaling).",
    MODEL_LABELS, registry=REGISTRY)
AUTOSCALE_GAUGES = (MODEL_AUTOSCALE_DESIRED, MODEL_OBSERVED_QPS, MODEL_CAPACITY_QPS, MODEL_QUEUE_SECONDS,
                    MODEL_SHED_RATIO)


def observe_reconcile(kind: str, result: str, seconds: float) -> None:
    RECONCILES.labels(kind=kind, result=result).inc()
    RECONCILE_DURATION.labels(kind=kind).observe(seconds)


def observe_api_request(method: str, path: str) -> None:
    # The resource is the plural after the group/version (and namespace): /api/v1/namespaces/x/pods/y -> pods.
    parts = [p for p in path.split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    resource = parts[0] if parts else "?"
    verb = {"PATCH": "patch", "DELETE": "delete", "PUT": "update", "POST": "create"}.get(method)
    API_REQUESTS.labels(verb=verb or ("get" if len(parts) > 1 else "list"), resource=resource).inc()


def observe_rollout(outcome: str) -> None:
    """`outcome` as the rollout machine names it (RolledBack) or as the label spells it (rolled_back)."""
    ROLLOUTS.labels(outcome=re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", outcome).lower()).inc()


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
            _remove(gauge, namespace, model, namespace)
        else:
            gauge.labels(namespace=namespace, model=model, model_namespace=namespace).set(value)


def reconcile_result(status: dict[str, Any] | None) -> str:
    """ok; degraded when the object's Degraded condition is True; error when there is no status
    (the reconcile raised)."""
    if status is None:
        return "error"
    degraded = any(c.get("type") == "Degraded" and c.get("status") == "True"
                   for c in status.get("conditions") or [])
    return "degraded" if degraded else "ok"


def record_model(body: dict[str, Any], status: dict[str, Any], outcome: str | None,
                 gate_results: list[dict[str, Any]]) -> None:
    """What one RankingModel reconcile tells: the rollout it ended, new gate verdicts, its targets."""
    if outcome:
        observe_rollout(outcome)
    for gate in gate_results:
        observe_gate(gate.get("gate", "unknown"), gate.get("outcome", "error"))
    spec, meta = body.get("spec") or {}, body["metadata"]
    slo = spec.get("slo") if isinstance(spec.get("slo"), dict) else {}
    # Explicit batching is what is served; `auto` serves the plan. batching keeps unknown fields in
    # the CRD, so its values are checked here rather than trusted.
    batching = spec.get("batching")
    served = batching if isinstance(batching, dict) else status.get("plan") or {}
    set_model_targets(meta["namespace"], meta["name"], p99_latency_ms=_number(slo.get("p99LatencyMs")),
                      target_qps=_number(slo.get("targetQps")), max_batch_size=_number(served.get("maxBatchSize")))
    set_model_autoscaling(meta["namespace"], meta["name"], status.get("autoscaling"))


def set_model_autoscaling(namespace: str, model: str, scaling: dict[str, Any] | None) -> None:
    """Publish status.autoscaling's numbers; a value it lacks (or no autoscaling) drops that series."""
    scaling = scaling if isinstance(scaling, dict) else {}
    queue_ms = _number(scaling.get("avgQueueMs"))
    for gauge, value in ((MODEL_AUTOSCALE_DESIRED, _number(scaling.get("desiredReplicas"))),
                         (MODEL_OBSERVED_QPS, _number(scaling.get("observedQps"))),
                         (MODEL_CAPACITY_QPS, _number(scaling.get("capacityPerReplicaQps"))),
                         (MODEL_QUEUE_SECONDS, None if queue_ms is None else queue_ms / 1000.0),
                         (MODEL_SHED_RATIO, _ratio(scaling.get("shedRatio")))):
        if value is None:
            _remove(gauge, namespace, model, namespace)
        else:
            gauge.labels(namespace=namespace, model=model, model_namespace=namespace).set(value)


def record_pool(pool: str, status: dict[str, Any]) -> None:
    set_pool_nodes(pool, status.get("ready", 0), status.get("failing", 0), nodes=status.get("nodes"))


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ratio(value: Any) -> float | None:
    """A share in 0..1; anything else in the status (written by another operator, or edited) is no
    sample rather than a gauge that alerts on nonsense."""
    number = _number(value)
    return number if number is not None and 0.0 <= number <= 1.0 else None


def forget_pool(pool: str) -> None:
    """Drop a deleted pool's series, so it does not alert forever on its last values."""
    for gauge in (POOL_NODES, POOL_NODES_READY, POOL_NODES_FAILING):
        _remove(gauge, pool)


def forget_model(namespace: str, model: str) -> None:
    for gauge in (MODEL_SLO_P99, MODEL_TARGET_QPS, MODEL_MAX_BATCH, *AUTOSCALE_GAUGES):
        _remove(gauge, namespace, model, namespace)


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:  # never set: nothing to drop
        pass


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> None:
    """Serve REGISTRY on http://addr:port/metrics from a daemon thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
