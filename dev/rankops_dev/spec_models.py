"""Small ranking models shaped exactly like a RankingModel's inputs and outputs (test harness).

For the real-Triton fixture: any spec's tensors get a model that Triton can load as rendered and
that answers with the declared output shapes, exported as the version's format (ONNX, TorchScript,
or an ONNX graph stored as model.plan for the tensorrt stand-in). The model is what a ranker
looks like: integer inputs are embedding ids (a lookup that fails on an id past the table, as a
real embedding does), each input is projected to a hidden vector, per-user inputs are broadcast
over the candidates, and an MLP head gives one score per candidate.

An input whose first dim is -1 carries candidates (`[B, N, ...]`); the others are per row. With
candidates as the batch dimension no input has that -1: every row is one candidate.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

from rankops.api.rankingmodel import ModelFormat, RankingModelSpec, TensorSpec
from rankops.render.tritonconfig import MODEL_FILENAMES

HIDDEN = 8
EMBEDDING_DIM = 4
VOCAB = 1000        # embedding rows; ids must stay below this
_TORCH_TYPES = {"FP32": "float32", "FP16": "float16", "FP64": "float64", "INT64": "int64", "INT32": "int32",
                "INT16": "int16", "INT8": "int8", "UINT8": "uint8", "BOOL": "bool"}


def _carries_candidates(tensor: TensorSpec) -> bool:
    return len(tensor.dims) >= 1 and tensor.dims[0] == -1


def _trailing(tensor: TensorSpec) -> list[int]:
    rest = tensor.dims[1:] if _carries_candidates(tensor) else tensor.dims
    if any(d == -1 for d in rest):
        raise ValueError(f"tensor {tensor.name}: only the first dim may be variable in a test model, got {tensor.dims}")
    return list(rest)


def build_module(spec: RankingModelSpec, seed: int = 0, hidden: int = HIDDEN):
    import torch

    class SpecModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.inputs = [(t.name, t.data_type.value, _carries_candidates(t), _trailing(t)) for t in spec.inputs]
            self.embeddings = torch.nn.ModuleList()
            self.projections = torch.nn.ModuleList()
            for _, dtype, _, trailing in self.inputs:
                width = math.prod(trailing)
                if dtype.startswith("INT") or dtype.startswith("UINT"):
                    self.embeddings.append(torch.nn.Embedding(VOCAB, EMBEDDING_DIM))
                    width *= EMBEDDING_DIM
                else:
                    self.embeddings.append(torch.nn.Identity())
                self.projections.append(torch.nn.Linear(width, hidden))
            self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                            torch.nn.Linear(hidden, 1))
            self.outputs = [(t.name, t.data_type.value, _carries_candidates(t), _trailing(t)) for t in spec.outputs]
            self.output_scales = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(max(1, math.prod(trailing)))) for *_, trailing in self.outputs])

        def forward(self, *tensors):
            batch = tensors[0].shape[0]
            per_row, per_candidate = [], []
            for (name, dtype, candidates, trailing), x, embed, project in zip(
                    self.inputs, tensors, self.embeddings, self.projections):
                if dtype.startswith("INT") or dtype.startswith("UINT"):
                    x = embed(x.long())
                x = x.float()
                if candidates:
                    per_candidate.append(project(x.reshape(batch, x.shape[1], -1)))
                else:
                    per_row.append(project(x.reshape(batch, -1)))
            if per_candidate:
                hidden = sum(per_candidate)
                if per_row:
                    hidden = hidden + sum(per_row).unsqueeze(1)
            else:
                hidden = sum(per_row)
            score = self.head(hidden).squeeze(-1)            # [B, N] or [B]
            results = []
            for (name, dtype, candidates, trailing), scale in zip(self.outputs, self.output_scales):
                base = score if candidates or score.dim() == 1 else score.mean(dim=1)
                value = base.unsqueeze(-1) * scale
                shape = [batch] + ([base.shape[1]] if candidates else []) + trailing
                results.append(value.reshape(shape).to(getattr(torch, _TORCH_TYPES[dtype])))
            return tuple(results) if len(results) > 1 else results[0]

    return SpecModel().eval()


def example_inputs(spec: RankingModelSpec, batch: int = 2, candidates: int = 3):
    import torch

    tensors = []
    for t in spec.inputs:
        shape = [batch] + ([candidates] if _carries_candidates(t) else []) + _trailing(t)
        dtype = t.data_type.value
        if dtype == "BOOL":
            tensors.append(torch.zeros(shape, dtype=torch.bool))
        elif dtype.startswith("INT") or dtype.startswith("UINT"):
            tensors.append(torch.randint(0, 10, shape, dtype=getattr(torch, _TORCH_TYPES[dtype])))
        else:
            tensors.append(torch.randn(shape).to(getattr(torch, _TORCH_TYPES[dtype])))
    return tuple(tensors)


def export(spec: RankingModelSpec, fmt: ModelFormat, directory: Path, seed: int = 0,
           fp16_weights: bool = False, vocab: int = VOCAB, hidden: int = HIDDEN) -> Path:
    """Write the model for `spec` into `directory` (a version directory) as `fmt`; returns the file.

    The same `seed` gives the same weights; `fp16_weights` rounds them to FP16 first (what an
    FP16 engine does to the same model: scores move a little, the ranking stays). `vocab` keeps
    only the first rows of each embedding table: the same answers for small ids, a failed request
    for an id past the table (a version built on a smaller id space). `hidden` widens the layers:
    the same interface, more compute per candidate (a slower version).
    """
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    module = build_module(spec, seed, hidden)
    if vocab < VOCAB:
        for index, embedding in enumerate(module.embeddings):
            if isinstance(embedding, torch.nn.Embedding):
                module.embeddings[index] = torch.nn.Embedding.from_pretrained(embedding.weight[:vocab].detach().clone())
    if fp16_weights:
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.copy_(parameter.half().float())
    example = example_inputs(spec)
    path = directory / MODEL_FILENAMES[fmt]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracing and the TorchScript-based ONNX exporter warn; both are fine here
        if fmt is ModelFormat.torchscript:
            torch.jit.trace(module, example).save(str(path))
            return path
        dynamic = {}
        for t in spec.inputs:
            dynamic[t.name] = {0: "batch", **({1: "candidates"} if _carries_candidates(t) else {})}
        for t in spec.outputs:
            dynamic[t.name] = {0: "batch", **({1: "candidates"} if _carries_candidates(t) else {})}
        torch.onnx.export(module, example, str(path), input_names=[t.name for t in spec.inputs],
                          output_names=[t.name for t in spec.outputs], dynamic_axes=dynamic, dynamo=False)
    return path


def request_arrays(spec: RankingModelSpec, candidates: int = 7, users: int = 2, seed: int = 0) -> dict:
    """One request as production sends it (numpy, by input name): `candidates` candidates for
    `users` users; with candidates as the batch dimension, one user and a batch row per candidate."""
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    from rankops.api.rankingmodel import CandidateLayout

    rng = np.random.default_rng(seed)
    layout = spec.candidates.layout if spec.candidates else None
    rows = candidates if layout is CandidateLayout.batch else users
    arrays = {}
    for t in spec.inputs:
        shape = [rows] + [candidates if d == -1 else d for d in t.dims]
        dtype = triton_to_np_dtype(t.data_type.value)
        if t.data_type.value == "BOOL":
            arrays[t.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            arrays[t.name] = rng.integers(0, 10, size=shape).astype(dtype)
        else:
            arrays[t.name] = rng.standard_normal(shape).astype(dtype)
    return arrays


def export_versions(rm, dest: Path, seed: int = 0) -> list[Path]:
    """Every version of a RankingModel exported under `dest` at its object-store path
    (s3://BUCKET/ctr-ranker/3 -> dest/ctr-ranker/3/model.onnx): what the demo uploads."""
    from urllib.parse import urlparse

    written = []
    for version in rm.spec.versions:
        uri = urlparse(version.model_uri)
        if uri.scheme not in ("s3", "gs", "http", "https"):
            continue
        written.append(export(rm.spec, version.format, dest / uri.path.strip("/"), seed=seed))
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    import yaml

    from rankops.api.rankingmodel import RankingModel

    parser = argparse.ArgumentParser(prog="python -m rankops_dev.spec_models",
                                     description="export a small model shaped like a RankingModel's tensors, per version")
    parser.add_argument("manifest", type=Path, help="a RankingModel manifest")
    parser.add_argument("dest", type=Path, help="directory; each version lands at its object-store path under it")
    args = parser.parse_args(argv)
    rm = RankingModel.model_validate(yaml.safe_load(args.manifest.read_text()))
    for path in export_versions(rm, args.dest):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
