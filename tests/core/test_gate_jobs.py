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


def test_gate_job_names_keep_model_version_and_attempt_apart_at_any_length():
    """Issue 12: with a 39-character model and 19-character versions the name was cut at 63
    characters, dropping the attempt id, so a retry and a sibling version read old verdicts."""
    from rankops.render import names

    model_name = "ranker-for-the-home-feed-europe-west-01"
    assert len(model_name) == 39
    siblings = ("release-2026-11-01a", "release-2026-11-01b")
    found = {(gate, version, attempt): names.gate_job_name(model_name, gate, version, attempt)
             for gate in ("warmup", "equivalence") for version in siblings for attempt in ("3fa9c1", "77b0e2")}
    assert len(set(found.values())) == len(found), found
    for (_, _, attempt), name in found.items():
        assert len(name) <= 63 and name.endswith(f"-{attempt}") and name[0].isalnum(), name
    assert names.gate_job_name("ctr", "warmup", "2", "3fa9c1") == "ctr-warmup-2-3fa9c1", "short names stay readable"


def test_a_gate_job_names_its_model_version_and_attempt_and_only_that_job_counts():
    rm = model()
    rm.metadata["uid"] = "rm-uid"
    job = jobs.gate_job(rm, "warmup", "3", "3fa9c1", "2")
    job["metadata"]["ownerReferences"] = [{"kind": "RankingModel", "uid": "rm-uid", "controller": True}]
    name = rm.metadata["name"]
    assert jobs.is_gate_job_of(job, name, "rm-uid", "warmup", "3", "3fa9c1")
    for other in ((name, "rm-uid", "equivalence", "3", "3fa9c1"), (name, "rm-uid", "warmup", "4", "3fa9c1"),
                  (name, "rm-uid", "warmup", "3", "77b0e2"), ("other", "rm-uid", "warmup", "3", "3fa9c1"),
                  (name, "another-uid", "warmup", "3", "3fa9c1")):
        assert not jobs.is_gate_job_of(job, *other), other


def test_candidates_as_batch_spread_the_candidate_counts_production_sends():
    doc = yaml.safe_load((CASE.parent / "onnx-candidates-batch.yaml").read_text())
    rm = RankingModel.model_validate(doc)
    warmup, *_ = jobs.gate_command(rm, "warmup", "3", False)
    sizes = [int(b) for b in arg(warmup, "--batch-sizes").split(",")]
    assert sizes[0] == 100 and sizes[-1] == 500 and len(sizes) == jobs.CANDIDATE_COUNTS
    spec = json_inputs(warmup)
    assert [t["dims"] for t in spec] == [[64], [32]], "per-candidate dims: the batch carries the candidates"


def test_warmup_reads_the_canary_metrics_and_defeats_the_response_cache():
    command, *_ = jobs.gate_command(model(), "warmup", "3", False)
    assert arg(command, "--metrics-url") == "ctr-ranker-canary.reco.svc:8002"
    assert "--unique-requests" not in command
    doc = yaml.safe_load(CASE.read_text())
    doc["spec"]["responseCache"] = True
    cached, *_ = jobs.gate_command(RankingModel.model_validate(doc), "warmup", "3", False)
    assert "--unique-requests" in cached


def test_warmup_judges_tritons_p99_unless_the_spec_asks_for_the_clients():
    from rankops.api.rankingmodel import LatencyJudge
    from rankops.cli import build_parser
    from rankops.gates.warmup import JUDGED_ON

    default, *_ = jobs.gate_command(model(), "warmup", "3", False)
    assert "--judge-on" not in default   # the gate's own default: server
    client, *_ = jobs.gate_command(model(warmup={"judgeOn": "client"}), "warmup", "3", False)
    assert arg(client, "--judge-on") == "client" and arg(client, "--metrics-url"), "Triton's numbers still read"
    assert JUDGED_ON == tuple(j.value for j in LatencyJudge), "the spec's values are the gate's"
    parsed = build_parser().parse_args(client[1:])
    assert parsed.judge_on == "client"


def json_inputs(command: list[str]) -> list[dict]:
    import json

    return json.loads(arg(command, "--inputs-spec"))


def test_a_gate_jobs_container_asks_for_what_the_spec_says_and_one_core_by_default():
    def resources(rm: RankingModel) -> dict:
        return jobs.gate_job(rm, "warmup", "3", "3fa9c1", "2")["spec"]["template"]["spec"]["containers"][0]["resources"]

    default = resources(model())
    assert (default["requests"]["cpu"], default["requests"]["memory"], default["limits"]["memory"]) == ("1", "1Gi", "4Gi")
    assert "cpu" not in default["limits"]  # a gate that finishes sooner frees the node sooner
    small = resources(model(gateJobs={"resources": {"cpu": "250m", "memory": "512Mi", "memoryLimit": "2Gi"}}))
    assert (small["requests"]["cpu"], small["requests"]["memory"], small["limits"]["memory"]) == ("250m", "512Mi", "2Gi")


def test_a_memory_limit_below_the_request_is_refused_naming_the_field():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="memoryLimit 1Gi is below memory 2Gi"):
        model(gateJobs={"resources": {"memory": "2Gi", "memoryLimit": "1Gi"}})
