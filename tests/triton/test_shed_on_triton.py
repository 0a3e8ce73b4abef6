"""What a shed request looks like on a real Triton 2.51, to callers and to the operator's reader.

Three timed models (40 ms per request, one at a time) behind the queue policy `slo.overload:
shed` renders: `hurried` sheds what waits over 30 ms, `patient` waits up to 2 s unless the caller
asks for less, `bounded` holds at most 2 queued requests. A burst of concurrent requests is more
than each can serve in time. docs/overload.md quotes these answers.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

import timed_model
from rankops.triton import metrics

TIMEOUT_BODY = '{"error":"Request timeout expired"}'
QUEUE_FULL_BODY = '{"error":"[request id: <id_unknown>] Exceeds maximum queue size"}'
POLICIES = {"hurried": (30_000, 64), "patient": (2_000_000, 64), "bounded": (5_000_000, 2)}


def _policy(timeout_us: int, max_queue: int) -> str:
    return ("dynamic_batching { priority_levels: 2 default_priority_level: 1 default_queue_policy { "
            f"timeout_action: REJECT default_timeout_microseconds: {timeout_us} allow_timeout_override: true "
            f"max_queue_size: {max_queue} }} }}")


@pytest.fixture(scope="module")
def shedding_server(triton_install, tmp_path_factory):
    root = tmp_path_factory.mktemp("shed")
    for name, (timeout_us, max_queue) in POLICIES.items():
        repo = timed_model.write_repository(root, name, a_ms=40, b_ms=0, max_batch=1)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace(timed_model.batching_block(), _policy(timeout_us, max_queue)))
    with timed_model.server(triton_install, root, list(POLICIES)) as server:
        yield server


def _http(server, model: str, parameters: dict | None = None) -> tuple[int, str]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
    if parameters:
        body["parameters"] = parameters
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/infer",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, "ok"
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _burst(call: Callable[[], object], n: int) -> Counter:
    answers: list[object] = []
    threads = [threading.Thread(target=lambda: answers.append(call())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Counter(answers)


def _counters(server, model: str) -> metrics.ModelCounters:
    return metrics.scrape(server.metrics_url, model, "1")


def _report(server, model: str, before: metrics.ModelCounters, counted: int) -> dict:
    """run_report once Triton counted `counted` requests (or 5 s passed): a request dropped from
    the queue is counted when the scheduler next looks at it, not when its answer was sent."""
    deadline = time.monotonic() + 5
    while (report := metrics.run_report(before, _counters(server, model)))["requests"] < counted \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    return report


def test_a_shed_request_is_http_503_grpc_unavailable_and_counted_rejected(shedding_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server = shedding_server
    before = _counters(server, "hurried")
    http = _burst(lambda: _http(server, "hurried"), 8)
    assert set(http) <= {(200, "ok"), (503, TIMEOUT_BODY)}, http
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def grpc() -> tuple[str, str]:
        x = grpcclient.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        try:
            client.infer("hurried", [x])
            return "OK", ""
        except InferenceServerException as exc:
            return str(exc.status()), exc.message()

    rpc = _burst(grpc, 8)
    assert set(rpc) <= {("OK", ""), ("StatusCode.UNAVAILABLE", "Request timeout expired")}, rpc
    shed = http[(503, TIMEOUT_BODY)] + rpc[("StatusCode.UNAVAILABLE", "Request timeout expired")]
    assert shed >= 8, f"a burst of 8 on one 40 ms instance with a 30 ms queue timeout: {http}, {rpc}"
    # The strict reader takes the real page with its REJECTED series, and counts each shed request.
    report = _report(server, "hurried", before, 16)
    assert report["rejected"] == report["failures"] == shed, report
    assert report["requests"] == 16 and report["shedRatio"] == shed / 16
    print(f"hurried: HTTP {dict(http)}; gRPC {dict(rpc)}; report {report}")


def test_a_caller_can_shorten_its_deadline_but_not_lengthen_it(shedding_server):
    server = shedding_server
    # `patient` waits up to 2 s: four requests of 40 ms are all served...
    assert _burst(lambda: _http(server, "patient"), 4) == Counter({(200, "ok"): 4})
    # ...unless the caller says it gives up after 20 ms (KServe v2 parameter `timeout`, in us).
    hurried_caller = _burst(lambda: _http(server, "patient", {"timeout": 20_000}), 4)
    assert hurried_caller[(503, TIMEOUT_BODY)] >= 2, hurried_caller
    # A longer deadline than the model's is not granted: `hurried` still sheds at its 30 ms.
    patient_caller = _burst(lambda: _http(server, "hurried", {"timeout": 1_000_000}), 4)
    assert patient_caller[(503, TIMEOUT_BODY)] >= 2, patient_caller
    print(f"patient with timeout 20 ms: {dict(hurried_caller)}; hurried with timeout 1 s: {dict(patient_caller)}")


def test_a_full_queue_answers_503_but_is_counted_nowhere(shedding_server):
    server = shedding_server
    before = _counters(server, "bounded")
    answers = _burst(lambda: _http(server, "bounded"), 8)
    assert set(answers) <= {(200, "ok"), (503, QUEUE_FULL_BODY)}, answers
    assert answers[(503, QUEUE_FULL_BODY)] >= 3, answers
    report = _report(server, "bounded", before, answers[(200, "ok")])
    # Why the queue timeout, not max_queue_size, does the shedding: only the timeout is seen.
    assert report["failures"] == report["rejected"] == 0 and report["requests"] == answers[(200, "ok")], report
    print(f"bounded: {dict(answers)}; report {report}")


def test_a_grpc_deadline_cancels_queued_requests_an_http_timeout_does_not(shedding_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server = shedding_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def call() -> str:
        x = grpcclient.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        try:
            client.infer("patient", [x], client_timeout=0.05)   # the caller's gRPC deadline, 50 ms
            return "OK"
        except InferenceServerException as exc:
            return str(exc.status())

    before = _counters(server, "patient")
    answers = _burst(call, 6)
    assert answers["StatusCode.DEADLINE_EXCEEDED"] >= 4, answers
    report = _report(server, "patient", before, 6)
    # Triton drops the queued ones (reason CANCELED): a failure, not shed; the model ran far fewer.
    assert report["rejected"] == 0 and report["failures"] >= 4 and report["executions"] <= 2, report
    print(f"patient, gRPC deadline 50 ms: {dict(answers)}; report {report}")

    def http_giving_up() -> str:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/patient/infer",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=0.05) as answer:
                return str(answer.status)
        except TimeoutError:
            return "gave up"

    before = _counters(server, "patient")
    answers = _burst(http_giving_up, 6)
    assert answers["gave up"] >= 4, answers
    # An HTTP client's own timeout reaches no Triton: every request is still computed.
    report = _report(server, "patient", before, 6)
    assert report["executions"] == report["requests"] == 6 and report["failures"] == 0, report
