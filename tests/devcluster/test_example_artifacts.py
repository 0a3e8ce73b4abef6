"""The example model's artifacts (served by `rankops dev demo`) are what spec_models exports for it.

Regenerate after changing the example's tensors or spec_models:
    python -m rankops_dev.spec_models manifests/examples/rankingmodel-ctr-ranker.yaml manifests/examples/artifacts
"""
from __future__ import annotations

from pathlib import Path

import yaml

from rankops.api.rankingmodel import RankingModel
from rankops_dev import spec_models

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml"
ARTIFACTS = ROOT / "manifests" / "examples" / "artifacts"


def test_each_version_of_the_example_has_its_exported_artifact(tmp_path):
    rm = RankingModel.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    written = spec_models.export_versions(rm, tmp_path)
    assert written, "the example has no versions"
    for path in written:
        committed = ARTIFACTS / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: regenerate (see this module's docstring)"
        assert committed.read_bytes() == path.read_bytes(), f"{committed} is stale: regenerate"
