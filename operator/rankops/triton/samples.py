"""Request samples for the gates: read from JSON Lines, or generated from a model's input spec.

A samples file has one request per line: `{"inputs": {"<input name>": <nested list>}}`, the
nested list including the batch dimension when the model batches. Values carry no datatype;
the client casts them to what the server's model metadata declares.

Generated samples follow the RankingModel input spec (`{name, dataType, dims, maxDims}`, dims
without the batch dimension): a `-1` dim is filled with its maxDims entry, the largest shape
the model must serve, so that warmup runs the kernels for it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np


class SamplesError(ValueError):
    """Samples that cannot be used; the message names the line or field and the fix."""


@dataclass(frozen=True)
class Sample:
    line: int                         # 1-based line in the samples file (index for generated ones)
    inputs: dict[str, np.ndarray]

    @property
    def batch_size(self) -> int:
        """The first dimension of the first input: the batch size for a batching model."""
        first = next(iter(self.inputs.values()))
        return int(first.shape[0]) if first.ndim else 1


# --- JSON Lines --------------------------------------------------------------------------

def load_samples(path: str) -> list[Sample]:
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_samples(fh, source=path)
    except OSError as exc:
        raise SamplesError(f"cannot read the samples file {path}: {exc.strerror}; "
                           "check --samples names a mounted file") from None
    except UnicodeDecodeError:
        raise SamplesError(f"the samples file {path} is not UTF-8 text; "
                           "write JSON Lines: one {\"inputs\": {...}} object per line") from None


def parse_samples(lines: Iterable[str], source: str = "samples") -> list[Sample]:
    samples: list[Sample] = []
    names: tuple[str, ...] | None = None
    first_line = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        sample = _parse_line(raw, number, source)
        these = tuple(sorted(sample.inputs))
        if names is None:
            names, first_line = these, number
        elif these != names:
            raise SamplesError(f"{source} line {number}: inputs {list(these)} differ from line "
                               f"{first_line}'s {list(names)}; every request must carry the same inputs")
        samples.append(sample)
    if not samples:
        raise SamplesError(f"{source} holds no samples; write one {{\"inputs\": {{...}}}} object per line")
    return samples


def _parse_line(raw: str, number: int, source: str) -> Sample:
    where = f"{source} line {number}"
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise SamplesError(f"{where}: not JSON ({exc.msg} at column {exc.colno}); "
                           "each line must be one {\"inputs\": {...}} object") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("inputs"), dict):
        raise SamplesError(f"{where}: expected an object {{\"inputs\": {{\"<input name>\": <nested list>}}}}")
    extra = set(obj) - {"inputs"}
    if extra:
        raise SamplesError(f"{where}: unknown keys {sorted(extra)}; only \"inputs\" is read")
    if not obj["inputs"]:
        raise SamplesError(f"{where}: \"inputs\" is empty; give at least one input tensor")
    inputs: dict[str, np.ndarray] = {}
    for name, value in obj["inputs"].items():
        inputs[name] = _to_array(value, f"{where}: input {name!r}")
    return Sample(line=number, inputs=inputs)


def _to_array(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, list):
        raise SamplesError(f"{where} must be a nested list of numbers, got {type(value).__name__}")
    try:
        array = np.array(value)
    except ValueError:
        raise SamplesError(f"{where} is ragged: every row must have the same length") from None
    if array.size == 0:
        raise SamplesError(f"{where} is empty; a request needs at least one value")
    kind = array.dtype.kind
    if kind == "b":
        return array
    if kind in "iu":
        return array.astype(np.int64)
    if kind == "f":
        return array.astype(np.float32)
    raise SamplesError(f"{where} holds {array.dtype.name} values; only numbers and booleans are supported")


def dump_samples(samples: Sequence[Sample]) -> str:
    """Samples as JSON Lines (the format `load_samples` reads)."""
    return "".join(json.dumps({"inputs": {k: v.tolist() for k, v in s.inputs.items()}}) + "\n"
                   for s in samples)


# --- Generated from the input spec --------------------------------------------------------

@dataclass(frozen=True)
class InputSpec:
    name: str
    data_type: str            # KServe v2 name: FP32, INT64, ...
    dims: tuple[int, ...]     # without the batch dimension; -1 is variable
    max_dims: tuple[int, ...]

    def shape(self) -> tuple[int, ...]:
        return tuple(m if d == -1 else d for d, m in zip(self.dims, self.max_dims))


_NUMPY_TYPES = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}


def parse_input_spec(text_or_list: str | list) -> list[InputSpec]:
    """The RankingModel `inputs` list, as JSON text or already parsed."""
    data = text_or_list
    if isinstance(text_or_list, str):
        try:
            data = json.loads(text_or_list)
        except ValueError as exc:
            raise SamplesError(f"--inputs-spec is not JSON ({exc.msg}); pass the RankingModel's "
                               "inputs, e.g. [{\"name\": \"x\", \"dataType\": \"FP32\", \"dims\": [16]}]") from None
    if not isinstance(data, list) or not data:
        raise SamplesError("--inputs-spec must be a non-empty list of {name, dataType, dims, maxDims}")
    specs = [_parse_one_spec(item, i) for i, item in enumerate(data)]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SamplesError(f"--inputs-spec names an input twice: {names}")
    return specs


def _parse_one_spec(item: Any, index: int) -> InputSpec:
    where = f"--inputs-spec[{index}]"
    if not isinstance(item, dict):
        raise SamplesError(f"{where} must be an object {{name, dataType, dims, maxDims}}")
    unknown = set(item) - {"name", "dataType", "dims", "maxDims", "format"}
    if unknown:
        raise SamplesError(f"{where}: unknown fields {sorted(unknown)}; expected name, dataType, dims, maxDims")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise SamplesError(f"{where}.name must be a non-empty string")
    where = f"--inputs-spec {name!r}"
    dtype = str(item.get("dataType", "")).upper().removeprefix("TYPE_")
    if dtype == "BYTES" or dtype == "STRING":
        raise SamplesError(f"{where}: BYTES inputs cannot be generated; record samples instead (--samples)")
    if dtype not in _NUMPY_TYPES:
        raise SamplesError(f"{where}.dataType {item.get('dataType')!r} is not one of {sorted(_NUMPY_TYPES)}")
    dims = item.get("dims")
    if not isinstance(dims, list) or not all(isinstance(d, int) and (d == -1 or d > 0) for d in dims):
        raise SamplesError(f"{where}.dims must be a list of positive sizes or -1, got {dims!r}")
    max_dims = item.get("maxDims")
    if -1 in dims:
        if (not isinstance(max_dims, list) or len(max_dims) != len(dims)
                or not all(isinstance(m, int) and m > 0 for m in max_dims)):
            raise SamplesError(f"{where}: dims {dims} have -1, so maxDims must be a list of "
                               f"{len(dims)} positive sizes (the largest shape served), got {max_dims!r}")
    else:
        max_dims = dims
    return InputSpec(name=name, data_type=dtype, dims=tuple(dims), max_dims=tuple(max_dims))


def parse_batch_sizes(text: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8]; '0' or 'none' means the model has no batch dimension -> [0]."""
    if text.strip().lower() in ("0", "none"):
        return [0]
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SamplesError(f"--batch-sizes {text!r} must be comma-separated integers, e.g. 1,4,8") from None
    if not sizes or any(s < 1 for s in sizes):
        raise SamplesError(f"--batch-sizes {text!r} must list sizes >= 1 (or 0 for a model without batching)")
    return sizes


