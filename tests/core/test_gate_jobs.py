"""Gate Jobs: how many requests they generate when no samples ConfigMap is given."""
from __future__ import annotations

import pathlib

import yaml

from rankops.api.rankingmodel import RankingModel
from rankops.rollout import jobs

CASE = pathlib.Path(__file__).parent / "cases" / "onnx-fp16-pooled.yaml"   # batch sizes 1, 4, 8, 16


def model(**rollout) -> RankingModel:
    doc = yaml.safe_load(CASE.read_text())
    doc["spec"]["rollout"] = rollout
    return RankingModel.model_validate(doc)


def arg(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_generated_samples_are_two_per_batch_size_for_warmup_and_64_for_equivalence():
    rm = model()
    warmup, *_ = jobs.gate_command(rm, "warmup", "3", False)
    assert arg(warmup, "--batch-sizes") == "1,4,8,16"
    assert arg(warmup, "--generate-samples") == "8"
    assert arg(warmup, "--requests") == "2000"       # replayed round-robin over the 8
    equivalence, *_ = jobs.gate_command(rm, "equivalence", "3", False)
    assert arg(equivalence, "--generate-samples") == "64"


def test_warmup_never_generates_more_requests_than_it_sends():
    command, *_ = jobs.gate_command(model(warmup={"requests": 5}), "warmup", "3", False)
    assert arg(command, "--generate-samples") == "5"


def test_a_samples_config_map_replaces_generation():
    command, volumes, mounts, _ = jobs.gate_command(
        model(equivalence={"samples": {"configMap": "golden", "key": "g.jsonl"}}), "equivalence", "3", False)
    assert "--generate-samples" not in command
    assert arg(command, "--samples") == f"{jobs.SAMPLES_DIR}/g.jsonl"
    assert volumes == [{"name": "samples", "configMap": {"name": "golden"}}] and mounts[0]["readOnly"]
