"""The planning API models: wire names, validation messages, Kubernetes-structural schemas."""
import json

import pytest
from pydantic import ValidationError

from rankops.api.planning import Planning, PlanStatus, Slo, status_schema


def test_issue_example_parses_with_string_keys():
    planning = Planning.model_validate({
        "headroom": 0.5, "gpuMemoryMiB": 15360, "latencyProfile": {"1": 2.0, "4": 2.3, "8": 3.0, "16": 4.6},
        "memory": {"weightsMiB": 1024, "gpuEmbeddingsMiB": 2048, "activationMiBPerItem": 16,
                   "runtimeReserveMiB": 1024},
    })
    assert planning.latency_profile == {1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}
    assert planning.memory.gpu_embeddings_mib == 2048
    assert planning.to_wire()["gpuMemoryMiB"] == 15360


@pytest.mark.parametrize("doc, field", [
    ({"headroom": 0.99}, "headroom"),
    ({"latencyProfile": {"1": -2.0}}, "latencyProfile"),
    ({"latencyProfile": {"0": 2.0}}, "latencyProfile"),
    ({"latencyProfile": {"1": 2.0}, "latencyProfileConfigMap": {"name": "p", "key": "k"}}, "not both"),
    ({"memory": {"weightsMib": 1}}, "weightsMib"),
])
def test_bad_planning_is_refused_naming_the_field(doc, field):
    with pytest.raises(ValidationError, match=field):
        Planning.model_validate(doc)


def test_slo_must_be_positive():
    with pytest.raises(ValidationError, match="p99LatencyMs"):
        Slo.model_validate({"p99LatencyMs": 0, "targetQps": 10})


def _walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("model", [Slo, Planning, PlanStatus])
def test_schemas_are_structural(model):
    schema = model.model_json_schema(by_alias=True)
    for path, node in _walk(schema):
        assert "anyOf" not in node and "oneOf" not in node, path
        assert "propertyNames" not in node, path
        if node.get("type") == "object" and "properties" not in node and "$ref" not in node:
            assert isinstance(node.get("additionalProperties"), dict), path
            assert "type" in node["additionalProperties"], path
    for name, prop in schema.get("properties", {}).items():
        assert prop.get("description") or "$ref" in prop or "allOf" in prop, name


def test_status_schema_lists_what_to_status_writes():
    props = status_schema()["properties"]
    for key in ("maxBatchSize", "preferredBatchSizes", "maxQueueDelayMicroseconds", "instancesPerGpu",
                "replicas", "gpus", "qpsPerGpu", "predictedP50Ms", "predictedP99Ms", "memoryMiB", "problems"):
        assert key in props
    json.dumps(status_schema())
