"""Samples: JSON Lines validation with line numbers, and generation from a RankingModel input spec."""
import json

import numpy as np
import pytest

from rankops.triton.samples import (SamplesError, dump_samples, generate_samples, load_samples,
                                   parse_batch_sizes, parse_input_spec, parse_samples)

SPEC = [
    {"name": "user_features", "dataType": "FP32", "dims": [16]},
    {"name": "item_ids", "dataType": "INT64", "dims": [-1], "maxDims": [50]},
    {"name": "item_features", "dataType": "TYPE_FP16", "dims": [-1, 8], "maxDims": [50, 8]},
]


def _line(**inputs) -> str:
    return json.dumps({"inputs": inputs})


def test_parses_lines_with_types_inferred_and_blank_lines_skipped():
    samples = parse_samples([_line(u=[[0.5, 1.0]], ids=[[1, 2, 3]]), "\n", _line(u=[[1, 2]], ids=[[4, 5, 6]])])
    assert [s.line for s in samples] == [1, 3]
    assert samples[0].inputs["u"].dtype == np.float32 and samples[0].inputs["ids"].dtype == np.int64
    assert samples[1].inputs["u"].dtype == np.int64      # the client casts to the model's datatype
    assert samples[0].batch_size == 1


@pytest.mark.parametrize("bad_line, message", [
    ("not json", "line 2: not JSON"),
    ('{"input": {"u": [1]}}', "line 2: expected an object"),
    ('{"inputs": {}}', "line 2: \"inputs\" is empty"),
    ('{"inputs": {"u": [[1, 2], [3]]}}', "line 2: input 'u' is ragged"),
    ('{"inputs": {"u": 3}}', "line 2: input 'u' must be a nested list"),
    ('{"inputs": {"u": [["a"]]}}', "line 2: input 'u' holds"),
    ('{"inputs": {"u": []}}', "line 2: input 'u' is empty"),
    ('{"inputs": {"u": [1]}, "meta": 1}', "line 2: unknown keys ['meta']"),
    ('{"inputs": {"v": [1]}}', "line 2: inputs ['v'] differ from line 1's ['u']"),
])
def test_bad_lines_are_named_by_number(bad_line, message):
    with pytest.raises(SamplesError) as info:
        parse_samples([_line(u=[1.0]), bad_line], source="golden.jsonl")
    assert f"golden.jsonl {message}" in str(info.value)


def test_empty_file_and_missing_file_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(SamplesError, match="holds no samples"):
        load_samples(str(empty))
    with pytest.raises(SamplesError, match="cannot read the samples file"):
        load_samples(str(tmp_path / "absent.jsonl"))


def test_dump_and_load_round_trip(tmp_path):
    samples = generate_samples(parse_input_spec(SPEC), count=3, batch_sizes=[2])
    path = tmp_path / "s.jsonl"
    path.write_text(dump_samples(samples))
    loaded = load_samples(str(path))
    assert len(loaded) == len(samples) == 3, "zip() below would pass on an empty load"
    for original, again in zip(samples, loaded, strict=True):
        for name, value in original.inputs.items():
            np.testing.assert_allclose(again.inputs[name], value.astype(np.float64), rtol=1e-3)


def test_generated_samples_fill_variable_dims_to_max_and_cycle_batch_sizes():
    specs = parse_input_spec(json.dumps(SPEC))
    samples = generate_samples(specs, count=7, batch_sizes=[1, 4, 8], int_high=20)
    assert [s.batch_size for s in samples] == [1, 4, 8, 1, 4, 8, 1]
    third = samples[2].inputs
    assert third["user_features"].shape == (8, 16) and third["user_features"].dtype == np.float32
    assert third["item_ids"].shape == (8, 50) and third["item_ids"].dtype == np.int64
    assert third["item_features"].shape == (8, 50, 8) and third["item_features"].dtype == np.float16
    ids = np.concatenate([s.inputs["item_ids"].ravel() for s in samples])
    assert ids.min() >= 0 and ids.max() < 20 and len(np.unique(ids)) > 10


def test_generation_without_batch_dimension_and_reproducible_by_seed():
    specs = parse_input_spec(SPEC)
    a = generate_samples(specs, count=2, batch_sizes=[0], seed=5)
    b = generate_samples(specs, count=2, batch_sizes=[0], seed=5)
    assert a[0].inputs["item_features"].shape == (50, 8)
    np.testing.assert_array_equal(a[1].inputs["user_features"], b[1].inputs["user_features"])


@pytest.mark.parametrize("spec, message", [
    ("{not json", "--inputs-spec is not JSON"),
    ("[]", "non-empty list"),
    ([{"name": "x", "dataType": "FP32", "dims": [-1]}], "maxDims must be a list of 1 positive sizes"),
    ([{"name": "x", "dataType": "FP32", "dims": [-1, 4], "maxDims": [10]}], "maxDims must be a list of 2"),
    ([{"name": "x", "dataType": "FP99", "dims": [4]}], "dataType 'FP99' is not one of"),
    ([{"name": "x", "dataType": "BYTES", "dims": [1]}], "BYTES inputs cannot be generated"),
    ([{"name": "x", "dataType": "FP32", "dims": [0]}], "dims must be a list of positive sizes or -1"),
    ([{"name": "x", "dataType": "FP32", "dims": [1], "shape": [1]}], "unknown fields ['shape']"),
    ([{"dataType": "FP32", "dims": [1]}], "--inputs-spec[0].name"),
    ([{"name": "x", "dataType": "FP32", "dims": [1]}] * 2, "names an input twice"),
])
def test_bad_input_spec_names_the_field(spec, message):
    with pytest.raises(SamplesError) as info:
        parse_input_spec(spec if isinstance(spec, str) else json.dumps(spec))
    assert message in str(info.value)


@pytest.mark.parametrize("text, sizes", [("1,4,8", [1, 4, 8]), ("16", [16]), ("0", [0]), ("none", [0])])
def test_batch_sizes(text, sizes):
    assert parse_batch_sizes(text) == sizes


@pytest.mark.parametrize("text", ["", "a,b", "1,-2", "0,4"])
def test_bad_batch_sizes(text):
    with pytest.raises(SamplesError, match="--batch-sizes"):
        parse_batch_sizes(text)
