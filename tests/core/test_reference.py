"""docs/reference.md is generated from the API models (`rankops docs reference`): the
checked-in file must match, and it must document every field the CRDs carry."""
from __future__ import annotations

import pathlib
import re

import pytest

from rankops.api import crdgen, reference
from rankops.api.gpunodepool import GpuNodePool
from rankops.api.rankingmodel import RankingModel
from rankops.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / reference.REFERENCE_PATH
FIX = "run `rankops docs reference --write docs/reference.md`"


def _paths(node, path):
    """Every field path of a structural schema, as the reference spells it."""
    for name, sub in (node.get("properties") or {}).items():
        here = f"{path}.{name}"
        yield here
        yield from _paths(sub, here)
        if isinstance(sub.get("items"), dict):
            yield from _paths(sub["items"], here + "[]")


def _table_rows(text):
    return [line for line in text.splitlines() if line.startswith("| `")]


def test_checked_in_reference_matches_the_models():
    assert DOC.exists(), f"{reference.REFERENCE_PATH} missing: {FIX}"
    assert DOC.read_text() == reference.reference_markdown(), f"{reference.REFERENCE_PATH} drifted from the models: {FIX}"


@pytest.mark.parametrize("model", [RankingModel, GpuNodePool], ids=lambda m: m.__name__)
def test_every_crd_field_is_documented(model):
    schema = crdgen.openapi_schema(model)
    documented = {row.path for part in ("spec", "status") for row in reference.rows(model, part)}
    for part in ("spec", "status"):
        for path in _paths(schema["properties"][part], part):
            assert path in documented, f"{model.__name__} {path} is in the CRD but not in the reference"


def test_open_union_fields_list_their_object_form():
    """`batching` and `equivalence.reference` are preserve-unknown-fields in the CRD; the
    reference still documents both forms and the object form's fields."""
    spec = {row.path: row for row in reference.rows(RankingModel, "spec")}
    assert spec["spec.batching"].type == "string | object"
    assert "`auto`" in spec["spec.batching"].constraints
    assert spec["spec.batching.maxBatchSize"].constraints == "required; 1..4096"
    assert spec["spec.batching.maxQueueDelayMicroseconds"].default == "`1000`"
    assert spec["spec.rollout.equivalence.reference"].default == "`stable`"
    assert "spec.rollout.equivalence.reference.torchscriptUri" in spec


def test_rows_carry_types_defaults_and_constraints():
    spec = {row.path: row for row in reference.rows(RankingModel, "spec")}
    assert spec["spec.replicas"].type == "integer" and spec["spec.replicas"].default == "`1`"
    assert spec["spec.replicas"].constraints == "0..1000"
    assert spec["spec.versions[].format"].constraints.endswith("one of `onnx`, `tensorrt_plan`, `torchscript`")
    assert spec["spec.inputs[].dims"].type == "[]integer"
    assert "each >= -1" in spec["spec.inputs[].dims"].constraints
    assert "maxDims" in spec["spec.inputs"].constraints  # the CEL rule on each item
    assert spec["spec.podAnnotations"].type == "map[string]string"
    pool = {row.path: row for row in reference.rows(GpuNodePool, "spec")}
    assert "must not be empty" in pool["spec.nodeSelector"].constraints
    assert pool["spec.requirements.cudaVersion"].constraints.startswith("pattern `^")


def test_tables_are_well_formed():
    """Five cells per row: pipes in patterns and types are escaped."""
    text = reference.reference_markdown()
    for line in _table_rows(text):
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        assert len(cells) == 5, line
    assert text.count("\n## ") == 3


def test_cli_check_and_write(tmp_path, capsys):
    out = tmp_path / "reference.md"
    assert main(["docs", "reference", "--check", str(out)]) == 1
    assert main(["docs", "reference", "--write", str(out)]) == 0
    assert main(["docs", "reference", "--check", str(out)]) == 0
    assert out.read_text() == reference.reference_markdown()
    assert main(["docs", "reference"]) == 0
    assert capsys.readouterr().out == out.read_text()
