"""`rankops render` prints what the operator applies: for every example and every serving shape,
the objects a first reconcile of a new model writes (through controller/models.py onto a fake
cluster) equal what `rankops render` prints for it, owner references aside (there is no uid
offline). Before the plan was one seam, render built its own set: a gatewayAPI model's HTTPRoute
was applied by the operator and missing from render. The same comparison against a live API
server is e2e/test_render_matches_the_cluster.py."""
from __future__ import annotations

import copy
import datetime as dt
import pathlib

import pytest
import yaml

from rankops.commands.render import render_documents
from rankops.controller import models
from rankops.controller.unchanged import APPLIED_ANNOTATION
from tests.core.test_rollout_controller import gpu_cluster

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
CASES = ROOT / "tests" / "core" / "cases"
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)

SMALL = {
    "version": "1", "versions": [{"name": "1", "modelUri": "s3://m/1", "format": "onnx"}],
    "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
    "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}], "batching": {"maxBatchSize": 8},
}


def _model(name: str, **spec) -> dict:
    return {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": name, "namespace": "reco"}, "spec": {**copy.deepcopy(SMALL), **spec}}


def _load(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


SHAPES = {
    "example-ctr-ranker": _load(EXAMPLES / "gpunodepool-t4.yaml") + _load(EXAMPLES / "rankingmodel-ctr-ranker.yaml"),
    "example-planned": _load(EXAMPLES / "gpunodepool-t4.yaml") + _load(EXAMPLES / "rankingmodel-planned-rollout.yaml"),
    "pooled": _load(CASES / "pools.yaml") + _load(CASES / "onnx-fp16-pooled.yaml"),
    "replicas": [_model("plain", replicas=3)],
    "autoscaled": [_model("scaled", replicas=2, autoscaling={"enabled": True, "maxReplicas": 4,
                                                              "capacityPerReplicaQps": 20})],
    "external-autoscaler": [_model("hpa", autoscaling={"enabled": True, "mode": "external"})],
    "gatewayAPI": [_model("routed", replicas=2, rollout={"canary": {"traffic": "gatewayAPI", "parentRef": "gw"}})],
    "openshiftRoute": [_model("openshift", rollout={"canary": {"traffic": "openshiftRoute"}})],
    "torchscript-reference": [_model("mmoe", rollout={"equivalence": {
        "reference": {"torchscriptUri": "s3://m/original/model.pt"}}})],
}


def _without_owner(obj: dict) -> dict:
    """What the operator applied, less what only the operator can add: the owner reference (no
    uid offline) and the digest of what it applied (its apply-only-on-change bookkeeping)."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("ownerReferences", None)
    annotations = obj["metadata"].get("annotations") or {}
    annotations.pop(APPLIED_ANNOTATION, None)
    if not annotations:
        obj["metadata"].pop("annotations", None)
    return obj


def _key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_render_prints_exactly_what_the_operator_applies_to_a_new_model(shape):
    docs = SHAPES[shape]
    cluster = gpu_cluster()
    for pool in (d for d in docs if d["kind"] == "GpuNodePool"):
        cluster.put({**copy.deepcopy(pool), "status": {"nodes": 1, "ready": 1}})
    labels = {"release": "kube-prometheus-stack"}
    (model,) = [d for d in docs if d["kind"] == "RankingModel"]
    body = copy.deepcopy(model)
    body["metadata"].update(uid="uid-model", generation=1)
    cluster.put({"kind": "Secret", "metadata": {"name": body["spec"].get("modelCredentialsSecret") or "none",
                                                "namespace": body["metadata"]["namespace"]}})
    # What a new operator process applies: nothing remembered (a ServiceMonitor applied lately is not
    # applied again, it is not watched).
    result = models.reconcile(cluster, body, now=T0, service_monitors=True, service_monitor_labels=labels,
                              pull_secrets=("regcred",), memory=models.ModelMemory())
    degraded = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] not in ("RenderFailed", "ChildRefused", "PlanFailed"), degraded
    applied = {_key(o): _without_owner(o) for o in cluster.applied}
    rendered = {_key(o): o for o in render_documents([(f"{shape}#{i}", d) for i, d in enumerate(docs)], labels,
                                                     pull_secrets=["regcred"])
                if o["kind"] != "DaemonSet"}   # the pool's validator is the pool controller's
    assert sorted(rendered) == sorted(applied)
    for key, obj in rendered.items():
        assert obj == applied[key], key
    if shape == "gatewayAPI":
        assert ("HTTPRoute", "routed") in rendered, "the operator's traffic objects are in render"
    if shape == "openshiftRoute":
        assert any(kind == "Route" for kind, _ in rendered)


def test_render_prints_exactly_what_the_operator_applies_to_a_new_pool():
    """The pools' seam too (poolplan): the validator DaemonSet the PoolController applies is render's."""
    from rankops.controller import pools
    from rankops.controller.context import OperatorContext

    (pool,) = _load(EXAMPLES / "gpunodepool-t4.yaml")
    cluster = gpu_cluster()
    body = copy.deepcopy(pool)
    body["metadata"].update(uid="uid-pool", generation=1)
    cluster.put(body)
    pools.reconcile(cluster, body, OperatorContext(image_pull_secrets=["regcred"]))
    applied = [_without_owner(o) for o in cluster.applied]
    assert [o["kind"] for o in applied] == ["DaemonSet"]
    assert applied == render_documents([("gpunodepool-t4.yaml#1", pool)], pull_secrets=["regcred"])
