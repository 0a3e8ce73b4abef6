"""Every rendered config loads in a real tritonserver and answers one request with the right shapes.

Rendered exactly as the operator renders it (desired_objects), served with the Deployment's own
tritonserver arguments (only the local paths and ports changed, and the CPU edits printed), and
judged by the server: it must load the model, log no warning or error a CPU-only start does not
explain, and answer an inference request with the declared output shapes.
"""
from __future__ import annotations

import copy
import socket
import urllib.request
from pathlib import Path

import pytest
import yaml

from rankops_dev import spec_models, triton
from triton_serving import expected_output_shapes, serve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("rankingmodel-*.yaml"))
CASES = sorted(p for p in (ROOT / "tests" / "core" / "cases").glob("*.yaml") if p.name != "pools.yaml")

BASE = {
    "apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
    "metadata": {"name": "ranker", "namespace": "reco"},
    "spec": {
        "version": "1",
        "versions": [{"name": "1", "modelUri": "s3://models/ranker/1", "format": "onnx"}],
        "candidates": {"layout": "batch", "minPerRequest": 5, "maxPerRequest": 64},
        "inputs": [{"name": "user_features", "dataType": "FP32", "dims": [16]},
                   {"name": "item_features", "dataType": "FP32", "dims": [8]}],
        "outputs": [{"name": "scores", "dataType": "FP32", "dims": [1]}],
        "batching": {"maxBatchSize": 256, "preferredBatchSizes": [128, 256], "maxQueueDelayMicroseconds": 500},
        "modelWarmup": {"batchSizes": [1, 64, 256]},
    },
}


def _doc(**spec) -> dict:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec)
    return doc


def _versions(path: Path) -> list[tuple[dict, str]]:
    doc = yaml.safe_load(path.read_text())
    return [(doc, v["name"]) for v in doc["spec"]["versions"]]


def _check(install, doc: dict, tmp_path: Path, version: str | None = None, candidates: int = 7) -> None:
    with serve(install, doc, tmp_path, version) as (rm, server):
        inputs = spec_models.request_arrays(rm.spec, candidates=candidates)
        outputs = server.infer(rm.metadata["name"], inputs)
        shapes = {name: list(value.shape) for name, value in outputs.items()}
        assert shapes == expected_output_shapes(rm, inputs, candidates)
        findings = server.findings()
    assert not findings, "Triton warned or refused:\n" + "\n".join(findings)


@pytest.mark.parametrize("path,version", [pytest.param(p, v, id=f"{p.stem}-v{v}")
                                          for p in EXAMPLES + CASES for _, v in _versions(p)])
def test_examples_and_cases_load_and_answer(triton_install, tmp_path, path, version):
    _check(triton_install, yaml.safe_load(path.read_text()), tmp_path, version)


