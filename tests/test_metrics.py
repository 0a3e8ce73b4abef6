"""The operator's Prometheus metrics, and that the chart's alerts and dashboard use real names."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import urllib.request
from pathlib import Path

import yaml

from rankops import metrics
from rankops.api.gpunodepool import GpuNodePoolStatus
from rankops.api.rankingmodel import GateResult
from rankops.rollout.machine import CANCELED, PROMOTED, ROLLED_BACK, SUPERSEDED
from rankops_dev.ports import free_port
from tests import wire

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "charts" / "rankops-operator" / "files"


def sample(name: str, labels: dict[str, str]) -> float | None:
    if name.startswith("rankops_model_") and "namespace" in labels:  # the model gauges repeat it
        labels = {"model_namespace": labels["namespace"], **labels}
    return metrics.REGISTRY.get_sample_value(name, labels)


def exported_names() -> set[str]:
    return {s.name for family in metrics.REGISTRY.collect() for s in family.samples}


def test_reconciles_are_counted_and_timed_by_kind_and_result():
    before = sample("rankops_reconciles_total", {"kind": "RankingModel", "result": "degraded"}) or 0
    count_before = sample("rankops_reconcile_duration_seconds_count", {"kind": "RankingModel"}) or 0
    metrics.observe_reconcile("RankingModel", "degraded", 0.2)
    assert sample("rankops_reconciles_total", {"kind": "RankingModel", "result": "degraded"}) == before + 1
    assert sample("rankops_reconcile_duration_seconds_count", {"kind": "RankingModel"}) == count_before + 1
    # 0.2 s lands in the 0.25 s bucket but not the 0.1 s one.
    le = lambda b: sample("rankops_reconcile_duration_seconds_bucket", {"kind": "RankingModel", "le": b}) or 0
    assert le("0.25") - le("0.1") >= 1


def test_rollouts_and_gates_by_outcome():
    metrics.observe_rollout("rolled_back")
    metrics.observe_gate("equivalence", "fail")
    metrics.observe_gate("equivalence", "fail")
    assert sample("rankops_rollouts_total", {"outcome": "rolled_back"}) >= 1
    assert sample("rankops_gate_results_total", {"gate": "equivalence", "outcome": "fail"}) >= 2


def test_pool_gauges_follow_the_latest_values_and_are_forgotten():
    metrics.set_pool_nodes("t4-pool", 3, 1, nodes=4)
    metrics.set_pool_nodes("t4-pool", 2, 2)
    assert sample("rankops_pool_nodes_ready", {"pool": "t4-pool"}) == 2
    assert sample("rankops_pool_nodes_failing", {"pool": "t4-pool"}) == 2
    assert sample("rankops_pool_nodes", {"pool": "t4-pool"}) == 4
    metrics.forget_pool("t4-pool")
    metrics.forget_pool("t4-pool")  # twice: a no-op, not a KeyError
    assert sample("rankops_pool_nodes_ready", {"pool": "t4-pool"}) is None


def test_model_targets_in_base_units_and_none_drops_the_series():
    labels = {"namespace": "reco", "model": "ctr-ranker"}
    metrics.set_model_targets("reco", "ctr-ranker", p99_latency_ms=10, target_qps=2000, max_batch_size=16)
    assert sample("rankops_model_slo_p99_latency_seconds", labels) == 0.01
    assert sample("rankops_model_max_batch_size", labels) == 16
    metrics.set_model_targets("reco", "ctr-ranker", p99_latency_ms=None, target_qps=2000, max_batch_size=16)
    assert sample("rankops_model_slo_p99_latency_seconds", labels) is None
    assert sample("rankops_model_target_qps", labels) == 2000
    metrics.forget_model("reco", "ctr-ranker")
    assert sample("rankops_model_max_batch_size", labels) is None


def test_rollout_outcomes_from_the_machine_are_labelled_as_the_alerts_expect():
    before = sample("rankops_rollouts_total", {"outcome": "rolled_back"}) or 0
    metrics.observe_rollout(ROLLED_BACK)
    metrics.observe_rollout("rolled_back")
    assert sample("rankops_rollouts_total", {"outcome": "rolled_back"}) == before + 2
    for outcome in (PROMOTED, SUPERSEDED, CANCELED):
        metrics.observe_rollout(outcome)
    assert {"promoted", "superseded", "canceled"} <= {
        s.labels["outcome"] for f in metrics.REGISTRY.collect() for s in f.samples if s.name == "rankops_rollouts_total"}


def test_reconcile_result_reads_the_degraded_condition():
    assert metrics.reconcile_result(None) == "error"
    assert metrics.reconcile_result({"conditions": [{"type": "Degraded", "status": "False"}]}) == "ok"
    assert metrics.reconcile_result({"phase": "Ready", "conditions": [{"type": "Degraded", "status": "True"}]}) \
        == "degraded"


def model_body(name: str, spec: dict) -> dict:
    return {"metadata": {"name": name, "namespace": "reco", "uid": f"uid-{name}"}, "spec": spec}


def test_record_model_counts_what_ended_and_publishes_the_served_targets():
    gate_before = sample("rankops_gate_results_total", {"gate": "warmup", "outcome": "error"}) or 0
    promoted_before = sample("rankops_rollouts_total", {"outcome": "promoted"}) or 0
    labels = {"namespace": "reco", "model": "explicit"}
    explicit = model_body("explicit", {"slo": {"p99LatencyMs": 20, "targetQps": 500},
                                       "batching": {"maxBatchSize": 32}})
    # The status's plan is ignored for explicit batching: the spec's value is what Triton serves.
    metrics.record_model(explicit, {"plan": {"maxBatchSize": 8}}, PROMOTED,
                         [{"gate": "warmup", "outcome": "error", "version": "2"}])
    assert sample("rankops_rollouts_total", {"outcome": "promoted"}) == promoted_before + 1
    assert sample("rankops_gate_results_total", {"gate": "warmup", "outcome": "error"}) == gate_before + 1
    assert sample("rankops_model_max_batch_size", labels) == 32
    assert sample("rankops_model_slo_p99_latency_seconds", labels) == 0.02
    assert sample("rankops_model_target_qps", labels) == 500

    planned = model_body("planned", {"slo": {"p99LatencyMs": 10, "targetQps": 2000}, "batching": "auto"})
    metrics.record_model(planned, {"plan": {"maxBatchSize": 16}}, None, [])
    assert sample("rankops_model_max_batch_size", {"namespace": "reco", "model": "planned"}) == 16
    assert sample("rankops_rollouts_total", {"outcome": "promoted"}) == promoted_before + 1

    # batching keeps unknown fields in the CRD: a garbled value drops the series, never raises.
    garbled = model_body("explicit", {"batching": {"maxBatchSize": "16"}})
    metrics.record_model(garbled, {}, None, [])
    assert sample("rankops_model_max_batch_size", labels) is None
    assert sample("rankops_model_slo_p99_latency_seconds", labels) is None


def test_record_pool_publishes_the_pool_status_counts():
    metrics.record_pool("l4-pool", {"nodes": 5, "ready": 3, "failing": 1, "pending": 1})
    assert sample("rankops_pool_nodes", {"pool": "l4-pool"}) == 5
    assert sample("rankops_pool_nodes_ready", {"pool": "l4-pool"}) == 3
    assert sample("rankops_pool_nodes_failing", {"pool": "l4-pool"}) == 1


def test_controllers_record_each_reconcile_and_forget_deleted_objects(monkeypatch):
    import kopf

    from rankops.controller import handlers, models, pools, runtime
    from rankops.controller.context import OperatorContext
    from tests.fakecluster import FakeCluster

    cluster = FakeCluster({"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
                           "metadata": {"name": "a10-pool"}, "spec": {}},
                          {**model_body("ranker", {"slo": {"p99LatencyMs": 5, "targetQps": 100},
                                                   "batching": {"maxBatchSize": 4}}), "kind": "RankingModel"})
    pool, model = cluster.stored("GpuNodePool", None, "a10-pool"), cluster.stored("RankingModel", "reco", "ranker")
    model_controller, pool_controller = runtime.build(OperatorContext(kube=cluster))
    memo = kopf.Memo(models=model_controller, pools=pool_controller)
    pool_status = {"nodes": 2, "ready": 1, "failing": 1,
                   "conditions": [{"type": "Degraded", "status": "True", "reason": "NodesFailing"}]}
    monkeypatch.setattr(pools, "reconcile", lambda kube, body, operator, validators: pools.Result(GpuNodePoolStatus.model_validate(pool_status)))
    monkeypatch.setattr(models, "reconcile", lambda kube, body, **_: models.Result(
        wire.status({"phase": "Ready"}), outcome=ROLLED_BACK,
        gate_results=[GateResult(gate="equivalence", version="2", outcome="fail")]))
    degraded = lambda: sample("rankops_reconciles_total", {"kind": "GpuNodePool", "result": "degraded"}) or 0
    rolled_back = lambda: sample("rankops_rollouts_total", {"outcome": "rolled_back"}) or 0
    gate_fail = lambda: sample("rankops_gate_results_total", {"gate": "equivalence", "outcome": "fail"}) or 0
    before = degraded(), rolled_back(), gate_fail()

    pool_controller.kicked(("a10-pool", pool["metadata"]["uid"]))
    model_controller.kicked((model["metadata"]["namespace"], model["metadata"]["name"], model["metadata"]["uid"]))
    assert (degraded(), rolled_back(), gate_fail()) == (before[0] + 1, before[1] + 1, before[2] + 1)
    assert sample("rankops_pool_nodes", {"pool": "a10-pool"}) == 2
    assert sample("rankops_pool_nodes_failing", {"pool": "a10-pool"}) == 1
    assert sample("rankops_model_max_batch_size", {"namespace": "reco", "model": "ranker"}) == 4

    asyncio.run(handlers.gpunodepool_event({"type": "DELETED", "object": pool}, models_by_input={},
                                           pool_selectors={}, memo=memo))
    asyncio.run(handlers.rankingmodel_event({"type": "DELETED", "object": model}, memo=memo))
    assert sample("rankops_pool_nodes_failing", {"pool": "a10-pool"}) is None
    assert sample("rankops_model_max_batch_size", {"namespace": "reco", "model": "ranker"}) is None


def test_metrics_server_serves_the_registry():
    metrics.observe_gate("warmup", "pass")
    port = free_port()
    metrics.start_metrics_server(port, addr="127.0.0.1")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'rankops_gate_results_total{gate="warmup",outcome="pass"}' in body
    assert "process_resident_memory_bytes" in body
    assert "python_gc_objects_collected_total" not in body, "the default registry leaked in"


def test_alerts_and_dashboard_use_metric_names_the_operator_exports():
    metrics.observe_reconcile("GpuNodePool", "ok", 0.01)
    metrics.observe_rollout("promoted")
    metrics.observe_gate("warmup", "pass")
    metrics.set_pool_nodes("p", 1, 0, nodes=1)
    metrics.set_model_targets("ns", "m", p99_latency_ms=10, target_qps=1, max_batch_size=8)
    exported = exported_names()
    alerts = yaml.safe_load((FILES / "alerts.yaml").read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    dashboard = json.loads((FILES / "dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\brankops_[a-z0-9_]+", e)}
    assert used, "no operator metric referenced at all"
    assert used <= exported, f"referenced but never exported: {sorted(used - exported)}"


def test_alerts_join_the_model_gauges_on_the_label_openshift_leaves_alone():
    """OpenShift's user-workload monitoring overwrites `namespace` on the operator's series with its
    own namespace: every alert reading a rankops_model_* gauge takes the model's namespace from
    `model_namespace`, which the gauges set to the model's namespace."""
    metrics.set_model_targets("reco", "ctr", p99_latency_ms=10, target_qps=1, max_batch_size=8)
    for family in metrics.REGISTRY.collect():
        for s in family.samples:
            if s.name.startswith("rankops_model_") and s.labels.get("model") == "ctr":
                assert s.labels["model_namespace"] == s.labels["namespace"] == "reco", s
    alerts = yaml.safe_load((FILES / "alerts.yaml").read_text())
    reads = 0
    for rule in (r for g in alerts["groups"] for r in g["rules"]):
        for gauge in re.findall(r"\brankops_model_[a-z0-9_]+", rule["expr"]):
            reads += 1
            assert f'label_replace({gauge}, "namespace", "$1", "model_namespace", "(.+)")' in rule["expr"], \
                f"{rule['alert']} reads {gauge} by its `namespace`, which OpenShift overwrites"
    assert reads >= 4


