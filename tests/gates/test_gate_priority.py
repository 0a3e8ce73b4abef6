"""Request priorities (issue 40): the gates and the warm container send a level below live traffic.

Pure: what the rendered commands parse to and what the encoded request carries. That Triton
serves live requests first because of it is measured in tests/triton/test_priority_on_triton.py.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import yaml

from rankops.api.rankingmodel import RankingModel
from rankops.cli import build_parser, main
from rankops.commands import gate as gate_cli
from rankops.render.desired import ServingState, desired_objects, resolve_shape
from rankops.rollout import jobs
from rankops.triton.client import GATE_PRIORITY, Endpoint, ModelInfo, Request, check_priority
from rankops.triton.samples import Sample

EXAMPLE = pathlib.Path(__file__).parents[2] / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml"


def _header(request: Request) -> dict:
    """The request's JSON header, as Triton reads it (binary tensors follow it)."""
    return json.loads(request.body[:request.json_size] if request.json_size else request.body)


def _request(**endpoint) -> Request:
    connection = Endpoint("127.0.0.1:1", "m", **endpoint).connect()   # builds without connecting
    try:
        return connection.build_request(Sample(1, {"x": np.zeros((2, 4), np.float32)}), ModelInfo({}, []))
    finally:
        connection.close()


@pytest.mark.parametrize("binary_data", [True, False])
def test_the_priority_travels_in_the_requests_parameters_and_zero_sends_none(binary_data):
    assert _header(_request(priority=2, binary_data=binary_data))["parameters"]["priority"] == 2
    assert "priority" not in _header(_request(binary_data=binary_data)).get("parameters", {})
    # what is sent is the whole HTTP message, the encoded body at its end
    request = _request(priority=1, binary_data=binary_data)
    assert request.message.endswith(request.body) and _header(request)["parameters"]["priority"] == 1


def test_the_rendered_gate_jobs_and_warm_container_send_the_gate_priority():
    rm = RankingModel.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    parser = build_parser()
    warmup, *_ = jobs.gate_command(rm, "warmup", rm.spec.version, False)
    args = parser.parse_args(warmup[1:])
    assert gate_cli._endpoint(args.url, args.model, args).priority == GATE_PRIORITY == 2
    # equivalence reads the stable Deployment, which serves production: both sides at the gate level
    equivalence, *_ = jobs.gate_command(rm, "equivalence", rm.spec.version, False)
    args = parser.parse_args(equivalence[1:])
    assert "stable" in args.reference_url
    assert {gate_cli._endpoint(url, model, args).priority for url, model in
            ((args.reference_url, args.reference_model), (args.candidate_url, args.candidate_model))} == {2}
    state = ServingState(rm.spec.version, rm.spec.version, False, 1)
    warms = [c for o in desired_objects(rm, state, resolve_shape(rm.spec)) if o["kind"] == "Deployment"
             for c in o["spec"]["template"]["spec"]["containers"] if c["name"] == "warm"]
    assert warms and {parser.parse_args(w["command"][1:]).priority for w in warms} == {GATE_PRIORITY}
    # the flag changes it; 0 is the server's default level (live traffic's)
    args = parser.parse_args([*warmup[1:], "--priority", "0"])
    assert gate_cli._endpoint(args.url, args.model, args).priority == 0


@pytest.mark.parametrize("value", [-1, True, 2.0])
def test_a_bad_priority_names_the_flag_and_what_it_takes(value):
    with pytest.raises(ValueError, match=r"--priority must be 0 .* or a priority level 1, 2"):
        check_priority(value)


def test_a_gate_with_a_negative_priority_leaves_a_bad_arguments_verdict(tmp_path, capsys):
    verdict_file = tmp_path / "verdict.json"
    code = main(["gate", "warmup", "--url", "127.0.0.1:1", "--model", "m", "--max-p99-ms", "10",
                 "--generate-samples", "1", "--inputs-spec", '[{"name":"x","dataType":"FP32","dims":[4]}]',
                 "--priority", "-1", "--verdict-file", str(verdict_file)])
    verdict = json.loads(verdict_file.read_text())
    assert (code, verdict["reason"]) == (2, "BadArguments") and "--priority must be 0" in verdict["summary"]


def test_rankops_warm_with_a_negative_priority_exits_2_naming_the_flag(capsys):
    code = main(["warm", "--port", "0", "--model", "m", "--max-p99-ms", "10", "--generate-samples", "1",
                 "--inputs-spec", '[{"name":"x","dataType":"FP32","dims":[4]}]', "--priority", "-1"])
    assert code == 2 and "--priority must be 0" in capsys.readouterr().err