def generate_samples(specs: Sequence[InputSpec], count: int, batch_sizes: Sequence[int],
                     seed: int = 0, int_high: int = 10) -> list[Sample]:
    """`count` random requests cycling through `batch_sizes` (0: no batch dimension).

    Integers are drawn from [0, int_high) so that they stay valid embedding ids for any
    table of at least that many rows; floats are standard normal.
    """
    if count < 1:
        raise SamplesError("--generate-samples must be at least 1")
    if int_high < 1:
        raise SamplesError("--int-high must be at least 1")
    rng = np.random.default_rng(seed)
    samples = []
    for index in range(count):
        batch = batch_sizes[index % len(batch_sizes)]
        inputs = {}
        for spec in specs:
            shape = ((batch,) if batch > 0 else ()) + spec.shape()
            inputs[spec.name] = _random(rng, spec.data_type, shape, int_high)
        samples.append(Sample(line=index + 1, inputs=inputs))
    return samples


def _random(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], int_high: int) -> np.ndarray:
    np_type = _NUMPY_TYPES[dtype]
    if dtype == "BOOL":
        return rng.random(shape) < 0.5
    if dtype.startswith("FP"):
        return rng.standard_normal(shape).astype(np_type)
    high = min(int_high, int(np.iinfo(np_type).max) + 1)
    return rng.integers(0, high, size=shape).astype(np_type)