def test_the_shed_ratio_comes_from_status_autoscaling_and_nonsense_is_no_sample():
    labels = {"namespace": "reco", "model": "shedder"}
    body = {"metadata": {"namespace": "reco", "name": "shedder"}, "spec": {}}
    metrics.record_model(body, {"autoscaling": {"mode": "rankops", "shedRatio": 0.125}}, None, [])
    assert sample("rankops_model_shed_ratio", labels) == 0.125
    for written in (1.5, -0.1, "0.2", True, None):   # another operator's, or an edit: not a share
        metrics.record_model(body, {"autoscaling": {"mode": "rankops", "shedRatio": written}}, None, [])
        assert sample("rankops_model_shed_ratio", labels) is None, written
    metrics.record_model(body, {"autoscaling": {"mode": "rankops", "shedRatio": 0.0}}, None, [])
    assert sample("rankops_model_shed_ratio", labels) == 0.0, "no shedding is a sample, 0"
    metrics.forget_model("reco", "shedder")
    assert sample("rankops_model_shed_ratio", labels) is None


def test_the_shedding_alert_reads_tritons_rejected_requests_over_all():
    alerts = yaml.safe_load((FILES / "alerts.yaml").read_text())
    rule = next(r for g in alerts["groups"] for r in g["rules"] if r["alert"] == "RankopsModelShedding")
    expr = " ".join(rule["expr"].split())
    assert 'nv_inference_request_failure{reason="REJECTED"}[5m]' in expr
    # Over every request: served and failed (shed included), not the served alone.
    assert "rate(nv_inference_request_success[5m])) + sum by (namespace, model) (rate(nv_inference_request_failure[5m]))" in expr
    assert "> __SHED_RATIO__" in expr and rule["for"] == "10m"
    # Some traffic, counted over every request: a model shedding all it gets (no success) alerts.
    guard = expr.split("> __SHED_RATIO__ and on (namespace, model)")[1]
    assert "rate(nv_inference_request_failure[5m])" in guard and guard.endswith("> 1")
    assert "503" in rule["annotations"]["description"] and "UNAVAILABLE" in rule["annotations"]["description"]
