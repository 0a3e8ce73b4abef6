"""Tenant input that would be accepted and then fail in a child, or never serve (issue 12,
findings 5-7): refused by the API models with the field named, and by the generated CRD and
admission policy at apply (tested against a live API server in e2e/test_admission.py)."""
from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from rankops.api import bounds, crdgen
from rankops.api.errors import describe
from rankops.api.rankingmodel import RankingModel

BASE = {
    "apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
    "metadata": {"name": "ranker", "namespace": "reco"},
    "spec": {
        "version": "1",
        "versions": [{"name": "1", "modelUri": "s3://models/ranker/1", "format": "onnx"}],
        "inputs": [{"name": "user", "dataType": "FP32", "dims": [64]},
                   {"name": "items", "dataType": "FP32", "dims": [-1, 32], "maxDims": [500, 32]}],
        "outputs": [{"name": "score", "dataType": "FP32", "dims": [-1], "maxDims": [500]}],
        "batching": {"maxBatchSize": 16},
    },
}


def doc(**spec) -> dict:
    out = copy.deepcopy(BASE)
    out["spec"].update(copy.deepcopy(spec))
    return out


def errors(document: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        RankingModel.model_validate(document)
    return "; ".join(describe(caught.value))


def test_the_base_model_is_accepted():
    RankingModel.model_validate(doc(podAnnotations={"prometheus.io/scrape": "true", "sidecar.istio.io/inject": "false"},
                                    modelCredentialsSecret="s3-creds", nodePool="t4.pool",
                                    tritonImage="registry.local:5000/nvidia/tritonserver:24.05-py3@sha256:" + "a" * 64))


BAD = [
    pytest.param(dict(podAnnotations={"bad key": "x"}), "spec.podAnnotations", "qualified names", id="annotation-key"),
    pytest.param(dict(podAnnotations={"a/b/c": "x"}), "spec.podAnnotations", "qualified names", id="annotation-two-slashes"),
    pytest.param(dict(podAnnotations={"x": "v" * (1024 * 1024)}), "spec.podAnnotations", "", id="annotation-1MiB"),
    pytest.param(dict(podAnnotations={f"k{i}": "v" * 2000 for i in range(40)}), "spec.podAnnotations",
                 "characters of keys and values", id="annotations-over-64KiB"),
    pytest.param(dict(rollout={"gateJobs": {"podAnnotations": {"-x": "1"}}}), "spec.rollout.gateJobs.podAnnotations",
                 "qualified names", id="gate-annotation-key"),
    pytest.param(dict(nodePool="a/../../b"), "spec.nodePool", "pattern", id="node-pool-path"),
    pytest.param(dict(modelCredentialsSecret="Bad_Secret"), "spec.modelCredentialsSecret", "pattern", id="secret-name"),
    pytest.param(dict(rollout={"warmup": {"samples": {"configMap": "../x"}}}), "spec.rollout.warmup.samples.configMap",
                 "pattern", id="samples-config-map"),
    pytest.param(dict(inputs=[{"name": "user", "dataType": "FP32", "dims": [0]}]), "spec.inputs[0]",
                 "each dimension is -1 (variable) or at least 1", id="dims-zero"),
    pytest.param(dict(inputs=[{"name": "big", "dataType": "FP64", "dims": [1000000, 1000000]}],
                      batching={"maxBatchSize": 4096}), "spec", "inputs[0] (big): a batch of 4096 x 1000000 x 1000000 FP64",
                 id="tensor-too-big"),
    pytest.param(dict(tritonImage="nvcr.io/nvidia/triton server:24.05"), "spec.tritonImage", "pattern",
                 id="image-with-space"),
    pytest.param(dict(rollout={"gateJobs": {"image": "Quay.io/Rankops/Gate"}}), "spec.rollout.gateJobs.image",
                 "pattern", id="image-upper-case-path"),
    pytest.param(dict(resources={"memory": "100000000000000000000Ti"}), "spec.resources.memory", "at most 16Ti",
                 id="memory-1e20Ti"),
    pytest.param(dict(resources={"cpu": "0"}), "spec.resources.cpu", "more than 0", id="cpu-zero"),
    pytest.param(dict(versions=[{"name": "1", "modelUri": "s3://a/1", "format": "onnx"},
                                {"name": "1", "modelUri": "s3://a/2", "format": "onnx"}]), "spec",
                 "duplicate names", id="duplicate-versions"),
    pytest.param(dict(versions=[{"name": "1", "modelUri": "s3://a/" + "x" * 3000, "format": "onnx"}]),
                 "spec.versions[0].modelUri", "", id="uri-too-long"),
]


@pytest.mark.parametrize("spec, field, says", BAD)
def test_unservable_input_is_refused_naming_the_field(spec, field, says):
    message = errors(doc(**spec))
    assert f"{field}" in message and says in message, message


def test_a_253_character_name_is_refused():
    document = doc()
    document["metadata"]["name"] = "a" * 253
    assert "at most 40 characters" in errors(document)


def test_the_tensor_bound_counts_the_batch_and_the_element_size():
    assert bounds.tensor_too_big("inputs[0]", "x", "FP32", [512, 256], 4096, "batching.maxBatchSize") is None
    said = bounds.tensor_too_big("inputs[0]", "x", "FP64", [512, 256], 4096, "batching.maxBatchSize")
    assert said and "inputs[0] (x)" in said and "batching.maxBatchSize" in said


def _spec_nodes(node, path="spec"):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _spec_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _spec_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _spec_nodes(node["additionalProperties"], f"{path}{{}}")


def test_every_spec_field_is_bounded_so_a_stored_spec_is_bounded():
    """No unbounded string, list or map: the API server refuses an oversized spec at apply. The two
    word-or-object unions are bounded by the admission policy (their keys and values)."""
    crd = crdgen.crd_for(RankingModel)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    unions = {"spec.batching", "spec.rollout.equivalence.reference"}
    for path, node in _spec_nodes(spec):
        if node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
            assert path in unions, f"{path} stores anything"
        elif node.get("type") == "string":
            assert "maxLength" in node or "enum" in node, f"{path}: no maxLength"
        elif node.get("type") == "array":
            assert "maxItems" in node, f"{path}: no maxItems"
        elif node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, f"{path}: no maxProperties"
    policy = " ".join(v["expression"] for v in crdgen.admission_policy(RankingModel)[0]["spec"]["validations"])
    assert "object.spec.batching.all(k" in policy and "object.spec.rollout.equivalence.reference.all(k" in policy


def test_rules_the_api_server_checks_at_apply():
    crd = crdgen.crd_for(RankingModel)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert any("self.metadata.name" in r["rule"] for r in schema["x-kubernetes-validations"])
    assert any("self.filter(w, w.name == v.name)" in r["rule"] for r in spec["properties"]["versions"]["x-kubernetes-validations"])
    annotations = spec["properties"]["podAnnotations"]
    assert annotations["maxProperties"] == bounds.ANNOTATIONS_MAX_KEYS
    assert [r["rule"] for r in annotations["x-kubernetes-validations"]] == [r["rule"] for r in bounds.ANNOTATION_RULES]
    for field in ("nodePool", "modelCredentialsSecret"):
        assert spec["properties"][field]["pattern"] == bounds.DNS_SUBDOMAIN
    assert spec["properties"]["tritonImage"]["pattern"] == bounds.IMAGE_REFERENCE
    assert "quantity(self)" in spec["properties"]["resources"]["properties"]["memory"]["x-kubernetes-validations"][0]["rule"]


def test_a_planned_batch_is_held_to_the_same_tensor_bound():
    from rankops.render.desired import RenderError, resolve_shape

    rm = RankingModel.model_validate(doc(
        batching="auto", inputs=[{"name": "big", "dataType": "FP32", "dims": [16384, 16384]}],
        slo={"p99LatencyMs": 50, "targetQps": 1000}, planning={"latencyProfile": {1: 1.0, 8: 2.0, 64: 5.0}}))
    with pytest.raises(RenderError, match=r"inputs\[0\] \(big\): a batch of \d+ x 16384 x 16384 FP32"):
        resolve_shape(rm.spec)
