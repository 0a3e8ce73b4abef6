"""CPU stand-in for Triton's GPU backends (onnxruntime, pytorch, tensorrt), run by the Python backend.

Test harness only. Triton maps a config's `platform` to a backend name (`onnxruntime_onnx` ->
`onnxruntime`, `pytorch_libtorch` -> `pytorch`, `tensorrt_plan` -> `tensorrt`); a backend
directory holding just a `model.py` is run as a Python-based backend. The real-Triton fixture
links this file as `<backend>/model.py` for each of the three, so Triton core loads the rendered
config as it is (batching, warmup, version policy, response cache) and the version directory's
own artifact answers:

- onnxruntime: `model.onnx` with onnxruntime on the CPU;
- pytorch: `model.pt` with `torch.jit.load`, inputs passed in the config's order;
- tensorrt: `model.plan` only when it is an ONNX graph (what the tests write there). A real
  TensorRT engine cannot run on a CPU: loading one fails and says so. What this stand-in proves
  for `tensorrt_plan` is that Triton core accepts the config; nothing about the engine itself
  (bindings, optimisation profiles, INT8 calibration).

Requests the dynamic batcher hands over together are concatenated along the batch dimension and
run as one batch, as the real backends do; `stats` in the log are Triton's own.

A version directory may also hold `standin_device_ms.json`, `{"a_ms": A, "b_ms": B}`: each
execution then also sleeps A + B x rows ms, a device's compute time that costs the host no CPU
(benchmarks/autoscale_bench.py --optimistic-profile: a replica whose capacity is its own, not a
share of the machine's cores).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FILES = {"onnxruntime": "model.onnx", "pytorch": "model.pt", "tensorrt": "model.plan"}
ONNX_MAGIC = b"\x08"  # an ONNX ModelProto starts with field 1 (ir_version), varint
DEVICE_FILE = "standin_device_ms.json"


def _backend(config: dict) -> str:
    platform = config.get("platform") or ""
    return {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch",
            "tensorrt_plan": "tensorrt"}.get(platform, config.get("backend") or "onnxruntime")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.config = json.loads(args["model_config"])
        self.backend = _backend(self.config)
        self.batching = int(self.config.get("max_batch_size", 0)) > 0
        self.inputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"]))
                       for t in self.config["input"]]
        self.outputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"]))
                        for t in self.config["output"]]
        filename = self.config.get("default_model_filename") or FILES[self.backend]
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(f"{self.backend} stand-in: {path} not found")
        self.device_ms = (0.0, 0.0)
        device = os.path.join(args["model_repository"], args["model_version"], DEVICE_FILE)
        if os.path.exists(device):
            with open(device) as fh:
                cost = json.load(fh)
            self.device_ms = (float(cost.get("a_ms", 0.0)), float(cost.get("b_ms", 0.0)))
        if self.backend == "pytorch":
            import torch

            self.torch = torch
            self.module = torch.jit.load(path, map_location="cpu").eval()
            self.run = self._run_torch
            return
        with open(path, "rb") as fh:
            head = fh.read(1)
        if self.backend == "tensorrt" and head != ONNX_MAGIC:
            raise pb_utils.TritonModelException(
                f"tensorrt stand-in: {path} is a TensorRT engine, which cannot run without a GPU; "
                "the CPU stand-in runs only an ONNX graph stored as model.plan")
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.run = self._run_onnx

    def _run_onnx(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        by_name = dict(zip(names, self.session.run(names, feeds)))
        return [by_name[name] if name in by_name else list(by_name.values())[i]
                for i, (name, _) in enumerate(self.outputs)]

    def _run_torch(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with self.torch.no_grad():
            result = self.module(*[self.torch.from_numpy(np.ascontiguousarray(feeds[n])) for n, _ in self.inputs])
        if isinstance(result, dict):
            result = [result[n] for n, _ in self.outputs]
        elif not isinstance(result, (list, tuple)):
            result = [result]
        return [r.detach().numpy() for r in result]

    def execute(self, requests: list) -> list:
        feeds = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name, _ in self.inputs}
                 for r in requests]
        # The batcher joins only requests of identical shapes beyond the batch dimension, so
        # they concatenate; run them as one batch like the real backends do.
        groups: dict = {}
        for i, feed in enumerate(feeds):
            key = tuple(feed[n].shape[1:] for n, _ in self.inputs) if self.batching else i
            groups.setdefault(key, []).append(i)
        responses: list = [None] * len(requests)
        failed = []
        for group in groups.values():
            joined = {name: np.concatenate([feeds[i][name] for i in group]) if len(group) > 1
                      else feeds[group[0]][name] for name, _ in self.inputs}
            try:
                results = self.run(joined)
                if self.device_ms != (0.0, 0.0):
                    rows_in = len(next(iter(joined.values()))) if self.batching else 1
                    time.sleep((self.device_ms[0] + self.device_ms[1] * rows_in) / 1000.0)
            except Exception as exc:  # the model's own error fails its whole batch, as in the real backends
                failed.append(f"{self.backend} stand-in: {exc}")
                for i in group:
                    responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(failed[-1]))
                continue
            offset = 0
            for i in group:
                rows = len(next(iter(feeds[i].values()))) if self.batching else None
                outs = []
                for (name, dtype), value in zip(self.outputs, results):
                    part = value[offset:offset + rows] if rows is not None else value
                    outs.append(pb_utils.Tensor(name, np.ascontiguousarray(part.astype(dtype))))
                responses[i] = pb_utils.InferenceResponse(output_tensors=outs)
                offset += rows or 0
        if failed and len(failed) == len(groups):
            # Raised, not returned: Triton counts a Python model's error responses as successes
            # (triton-inference-server/server#7713) but a raised error as failures, as the real
            # onnxruntime/pytorch backends report theirs (nv_inference_request_failure).
            raise pb_utils.TritonModelException(failed[0])
        return responses
