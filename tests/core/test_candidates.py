"""Where a request's candidates are, and the problem rankops reports when requests cannot batch."""
from __future__ import annotations

import copy
import pathlib

import pytest
import yaml
from pydantic import ValidationError

from rankops.api.rankingmodel import RankingModel
from rankops.render.desired import resolve_shape

CASES = pathlib.Path(__file__).parent / "cases"
BATCH = yaml.safe_load((CASES / "onnx-candidates-batch.yaml").read_text())
VARIABLE = yaml.safe_load((CASES / "onnx-fp16-pooled.yaml").read_text())


def spec(doc: dict, **changes):
    doc = copy.deepcopy(doc)
    doc["spec"].update(changes)
    return RankingModel.model_validate(doc).spec


def test_a_variable_candidate_dim_with_dynamic_batching_is_reported_with_the_tensor_and_the_fix():
    [problem] = resolve_shape(spec(VARIABLE)).unbatched
    assert "item_features dims [-1, 32]" in problem
    assert "candidates.layout: batch" in problem and "[32]" in problem
    assert "candidates.layout: padded" in problem and "[500, 32]" in problem


def test_no_problem_without_dynamic_batching_or_with_a_layout():
    assert resolve_shape(spec(VARIABLE, batching={"maxBatchSize": 1}, modelWarmup={"batchSizes": [1]})).unbatched == ()
    assert resolve_shape(spec(BATCH)).unbatched == ()
    padded = spec(VARIABLE, candidates={"layout": "padded"},
                  inputs=[{"name": "user_features", "dataType": "FP32", "dims": [64]},
                          {"name": "item_features", "dataType": "FP32", "dims": [500, 32]}])
    assert resolve_shape(padded).unbatched == ()


@pytest.mark.parametrize("changes,words", [
    ({"inputs": [{"name": "item_features", "dataType": "FP32", "dims": [-1, 32], "maxDims": [500, 32]}]},
     ["candidates.layout batch", "item_features", "[32]"]),
    ({"candidates": {"layout": "batch", "maxPerRequest": 4000}}, ["maxPerRequest 4000", "maxBatchSize 2048"]),
    ({"candidates": {"layout": "batch"}}, ["maxPerRequest is required"]),
    ({"candidates": {"layout": "batch", "minPerRequest": 600, "maxPerRequest": 500}}, ["minPerRequest 600"]),
])
def test_layouts_that_cannot_serve_are_refused_naming_the_field(changes, words):
    with pytest.raises(ValidationError) as raised:
        spec(BATCH, **changes)
    message = str(raised.value)
    assert all(word in message for word in words), message


def test_batching_auto_plans_a_max_batch_that_holds_the_largest_request():
    auto = spec(BATCH, batching="auto", slo={"p99LatencyMs": 20, "targetQps": 3000},
                planning={"latencyProfile": {1: 1.5, 512: 3.5, 1024: 5.6, 2048: 9.7}})
    shape = resolve_shape(auto)
    assert shape.shape.max_batch_size >= auto.candidates.max_per_request
    assert shape.plan.inputs.items_per_request == (auto.candidates.min_per_request, auto.candidates.max_per_request)
    assert shape.unbatched == ()
