"""GpuNodePool parses the issue's example, refuses bad input with a message naming the field, and
its schema stays Kubernetes-structural."""
from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from rankops.api.gpunodepool import GpuNodePool, NodeRequirements

EXAMPLE = """
apiVersion: rankops.io/v1alpha1
kind: GpuNodePool
metadata: {name: t4-pool}
spec:
  nodeSelector: {node.kubernetes.io/instance-type: g4dn.xlarge}
  requirements:
    os: {family: rhel, major: 8}
    minDriverVersion: "535.104.05"
    cudaVersion: "12.2"
    gpuProducts: [Tesla-T4]
    minGpuMemoryMiB: 15000
    selinuxContainerUseDevices: true
    secureBootSignedModules: true
    containerToolkit: true
  validator: {intervalSeconds: 300}
  taintFailingNodes: true
"""


def _pool(**spec_changes):
    data = yaml.safe_load(EXAMPLE)
    data["spec"].update(spec_changes)
    return GpuNodePool.model_validate(data)


def test_issue_example_parses_and_round_trips():
    pool = _pool()
    assert pool.name == "t4-pool" and pool.spec.requirements.min_gpu_memory_mib == 15000
    assert pool.spec.validator.image == "quay.io/rankops/rankops-validator:0.1.0"
    assert GpuNodePool.model_validate(pool.to_wire()) == pool
    assert pool.to_wire()["spec"]["requirements"]["minGpuMemoryMiB"] == 15000


@pytest.mark.parametrize("requirements, field, words", [
    ({"minDriverVersion": "535"}, "minDriverVersion", "like '535.104.05'"),
    ({"cudaVersion": "12.2.1"}, "cudaVersion", "like '12.2'"),
    ({"cudaVersion": 12.2}, "cudaVersion", "quoted string"),
    ({"os": {"family": "ubuntu"}}, "os.family", "rhel"),
    ({"os": {"major": 9}}, "os.major", "8"),
    ({"gpuProducts": ["Tesla T4!"]}, "gpuProducts", "GPU product name"),
    ({"minGpuMemoryMiB": 0}, "minGpuMemoryMiB", "greater than or equal to 1"),
    ({"selinux": True}, "selinux", "Extra inputs"),
])
def test_bad_requirements_name_the_field(requirements, field, words):
    with pytest.raises(ValidationError) as caught:
        NodeRequirements.model_validate(requirements)
    error = caught.value.errors()[0]
    assert ".".join(str(p) for p in error["loc"]) == field and words in error["msg"]


def test_bad_spec_fields():
    with pytest.raises(ValidationError, match="would select every node"):
        _pool(nodeSelector={})
    with pytest.raises(ValidationError, match="nodeSelector key 'bad key'"):
        _pool(nodeSelector={"bad key": "x"})
    with pytest.raises(ValidationError, match="greater than or equal to 30"):
        _pool(validator={"intervalSeconds": 10})


def _inline(schema, defs):
    if isinstance(schema, dict):
        if "$ref" in schema:
            target = defs[schema["$ref"].rsplit("/", 1)[-1]]
            return _inline({**target, **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
        if "anyOf" in schema:  # Optional[X]: what the CRD generator writes is X (nullable)
            options = [o for o in schema["anyOf"] if o.get("type") != "null"]
            assert len(options) == 1, f"a real union is not structural: {schema}"
            rest = {k: v for k, v in schema.items() if k != "anyOf"}
            return _inline({**options[0], **rest}, defs)
        return {k: _inline(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    return schema


def _assert_structural(schema, path="spec"):
    assert "type" in schema, f"{path} has no type"
    for name, child in schema.get("properties", {}).items():
        _assert_structural(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        _assert_structural(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        _assert_structural(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_carries_patterns_and_descriptions():
    raw = GpuNodePool.model_json_schema(by_alias=True)
    schema = _inline(raw, raw.get("$defs", {}))
    for part in ("spec", "status"):
        _assert_structural(schema["properties"][part], part)
    req = schema["properties"]["spec"]["properties"]["requirements"]["properties"]
    assert req["minDriverVersion"]["pattern"].startswith("^") and req["cudaVersion"]["type"] == "string"
    assert all(prop.get("description") for prop in req.values())


def test_crd_metadata():
    crd = GpuNodePool.__crd__
    assert (crd["kind"], crd["scope"], crd["shortNames"], crd["plural"]) == \
        ("GpuNodePool", "Cluster", ["gnp"], "gpunodepools")
    columns = {c["name"]: c["jsonPath"] for c in crd["printerColumns"]}
    assert columns["Ready"] == ".status.ready" and columns["Age"] == ".metadata.creationTimestamp"
    status_fields = GpuNodePool.model_json_schema(by_alias=True)["$defs"]["GpuNodePoolStatus"]["properties"]
    for column in crd["printerColumns"]:
        if column["jsonPath"].startswith(".status."):
            assert column["jsonPath"].split(".")[2] in status_fields
