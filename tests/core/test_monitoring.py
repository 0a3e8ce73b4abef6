"""The optional per-model ServiceMonitor: its golden rendering, what it selects, `rankops render
--service-monitors`, and the operator applying it only when asked and never failing for it."""
from __future__ import annotations

import logging
import os
import pathlib

import pytest
import yaml

from rankops.api.rankingmodel import RankingModel, RankingModelStatus
from rankops.commands.render import load_documents, render_documents
from rankops.controller import models
from rankops.controller.kube import ApiError, ApiMissing
from rankops.render import names
from rankops.render.desired import desired_objects, initial_state, monitoring_objects, resolve_shape
from rankops.render.policy import TenantPolicy
from rankops.yamlio import dump_all
from tests.fakecluster import FakeCluster

HERE = pathlib.Path(__file__).parent
CASE = HERE / "cases" / "onnx-candidates-batch.yaml"
POOLS = HERE / "cases" / "pools.yaml"
UPDATE = os.environ.get("RANKOPS_UPDATE_GOLDEN") == "1"


def model_doc(uid: str | None = None) -> dict:
    doc = yaml.safe_load(CASE.read_text())
    doc["spec"].pop("nodePool")  # no GpuNodePool to look up in the fake cluster
    if uid:
        doc["metadata"].update(uid=uid, generation=1)
    return doc


def test_golden_service_monitor():
    objects = render_documents(load_documents([str(CASE), str(POOLS)]), {"release": "kube-prometheus-stack"})
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    text = dump_all(monitors)
    golden = HERE / "golden" / "servicemonitor.yaml"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"no golden file; run with RANKOPS_UPDATE_GOLDEN=1 to create {golden}"
    assert text == golden.read_text(), f"the ServiceMonitor drifted from {golden.name}"


