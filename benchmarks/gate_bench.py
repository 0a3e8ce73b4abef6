"""How many requests/s the warmup gate's driver sustains against a local MLServer, and at what latency.

Builds a small ranking model (embeddings + MLP, as ONNX with onnx.helper: no torch needed),
serves it with MLServer 1.7.1 on 127.0.0.1 (the onnxruntime runtime from tests/gates), and
replays generated requests through `rankops.gates.warmup.replay` at several concurrencies.
Prints one line per run; the server is the bottleneck here, so the numbers bound the driver
from below. Every loop is bounded in requests and time, and the server is stopped at the end.

    .venv/bin/python benchmarks/gate_bench.py [--requests 2000] [--concurrency 1,4,8] [--candidates 50]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rankops.triton.client import Endpoint
from rankops.triton.samples import generate_samples, parse_input_spec
from rankops.gates.warmup import WarmupConfig, latency_stats, replay
from rankops_dev.ports import free_ports

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "tests" / "gates" / "mlserver_onnx_runtime.py"
USER, ITEM, EMB, HIDDEN, VOCAB = 16, 8, 8, 32, 100


def ranking_model() -> onnx.ModelProto:
    """scores[B, N] = w2 . relu(E[ids] W1e + items W1i + (user Wu) W1u + b1)."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        helper.make_node("Gather", ["emb", "item_ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w1e"], ["he"]),
        helper.make_node("MatMul", ["item_features", "w1i"], ["hi"]),
        helper.make_node("MatMul", ["user_features", "wu"], ["u"]),
        helper.make_node("MatMul", ["u", "w1u"], ["hu2"]),
        helper.make_node("Unsqueeze", ["hu2", "axis1"], ["hu"]),
        helper.make_node("Add", ["he", "hi"], ["s1"]),
        helper.make_node("Add", ["s1", "hu"], ["s2"]),
        helper.make_node("Add", ["s2", "b1"], ["s3"]),
        helper.make_node("Relu", ["s3"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["o"]),
        helper.make_node("Squeeze", ["o", "axis_last"], ["scores"]),
    ]
    init = [weight("emb", VOCAB, EMB), weight("w1e", EMB, HIDDEN), weight("w1i", ITEM, HIDDEN),
            weight("wu", USER, EMB), weight("w1u", EMB, HIDDEN), weight("b1", HIDDEN), weight("w2", HIDDEN, 1),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last")]
    graph = helper.make_graph(
        nodes, "ranker",
        [helper.make_tensor_value_info("user_features", TensorProto.FLOAT, ["B", USER]),
         helper.make_tensor_value_info("item_ids", TensorProto.INT64, ["B", "N"]),
         helper.make_tensor_value_info("item_features", TensorProto.FLOAT, ["B", "N", ITEM])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", "N"])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def start_mlserver(root: Path) -> tuple[subprocess.Popen, int]:
    shutil.copy(RUNTIME, root / RUNTIME.name)
    folder = root / "ranker"
    folder.mkdir()
    onnx.save(ranking_model(), folder / "model.onnx")
    shape = {"user_features": [-1, USER], "item_ids": [-1, -1], "item_features": [-1, -1, ITEM]}
    types = {"user_features": "FP32", "item_ids": "INT64", "item_features": "FP32"}
    (folder / "model-settings.json").write_text(json.dumps({
        "name": "ranker", "implementation": "mlserver_onnx_runtime.OnnxRuntime",
        "parameters": {"uri": "./model.onnx", "version": "1"},
        "inputs": [{"name": n, "datatype": types[n], "shape": shape[n]} for n in shape],
        "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, -1]}]}))
    port, grpc_port, metrics_port = free_ports(3)
    (root / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": port, "grpc_port": grpc_port, "metrics_port": metrics_port,
        "parallel_workers": 0}))
    log = open(root / "mlserver.log", "wb")
    process = subprocess.Popen([str(Path(sys.executable).parent / "mlserver"), "start", str(root)],
                               cwd=root, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"mlserver exited:\n{(root / 'mlserver.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/ranker/ready", timeout=2) as r:
                if r.status == 200:
                    return process, port
        except OSError:
            time.sleep(0.3)
    process.terminate()
    raise SystemExit("mlserver did not become ready in 90s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--candidates", type=int, default=50, help="items per request")
    parser.add_argument("--batch-sizes", default="1,4,8")
    args = parser.parse_args()
    spec = parse_input_spec([
        {"name": "user_features", "dataType": "FP32", "dims": [USER]},
        {"name": "item_ids", "dataType": "INT64", "dims": [-1], "maxDims": [args.candidates]},
        {"name": "item_features", "dataType": "FP32", "dims": [-1, ITEM], "maxDims": [args.candidates, ITEM]}])
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    samples = generate_samples(spec, count=2 * len(batch_sizes), batch_sizes=batch_sizes)
    with tempfile.TemporaryDirectory() as tmp:
        process, port = start_mlserver(Path(tmp))
        try:
            endpoint = Endpoint(url=f"127.0.0.1:{port}", model="ranker", binary_data=False)
            connection = endpoint.connect()
            info = connection.model_info()
            requests = [connection.build_request(s, info) for s in samples]
            for request in requests:          # cold pass, as the gate does
                connection.infer(request)
            connection.close()
            print(f"MLServer 1.7.1 + onnxruntime (1 thread), {args.candidates} candidates, "
                  f"batch sizes {batch_sizes}, JSON tensors")
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                config = WarmupConfig(requests=args.requests, concurrency=concurrency, max_p99_ms=1e9)
                seen = replay(endpoint, requests, config)
                latencies = [v for vs in seen.latencies_ms.values() for v in vs]
                stats = latency_stats(latencies)
                print(f"concurrency {concurrency:>2}: {len(latencies) / seen.elapsed_s:7.0f} req/s  "
                      f"p50 {stats['p50Ms']:6.2f} ms  p99 {stats['p99Ms']:6.2f} ms  "
                      f"errors {seen.error_count}  ({seen.sent} requests in {seen.elapsed_s:.1f}s)")
        finally:
            process.terminate()
            process.wait(timeout=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
