"""Fixtures for the gate tests: small ranking models built with torch, served by a real MLServer.

The models score candidates for a user: user features (FP32 [B, 16]) and, per candidate, an id
(INT64 [B, N], embedded) and dense features (FP32 [B, N, 8]) -> an MLP -> scores [B, N]. N, the
candidate count, is variable. Variants of one trained-looking model are exported to ONNX and
served side by side by one MLServer process (with a tiny onnxruntime runtime, as MLServer ships
none for ONNX):

  reference   the model in FP32
  fp16        the same weights rounded to FP16 (what an FP16 engine does to them): equivalent
  perturbed   MLP weights with noise: scores move and items reorder
  renamed     an input renamed: the candidate's interface no longer matches the samples
  broken      an embedding table smaller than the ids in the samples: every request errors

The original module is also saved as TorchScript, the reference of last resort.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rankops_dev.ports import free_ports


HERE = Path(__file__).parent
USER_DIM, ITEM_DIM, VOCAB = 16, 8, 100   # as in gate_test_models
INPUT_SPEC = [
    {"name": "user_features", "dataType": "FP32", "dims": [USER_DIM]},
    {"name": "item_ids", "dataType": "INT64", "dims": [-1], "maxDims": [40]},
    {"name": "item_features", "dataType": "FP32", "dims": [-1, ITEM_DIM], "maxDims": [40, ITEM_DIM]},
]
INPUT_SPEC_NAMES = [spec["name"] for spec in INPUT_SPEC]


@pytest.fixture(scope="session")
def input_spec() -> list[dict]:
    """The models' inputs as a RankingModel spec lists them (dims without the batch dimension)."""
    return INPUT_SPEC


@dataclass(frozen=True)
class RankingModels:
    root: Path                 # the MLServer model repository
    torchscript: Path          # the original reference model


@pytest.fixture(scope="session")
def ranking_models(tmp_path_factory) -> RankingModels:
    try:
        import torch  # noqa: F401
    except ImportError:
        message = "the gate tests build their models with torch: pip install -e '.[torch]'"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must run them, not skip them)")
        pytest.skip(message)
    import onnxruntime
    from gate_test_models import export_onnx, reference_model, tensor_metadata, variant, torch

    root = tmp_path_factory.mktemp("models")
    shutil.copy(HERE / "mlserver_onnx_runtime.py", root / "mlserver_onnx_runtime.py")
    names = list(INPUT_SPEC_NAMES)
    for name, input_names in [("reference", names), ("fp16", names), ("perturbed", names),
                             ("renamed", ["user_feats", *names[1:]]), ("broken", names)]:
        folder = root / name
        folder.mkdir()
        export_onnx(variant(name), folder / "model.onnx", input_names)
        session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        (folder / "model-settings.json").write_text(json.dumps({
            "name": name,
            "implementation": "mlserver_onnx_runtime.OnnxRuntime",
            "parameters": {"uri": "./model.onnx", "version": "1"},
            "inputs": tensor_metadata(session.get_inputs()),
            "outputs": tensor_metadata(session.get_outputs()),
        }))
    torchscript = root / "reference.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # TorchScript is deprecated upstream, still the format served
        torch.jit.script(reference_model()).save(str(torchscript))
    return RankingModels(root=root, torchscript=torchscript)


@dataclass(frozen=True)
class Server:
    url: str          # HOST:PORT for the gates
    log: Path


@pytest.fixture(scope="session")
def mlserver(ranking_models: RankingModels, tmp_path_factory) -> Server:
    """One MLServer serving every variant on 127.0.0.1, for the whole session."""
    http_port, grpc_port, metrics_port = free_ports(3)
    (ranking_models.root / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port,
        "parallel_workers": 0,     # MLServer 1.7.1 serves custom runtimes in-process only this way
        "load_models_at_startup": True, "debug": False,
    }))
    log = tmp_path_factory.mktemp("mlserver") / "mlserver.log"
    mlserver_bin = Path(sys.executable).parent / "mlserver"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        process = subprocess.Popen([str(mlserver_bin), "start", str(ranking_models.root)],
                                   cwd=ranking_models.root, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_ready(http_port, ["reference", "fp16", "perturbed", "renamed", "broken"], process, log)
        yield Server(url=f"127.0.0.1:{http_port}", log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _wait_ready(port: int, models: list[str], process: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(models)
    while pending:
        if process.poll() is not None:
            pytest.fail(f"mlserver exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"mlserver: models {pending} not ready after {timeout_s}s:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{pending[0]}/ready", timeout=2) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(0.3)


@pytest.fixture(scope="session")
def golden_samples(tmp_path_factory) -> Path:
    """Recorded-looking requests: batch sizes 1, 2 and 4, 30 candidates each, ids within the vocabulary."""
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("samples") / "golden.jsonl"
    lines = []
    for index in range(24):
        batch = (1, 2, 4)[index % 3]
        lines.append(json.dumps({"inputs": {
            "user_features": rng.standard_normal((batch, USER_DIM)).round(4).tolist(),
            "item_ids": rng.integers(0, VOCAB, (batch, 30)).tolist(),
            "item_features": rng.standard_normal((batch, 30, ITEM_DIM)).round(4).tolist(),
        }}))
    path.write_text("\n".join(lines) + "\n")
    return path
