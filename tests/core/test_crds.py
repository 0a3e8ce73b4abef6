"""The CRDs are generated from the pydantic models: checked-in copies must match, and the
schemas must be structural (no $ref/anyOf, every status field present)."""
from __future__ import annotations

import pathlib

import yaml

from rankops.api import crdgen

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _schema_nodes(node, path="$"):
    """Every schema node (not the name->schema maps under `properties`)."""
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _schema_nodes(node["additionalProperties"], f"{path}{{}}")


def test_checked_in_crds_match_the_models():
    for name, text in crdgen.crd_files().items():
        path = ROOT / "crds" / name
        assert path.exists(), f"crds/{name} missing: run `rankops crds --write crds/`"
        assert path.read_text() == text, f"crds/{name} drifted from the models: run `rankops crds --write crds/`"


def test_schemas_are_structural():
    for crd in crdgen.all_crds():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _schema_nodes(schema):
            assert not {"$ref", "anyOf", "oneOf", "allOf", "title", "$defs"} & set(node), path
            if not node.get("x-kubernetes-preserve-unknown-fields"):
                assert node.get("type"), f"{path} lacks a type"


def test_rankingmodel_crd_surface():
    crd = crdgen.crd_for(__import__("rankops.api.rankingmodel", fromlist=["RankingModel"]).RankingModel)
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["rm"]
    assert "rankops" in crd["spec"]["names"]["categories"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    for wanted in ("Stable", "Canary", "Weight", "Phase", "Ready", "Version", "Age"):
        assert wanted in columns
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert set(spec["required"]) >= {"version", "versions", "inputs", "outputs", "batching"}
    assert spec["properties"]["versions"]["items"]["properties"]["format"]["enum"] == ["onnx", "tensorrt_plan", "torchscript"]
    assert spec["properties"]["replicas"]["minimum"] == 0
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("self.versions.exists" in r for r in rules)
    status = schema["properties"]["status"]["properties"]
    for field in ("observedGeneration", "phase", "stableVersion", "canaryVersion", "canaryWeight", "ready",
                  "rollout", "gates", "plan", "conditions"):
        assert field in status, f"status.{field} missing from the schema: the API server would prune it"
    for field in ("version", "fromVersion", "phase", "startedAt", "phaseSince", "canarySince", "message",
                  "failedGate", "retried"):
        assert field in status["rollout"]["properties"], f"status.rollout.{field} missing"


def test_crd_yaml_round_trips():
    kinds = [doc["kind"] for text in crdgen.crd_files().values() for doc in yaml.safe_load_all(text)]
    assert sorted(kinds) == ["CustomResourceDefinition"] * 3 + [
                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_every_field_has_a_description():
    """`kubectl explain` shows each field's description: none may be empty (but metadata's, which the
    API server supplies and refuses in a CRD)."""
    for name in sorted((ROOT / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(name.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            missing = [path for path, node in _schema_nodes(schema)
                       if path not in ("$", "$.metadata") and not path.endswith(("[]", "{}")) and not (node.get("description") or "").strip()]
            assert not missing, f"{name.name}: fields without a description (add Field(description=...)): {missing}"


def test_the_phases_are_enums_in_the_schema_and_reasons_stay_open():
    from rankops.api.phases import ModelPhase, RolloutPhase

    crd = next(c for c in crdgen.all_crds() if c["spec"]["names"]["kind"] == "RankingModel")
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [p.value for p in ModelPhase]
    assert status["rollout"]["properties"]["phase"]["enum"] == [p.value for p in RolloutPhase]
    # Condition.reason is shared by every condition type (and the pools'): a pattern, no list.
    assert "enum" not in status["conditions"]["items"]["properties"]["reason"]
