"""Issue 41's first e2e figure, on real tritonserver processes (no Kubernetes yet): the in-place
switch's machine (rollout/inplace.py) driven by its shell (controller/inplace_pods.py) over three
servers started with the rendered Deployment's arguments, each with its own repository directory,
v1 serving under steady unversioned traffic from a thread.

(a) v2 (v1's weights rounded to FP16: equivalent) is staged by the strict fetcher from a file://
    directory, loaded in place, gated (warmup + equivalence against v1 on the same pod) and
    promoted: no failed request, the same server processes, v1 unloaded everywhere and its files gone.
(b) v3 (other weights) fails equivalence: rolled back, the version that served still serves
    everywhere, v3 unloaded everywhere and its files gone.
(c) a pod that accepts and never answers costs a bounded read and one request in flight, not the loop.
"""
from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from collections import Counter

import numpy as np
import pytest

from rankops.api.rankingmodel import ModelFormat
from rankops.controller.inplace_pods import Executor, PodGates, PodTarget, Switcher, fetched_from, no_gates
from rankops.planner.two_versions import SideBySide
from rankops.render import names
from rankops.render.serving import API_KEY_HEADER, API_KEY_SECRET_KEY
from rankops.rollout import inplace
from rankops.triton.client import Endpoint
from rankops.triton.samples import Sample
from rankops_dev import spec_models, triton
from test_conformance import _doc

PODS = 3
MODEL = "ranker"
DOC = _doc(
    versions=[{"name": v, "modelUri": f"s3://models/ranker/{v}", "format": "onnx"} for v in ("1", "2", "3")],
    # The gates as a small rollout sets them; the bound leaves room for a 2-core machine running
    # three servers, the traffic and the gate at once (speeds live in benchmarks/).
    rollout={"warmup": {"requests": 120, "concurrency": 2, "maxP99Ms": 3000}},
)
POLICY = inplace.Policy(replicas=PODS, failure_tolerance=1, max_stable_p99_ms=10_000, load_timeout_s=120)


class SteadyTraffic(threading.Thread):
    """Unversioned requests round-robin over the servers, as a Service spreads them; counts answers
    by the version that gave them, and failures."""

    def __init__(self, servers, inputs):
        super().__init__(daemon=True)
        self.servers, self.inputs = servers, inputs
        self.answered: Counter[str] = Counter()
        self.failures: list[str] = []
        self.latencies_ms: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        from tritonclient.http import InferenceServerClient

        connections = [Endpoint(s.http_url, MODEL, timeout_s=10).connect() for s in self.servers]
        requests = [c.build_request(Sample(line=1, inputs=self.inputs), c.model_info()) for c in connections]
        try:
            while not self.halt.is_set():
                for connection, request in zip(connections, requests):
                    started = time.monotonic()
                    try:
                        headers, body = connection.send(request)
                        length = headers.get("inference-header-content-length")
                        result = InferenceServerClient.parse_response_body(
                            body, header_length=int(length) if length else None)
                        self.answered[result.get_response()["model_version"]] += 1
                        self.latencies_ms.append((time.monotonic() - started) * 1000)
                    except Exception as exc:   # every failure counts, whatever its kind
                        self.failures.append(f"{connection.endpoint.url}: {type(exc).__name__}: {exc}")
                time.sleep(0.01)
        finally:
            for connection in connections:
                connection.close()

    def p99_ms(self) -> float | None:
        recent = self.latencies_ms[-200:]
        return float(np.percentile(recent, 99)) if recent else None