def _matches(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def test_selects_each_serving_pod_once_through_the_track_services_metrics_port():
    """Stable and canary track Services, not the serving Service (the same pods again: doubled
    sums), not the equivalence gate's reference track; the endpoint is their named port 8002."""
    rm = RankingModel.model_validate(model_doc(uid="u-1"))
    state = initial_state(rm)
    state = type(state)(stable_version="3", canary_version="3", canary_traffic=True, canary_replicas=1)
    services = [o for o in desired_objects(rm, state, resolve_shape(rm.spec)) if o["kind"] == "Service"]
    from rankops.render import serving
    services.append(serving.track_service("ctr-ranker", "reco", "reference"))
    [sm] = monitoring_objects(rm)
    selected = sorted(s["metadata"]["name"] for s in services if _matches(sm["spec"]["selector"], s["metadata"]["labels"]))
    assert selected == ["ctr-ranker-canary", "ctr-ranker-stable"]
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["interval"] in ("15s", "30s")
    for svc in services:
        assert {"name": "metrics", "port": 8002, "targetPort": "metrics"} in svc["spec"]["ports"]
        assert endpoint["port"] == "metrics"
    assert set(sm["spec"]["podTargetLabels"]) == {names.LABEL_TRACK, names.LABEL_VERSION}
    assert sm["metadata"]["namespace"] == "reco" and sm["metadata"]["name"] == "ctr-ranker"


def test_labels_and_owner_like_the_other_children():
    rm = RankingModel.model_validate(model_doc(uid="u-1"))
    [sm] = monitoring_objects(rm, {"release": "kps", "app.kubernetes.io/name": "not-this"})
    labels = sm["metadata"]["labels"]
    assert labels == {**names.common_labels("ctr-ranker"), "release": "kps"}, "common labels win"
    [owner] = sm["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel", "name": "ctr-ranker",
                     "uid": "u-1", "controller": True, "blockOwnerDeletion": True}


def test_render_cli_shows_the_service_monitor_only_when_asked(capsys):
    from rankops.cli import main

    assert main(["render", "-f", str(CASE), "-f", str(POOLS)]) == 0
    assert "ServiceMonitor" not in [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert main(["render", "--service-monitors", "--service-monitor-label", "release=kps",
                 "-f", str(CASE), "-f", str(POOLS)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    [sm] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["metadata"]["labels"]["release"] == "kps"
    with pytest.raises(SystemExit):
        main(["render", "--service-monitor-label", "no-equals", "-f", str(CASE)])
    assert "is not KEY=VALUE" in capsys.readouterr().err


def test_run_flags_and_environment(monkeypatch):
    from rankops.cli import build_parser

    args = build_parser().parse_args(["run"])
    assert args.service_monitors is False and args.service_monitor_label == []
    monkeypatch.setenv("RANKOPS_SERVICE_MONITORS", "true")
    args = build_parser().parse_args(["run", "--service-monitor-label", "a=b=c"])
    assert args.service_monitors is True and args.service_monitor_label == [("a", "b=c")]


def cluster(monitor_error: Exception | None = None) -> FakeCluster:
    """An empty cluster, for one reconcile of a fresh model; one that refuses ServiceMonitors with
    `monitor_error`."""
    kube = FakeCluster()
    if monitor_error:
        kube.fail("apply", "ServiceMonitor", monitor_error)
    return kube


def reconcile(kube: FakeCluster, **kwargs) -> models.Result:
    return models.reconcile(kube, model_doc(uid="u-1"), **kwargs)


def test_operator_applies_it_only_with_the_flag():
    kube = cluster()
    reconcile(kube)
    assert "ServiceMonitor" not in [o["kind"] for o in kube.applied]
    kube = cluster()
    result = reconcile(kube, service_monitors=True, service_monitor_labels={"release": "kps"})
    [sm] = [o for o in kube.applied if o["kind"] == "ServiceMonitor"]
    assert sm["metadata"]["labels"]["release"] == "kps" and sm["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert kube.applied[-1]["kind"] == "ServiceMonitor", "applied last, after what serves"
    degraded = [c for c in result.status.to_wire()["conditions"] if c["type"] == "Degraded"]
    assert degraded[0]["status"] == "False"


@pytest.mark.parametrize("error", [ApiMissing("/apis/monitoring.coreos.com/v1/..."),
                                   ApiError(status=403, reason="Forbidden")], ids=["no-crd", "forbidden"])
def test_a_missing_crd_or_right_never_blocks_serving_and_is_logged_once(error, caplog):
    memory = models.ModelMemory()
    caplog.set_level(logging.INFO, logger="rankops.models")
    for _ in range(3):
        kube = cluster(monitor_error=error)
        result = reconcile(kube, service_monitors=True, memory=memory)
        assert {o["kind"] for o in kube.applied} == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
        conditions = {c["type"]: c for c in result.status.to_wire()["conditions"]}
        assert conditions["Degraded"]["status"] == "False", "monitoring is optional: not a Degraded condition"
        assert all(e.type == "Normal" for e in result.events)
    lines = [r for r in caplog.records if "ServiceMonitor" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == (logging.INFO if isinstance(error, ApiMissing) else logging.WARNING)
    # Once it can be applied again, the same problem later is worth one more line.
    reconcile(cluster(), service_monitors=True, memory=memory)
    memory.monitors_applied.clear()   # as MONITOR_REAPPLY_S later: applied again
    reconcile(cluster(monitor_error=error), service_monitors=True, memory=memory)
    assert len([r for r in caplog.records if "ServiceMonitor" in r.getMessage()]) == 2


def test_handlers_pass_the_operator_settings(monkeypatch):
    from rankops.controller import runtime
    from rankops.controller.context import OperatorContext

    body = model_doc(uid="u-1")
    seen = {}

    def fake_reconcile(kube, b, **kwargs):
        seen.update(kwargs)
        return models.Result(RankingModelStatus())

    policy = TenantPolicy.from_settings(["/srv/models"], ["registry.corp/"])
    controller = runtime.ModelController(OperatorContext(
        kube=FakeCluster(body), service_monitors=True, service_monitor_labels={"release": "kps"}, tenant_policy=policy,
        image_pull_secrets=["regcred"], pod_metrics_networks=["127.0.0.0/8"]))
    monkeypatch.setattr(models, "reconcile", fake_reconcile)
    controller.kicked((body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"]))
    assert seen == {"service_monitors": True, "service_monitor_labels": {"release": "kps"}, "policy": policy,
                    "pull_secrets": ("regcred",), "metrics_networks": ("127.0.0.0/8",), "plans": controller.plans,
                    "leaving_nodes": frozenset(), "memory": controller.memory,
                    "stable_nodes": (), "server_of": None}


def test_a_deleted_service_monitor_is_found_and_its_model_named():
    memory = models.ModelMemory()
    memory.monitors_applied.update({("reco", "ctr"): ("d1", 0.0, "ctr", "u-1"),
                                    ("reco", "other"): ("d2", 0.0, "other", "u-2")})
    assert memory.monitors_gone({("reco", "other")}) == [("reco", "ctr", "u-1")]
    assert list(memory.monitors_applied) == [("reco", "other")], "forgotten: the next reconcile applies it"
    assert memory.monitors_gone({("reco", "other")}) == []