@pytest.mark.parametrize("fmt", ["onnx", "tensorrt_plan", "torchscript"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_every_format_and_precision(triton_install, tmp_path, fmt, precision):
    doc = _doc(versions=[{"name": "1", "modelUri": "s3://models/ranker/1", "format": fmt, "precision": precision}])
    _check(triton_install, doc, tmp_path)


def test_response_cache(triton_install, tmp_path):
    _check(triton_install, _doc(responseCache=True), tmp_path)


def test_warmup_with_integer_ids_and_variable_candidates(triton_install, tmp_path):
    """Random warmup data fills INT64 ids across the whole int64 range: the lookup failed and the
    model never loaded. Integers and booleans now warm up with zeros."""
    doc = _doc(candidates=None, inputs=[
        {"name": "user_ids", "dataType": "INT64", "dims": [4]},
        {"name": "item_ids", "dataType": "INT64", "dims": [-1], "maxDims": [50]},
        {"name": "item_flags", "dataType": "BOOL", "dims": [-1, 2], "maxDims": [50, 2]},
        {"name": "item_features", "dataType": "FP32", "dims": [-1, 8], "maxDims": [50, 8]},
    ], outputs=[{"name": "scores", "dataType": "FP32", "dims": [-1]}],
        batching={"maxBatchSize": 8, "preferredBatchSizes": [4, 8]}, modelWarmup={"batchSizes": [1, 8]})
    _check(triton_install, doc, tmp_path)


def test_warmup_with_integer_ids_as_the_batch(triton_install, tmp_path):
    doc = _doc(inputs=[{"name": "user_id", "dataType": "INT32", "dims": [1]},
                       {"name": "item_id", "dataType": "INT64", "dims": [1]},
                       {"name": "item_features", "dataType": "FP16", "dims": [8]}])
    _check(triton_install, doc, tmp_path, candidates=64)


def test_batching_auto(triton_install, tmp_path):
    doc = _doc(candidates={"layout": "padded"}, batching="auto",
               inputs=[{"name": "user_features", "dataType": "FP32", "dims": [16]},
                       {"name": "item_features", "dataType": "FP32", "dims": [50, 8]}],
               outputs=[{"name": "scores", "dataType": "FP32", "dims": [50]}],
               modelWarmup={"batchSizes": [1]},
               slo={"p99LatencyMs": 10, "targetQps": 500},
               planning={"latencyProfile": {1: 1.0, 4: 1.3, 8: 1.8, 16: 3.0}})
    _check(triton_install, doc, tmp_path, candidates=50)


def test_overload_shed_with_max_batch_one(triton_install, tmp_path):
    """maxBatchSize 1 renders no batcher, except that a queue policy (slo.overload shed) lives only in one."""
    doc = _doc(candidates={"layout": "batch", "minPerRequest": 1, "maxPerRequest": 1}, batching={"maxBatchSize": 1},
               modelWarmup={"batchSizes": [1]},
               slo={"p99LatencyMs": 10, "targetQps": 100, "overload": "shed",
                    "queuePolicy": {"timeoutMicroseconds": 5000}})
    _check(triton_install, doc, tmp_path, candidates=1)


def test_two_instances_per_gpu(triton_install, tmp_path):
    _check(triton_install, _doc(instancesPerGpu=2), tmp_path)


def test_a_tensorrt_engine_is_refused_by_the_cpu_standin(triton_install, tmp_path):
    """The tensorrt stand-in runs only ONNX stored as model.plan; an engine fails to load, saying why."""
    doc = _doc(versions=[{"name": "1", "modelUri": "s3://models/ranker/1", "format": "tensorrt_plan",
                          "precision": "int8"}])
    _, deployment, config_map = triton.rendered_serving(doc)
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "model.plan").write_bytes(b"ftrt\x00not an onnx graph")
    server = triton.TritonServer.for_rendered(deployment, config_map, {"1": engine}, tmp_path, install=triton_install)
    with pytest.raises(triton.TritonError, match="cannot run without a GPU"):
        server.start(timeout_s=60)


def test_findings_see_glog_and_plain_warnings_but_not_the_cpu_only_start(tmp_path, triton_install):
    from rankops_dev import triton

    log = tmp_path / "tritonserver.log"
    log.write_text(
        "Error: Failed to initialize NVML\n"
        'W1201 08:49:35.055377 11264 metrics.cc:798] "DCGM unable to start: DCGM initialization error"\n'
        "Warning: '--strict-model-config' has been deprecated! Please use '--disable-auto-complete-config' instead.\n"
        'E1201 09:03:09.395285 31719 model_lifecycle.cc:642] "failed to load \'ranker\' version 1"\n'
        'I1201 08:49:35.055588 11264 metrics.cc:770] "Collecting CPU metrics"\n')
    server = triton.TritonServer(install=triton_install, container_args=[], repository=tmp_path, log_path=log)
    assert [f.split()[0] for f in server.findings()] == ["Warning:", "E1201"]


def test_ports_picked_together_are_distinct():
    from rankops_dev.ports import free_ports

    ports = free_ports(64)
    assert len(set(ports)) == 64 and all(1024 <= p <= 65535 for p in ports)


def test_a_start_on_a_port_another_process_took_is_tried_again_on_fresh_ports(tmp_path, triton_install,
                                                                               monkeypatch):
    """CI once saw Triton refuse to start on a just-picked port; the server picks again, and says
    the first failure when the ports were the caller's own."""
    from rankops_dev import ports as port_module

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    picks = []
    real = port_module.free_ports

    def first_pick_taken(count, host="127.0.0.1"):
        picked = real(count, host)
        picks.append(picked)
        return [taken, *picked[1:]] if len(picks) == 1 else picked

    monkeypatch.setattr(triton, "free_ports", first_pick_taken)
    args = ["--model-control-mode=explicit", "--log-verbose=0"]
    try:
        with triton.TritonServer(install=triton_install, container_args=args, repository=tmp_path,
                                 log_path=tmp_path / "auto.log") as server:
            assert len(picks) == 2 and server.ports["http"] != taken
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as resp:
                assert resp.status == 200
        given = triton.TritonServer(install=triton_install, container_args=args, repository=tmp_path,
                                    log_path=tmp_path / "given.log",
                                    ports={"http": taken, "grpc": real(1)[0], "metrics": real(1)[0]})
        with pytest.raises(triton.TritonError, match="already in use"):
            given.start(timeout_s=60)
    finally:
        squatter.close()