@pytest.fixture(scope="module")
def fleet(triton_install, tmp_path_factory):
    """Three serving v1, each with its own repository; the artifacts of v2 and v3 beside them."""
    servers = []
    try:
        for i in range(PODS):
            rm, server = triton.server_for_model(DOC, tmp_path_factory.mktemp(f"pod{i}"), "1", install=triton_install)
            servers.append(server.start())
        artifacts = tmp_path_factory.mktemp("store")
        spec_models.export(rm.spec, ModelFormat.onnx, artifacts / "2", fp16_weights=True)
        spec_models.export(rm.spec, ModelFormat.onnx, artifacts / "3", seed=11)
        pods = {}
        for i, server in enumerate(servers):
            key = server.secrets[names.api_key_secret_name(MODEL)][API_KEY_SECRET_KEY]
            pods[f"pod-{i}"] = PodTarget(f"pod-{i}", f"uid-{i}", server.host, server.ports["http"],
                                         server.repository / MODEL, server.ports["metrics"], {API_KEY_HEADER: key})
        traffic = SteadyTraffic(servers, spec_models.request_arrays(rm.spec, candidates=8))
        traffic.start()
        executor = Executor(MODEL, pods, fetched_from({v: f"file://{artifacts / v}" for v in ("2", "3")}),
                            PodGates(rm, window_wait_s=0), load_deadline_s=POLICY.load_timeout_s)
        yield {"servers": servers, "pods": pods, "traffic": traffic, "executor": executor}
        traffic.halt.set()
        traffic.join(timeout=15)
        executor.close()
    finally:
        for server in servers:
            server.stop()


def _switch(fleet, version: str, from_version: str, within_s: float = 90.0) -> tuple[Switcher, list[inplace.Switch], float]:
    now = dt.datetime.now(dt.timezone.utc)
    start = inplace.begin(version, from_version, now, SideBySide(fits=True, arithmetic="measured on CPU"))
    switcher = Switcher(fleet["executor"], POLICY, start.record)
    rounds, began = [], time.monotonic()
    while switcher.record.phase not in inplace.TERMINAL and time.monotonic() - began < within_s:
        rounds.append(switcher.round(dt.datetime.now(dt.timezone.utc), fleet["traffic"].p99_ms()))
        time.sleep(0.25)
    fleet["executor"].settle(30)     # the last round's RemoveFiles
    return switcher, rounds, time.monotonic() - began


def _states(fleet) -> dict[str, dict[int, str]]:
    return {p.name: {v: s.state for v, s in (p.versions or {}).items()} for p in fleet["executor"].read()}


def _serving_everywhere(fleet) -> str:
    """The one version READY on every pod (the precondition of a switch)."""
    ready = [{v for v, s in states.items() if s == "READY"} for states in _states(fleet).values()]
    assert all(r == ready[0] and len(r) == 1 for r in ready), ready
    return str(next(iter(ready[0])))


def _failures_since(fleet, mark: int) -> list[str]:
    return fleet["traffic"].failures[mark:]


def test_v2_loaded_in_place_gated_and_promoted_with_no_failed_request(fleet):
    pids = [s.process.pid for s in fleet["servers"]]
    assert _serving_everywhere(fleet) == "1"
    mark, answered_before = len(fleet["traffic"].failures), sum(fleet["traffic"].answered.values())
    switcher, rounds, took = _switch(fleet, "2", "1")
    answered = sum(fleet["traffic"].answered.values()) - answered_before
    print(f"v1 -> v2 in place on {PODS} servers: {took:.1f}s, {len(rounds)} rounds, {answered} requests "
          f"answered meanwhile, traffic P99 {fleet['traffic'].p99_ms():.1f} ms; phases "
          f"{[r.record.phase for r in rounds][::max(1, len(rounds) // 12)]}")
    assert switcher.record.phase == inplace.SWITCHED, (switcher.record, fleet["executor"].errors)
    assert _failures_since(fleet, mark) == [], "a request failed during the switch"
    assert answered > 50, "the traffic kept flowing"
    assert fleet["traffic"].answered["2"] > 0, "v2 answered unversioned traffic"
    assert [s.process.pid for s in fleet["servers"]] == pids and all(s.process.poll() is None for s in fleet["servers"])
    assert {name: states for name, states in _states(fleet).items()} == \
        {name: {1: "UNAVAILABLE", 2: "READY"} for name in fleet["pods"]}
    for pod in fleet["pods"].values():
        assert not pod.version_dir("1").exists() and not pod.version_dir("1").is_symlink()
        assert (pod.version_dir("2") / "model.onnx").is_file()
        # v1 was a link out of the model's directory (the harness's artifact): unlinked, never followed
        assert (pod.model_dir.parent.parent / "artifacts" / "v1" / "model.onnx").is_file()
    verdicts = fleet["executor"].gate_verdicts("2")
    print("\n".join(f"  {g}: {v.outcome}: {v.summary}" for g, v in verdicts.items()))
    assert {g: v.outcome for g, v in verdicts.items()} == {"warmup": "pass", "equivalence": "pass"}, verdicts
    assert len({v.pod_uid for v in verdicts.values()}) == 1, "both gates judged the one gate pod"
    assert fleet["executor"].errors == {}
    # One load at a time: the repository writes were sent pod after pod.
    loads = [k for k in fleet["executor"].sent if k[0] == "repository"]
    assert len(loads) >= 2 * PODS     # each pod: load v2 beside v1, then keep v2 only


def test_v3_with_other_weights_fails_equivalence_and_is_rolled_back_everywhere(fleet):
    serving = _serving_everywhere(fleet)
    mark = len(fleet["traffic"].failures)
    switcher, rounds, took = _switch(fleet, "3", serving)
    print(f"v{serving} -> v3 rolled back in {took:.1f}s: {switcher.record.reason}")
    assert switcher.record.phase == inplace.ROLLED_BACK, (switcher.record, fleet["executor"].errors)
    assert switcher.record.failed_gate == "equivalence"
    assert "equivalence gate fail" in switcher.record.reason
    assert len(switcher.record.touched) == 1, "only the gate pod loaded v3"
    assert _serving_everywhere(fleet) == serving
    assert all(states.get(3) in (None, "UNAVAILABLE") for states in _states(fleet).values())
    for pod in fleet["pods"].values():
        assert not pod.version_dir("3").exists() and not pod.version_dir("3").is_symlink()
        assert not list(pod.model_dir.glob(".3.*")), "the fetcher's hidden copy went too"
    assert _failures_since(fleet, mark) == [], "a request failed while v3 was loaded, gated and unloaded"


def test_a_pod_that_accepts_and_never_answers_is_bounded(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def hold() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=hold, daemon=True).start()
    (tmp_path / MODEL).mkdir()
    (tmp_path / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "onnxruntime"\n')
    (tmp_path / MODEL / "1").mkdir()
    pod = PodTarget("stalled", "uid-s", "127.0.0.1", listener.getsockname()[1], tmp_path / MODEL)
    executor = Executor(MODEL, {"stalled": pod}, stage=lambda p, v: None, gates=no_gates,
                        load_deadline_s=1.5, index_deadline_s=1.0)
    try:
        started = time.monotonic()
        (index,) = executor.read()
        assert time.monotonic() - started < 3
        assert index.versions is None and "no full answer in 1s" in index.unread

        record = inplace.Record(version="1", from_version="1", phase=inplace.LOADING, since="2024-01-01T00:00:00Z")
        load = inplace.Load("stalled", "1", ("1",))
        started = time.monotonic()
        assert executor.submit([load], record) == [("repository", "stalled")]
        assert executor.submit([load], record) == [], "asked again while in flight: not sent twice"
        assert time.monotonic() - started < 0.5, "the loop does not wait for the pod"
        time.sleep(0.5)
        before = len(accepted)
        executor.settle(5)
        assert time.monotonic() - started < 4
        assert executor.in_flight() == []
        assert "no full answer in 1.5s" in executor.errors[("repository", "stalled")]
        assert before == len(accepted) == 2, "one connection for the read, one for the load"
    finally:
        executor.close()
        listener.close()
        for conn in accepted:
            conn.close()
