"""Issue 42 on one real tritonserver: several RankingModels in one shared server.

The server runs with render/shared_server.server_arguments (explicit model control, no model at
start, the repository API behind the key) and each member is loaded through the repository API with
its own rendered config.pbtxt as the override (render/shared_server.member_config; only the CPU edits
of the Triton fixture applied), as the operator would. What is checked, by the server:
- three members of different input shapes (coarse, fine, re-rank stand-ins) answer each with its
  own output shapes, and a request shaped for one is refused by another;
- a fourth is added and removed while the pod keeps its process (same pid), the others answering
  between the steps; serverplan.pod_actions asks for exactly those loads and unloads, then nothing;
- each member's requests reach only it (Triton's per-model inference counts);
- a member whose artifact is corrupt, and one whose artifact never came, are Failed with Triton's
  own reason while the three keep serving.
"""
from __future__ import annotations

import copy
import json
import secrets
import time
import urllib.request

import pytest

from rankops import serverplan
from rankops.api.rankingmodel import RankingModel
from rankops.api.sharedserver import SharedServerSpec
from rankops.render.desired import resolve_shape
from rankops.render.serving import API_KEY_ENV, API_KEY_HEADER
from rankops.render.shared_server import member_config, server_arguments
from rankops.triton.repository import Repository, RepositoryError, config_json
from rankops_dev import spec_models, triton
from test_conformance import BASE
from triton_serving import expected_output_shapes

NAMESPACE = "reco"
SHAPES = {   # member -> (user_features dims, item_features dims, maxBatchSize)
    "coarse": ([8], [4], 512),
    "fine": ([16], [8], 256),
    "rerank": ([32], [24], 64),
    "extra": ([12], [6], 128),
}


def member(name: str, model_uri: str | None = None, **spec) -> RankingModel:
    """A member stand-in of its SHAPES; `spec`: fields set over it."""
    user, item, max_batch = SHAPES[name]
    doc = copy.deepcopy(BASE)
    doc["metadata"]["name"] = name
    doc["spec"]["versions"] = [{"name": "1", "modelUri": model_uri or f"s3://models/{name}/1", "format": "onnx"}]
    doc["spec"]["inputs"] = [{"name": "user_features", "dataType": "FP32", "dims": user},
                             {"name": "item_features", "dataType": "FP32", "dims": item}]
    doc["spec"]["batching"] = {"maxBatchSize": max_batch, "preferredBatchSizes": [max_batch // 2, max_batch],
                               "maxQueueDelayMicroseconds": 500}
    doc["spec"]["modelWarmup"] = {"batchSizes": [1, max_batch]}
    doc["spec"].update(spec)
    return RankingModel.model_validate(doc)


def loaded_config(rm: RankingModel) -> tuple[int, dict]:
    version, text = member_config(rm.metadata["name"], NAMESPACE, rm.spec, "1", resolve_shape(rm.spec).shape)
    return version, config_json(triton.cpu_config(text)[0])


@pytest.fixture(scope="module")
def shared(triton_install, tmp_path_factory):
    work = tmp_path_factory.mktemp("shared")
    repository = work / "models"
    models = {name: member(name) for name in SHAPES}
    for name, rm in models.items():
        spec_models.export(rm.spec, rm.spec.versions[0].format, repository / name / "1")
    key = secrets.token_hex(16)
    server = triton.TritonServer(install=triton_install, container_args=server_arguments(
        SharedServerSpec(gpuMemoryMiB=15360)), repository=repository, log_path=work / "tritonserver.log",
        env={API_KEY_ENV: key})
    with server:
        yield {"server": server, "models": models, "work": work,
               "repo": Repository(server.host, server.ports["http"], headers={API_KEY_HEADER: key})}


def answers(shared, name: str) -> bool:
    rm = shared["models"][name]
    inputs = spec_models.request_arrays(rm.spec, candidates=5)
    outputs = shared["server"].infer(name, inputs)
    assert {k: list(v.shape) for k, v in outputs.items()} == expected_output_shapes(rm, inputs, 5)
    return True


def load(shared, name: str) -> None:
    _, config = loaded_config(shared["models"][name])
    shared["repo"].load(name, config, deadline_s=120)


def inference_count(shared, name: str) -> int:
    with urllib.request.urlopen(f"http://{shared['server'].http_url}/v2/models/{name}/stats", timeout=5) as resp:
        stats = json.load(resp)["model_stats"]
    return sum(int(s["inference_count"]) for s in stats)


def wanted(*names: str) -> dict[str, int]:
    return {n: 1 for n in names}


THREE = ("coarse", "fine", "rerank")


def test_three_members_load_into_one_server_and_each_answers_with_its_own_shapes(shared):
    repo = shared["repo"]
    assert serverplan.pod_actions(wanted(*THREE), repo.index()).load == THREE   # nothing at start
    for name in THREE:
        load(shared, name)
    assert serverplan.pod_actions(wanted(*THREE), repo.index()).nothing
    for name in THREE:
        assert answers(shared, name)
        assert serverplan.member_state(name, 1, repo.index()).state == serverplan.SERVING
    # a request shaped for `fine` is refused by `coarse`: each member keeps its own interface
    fine_inputs = spec_models.request_arrays(shared["models"]["fine"].spec, candidates=5)
    with pytest.raises(Exception, match="(?i)shape|dims|unexpected"):
        shared["server"].infer("coarse", fine_inputs)


def test_each_members_requests_reach_only_it(shared):
    before = {name: inference_count(shared, name) for name in THREE}
    for _ in range(3):
        answers(shared, "fine")
    after = {name: inference_count(shared, name) for name in THREE}
    assert after["fine"] - before["fine"] == 3 * 5          # 5 candidates a request, one inference each
    assert after["coarse"] == before["coarse"] and after["rerank"] == before["rerank"]


def test_a_fourth_is_added_and_removed_without_restarting_the_server(shared):
    server, repo = shared["server"], shared["repo"]
    pid = server.process.pid
    actions = serverplan.pod_actions(wanted(*THREE, "extra"), repo.index())
    assert actions.load == ("extra",) and not actions.unload
    load(shared, "extra")
    assert answers(shared, "extra") and all(answers(shared, n) for n in THREE)
    actions = serverplan.pod_actions(wanted(*THREE), repo.index())
    assert actions.unload == ("extra",) and not actions.load
    repo.unload("extra")
    assert serverplan.pod_actions(wanted(*THREE), repo.index()).nothing
    # Triton answers the unload before it is done: UNLOADING (a transition, nothing asked), then gone
    deadline = time.monotonic() + 30
    while serverplan.member_state("extra", 1, repo.index()).state != serverplan.ABSENT:
        assert serverplan.member_state("extra", 1, repo.index()).state == serverplan.LOADING
        assert time.monotonic() < deadline, repo.index()
        time.sleep(0.1)
    with pytest.raises(Exception):
        answers(shared, "extra")
    assert all(answers(shared, n) for n in THREE)
    assert server.process.poll() is None and server.process.pid == pid


def test_a_member_whose_artifact_is_corrupt_or_missing_fails_alone(shared):
    repo, repository = shared["repo"], shared["server"].repository
    corrupt = repository / "extra" / "1" / "model.onnx"
    corrupt.write_bytes(b"not an onnx model")
    with pytest.raises(RepositoryError) as refused:
        load(shared, "extra")
    state = serverplan.member_state("extra", 1, repo.index())
    assert state.state == serverplan.FAILED and state.reason, repo.index()
    assert "extra" in str(refused.value)
    # a failed member is not loaded again every round, unless asked
    assert serverplan.pod_actions(wanted(*THREE, "extra"), repo.index()).nothing
    assert serverplan.pod_actions(wanted(*THREE, "extra"), repo.index(), retry_failed=True).load == ("extra",)

    # a config Triton rejects is refused with the words of a missing directory ("failed to poll"): with
    # the member's directory listed in the index it is Failed, not waited for
    _, bad = loaded_config(member("extra"))
    bad["max_batch_size"] = -3
    with pytest.raises(RepositoryError) as refused:
        repo.load("extra", bad, deadline_s=60)
    error = str(refused.value)
    index = repo.index()
    assert any(e.name == "extra" for e in index) and not serverplan.not_staged(error, "extra", index), (error, index)
    assert serverplan.member_state("extra", 1, index, load_error=error).state == serverplan.FAILED

    # the artifact never came: no version directory, so Triton lists no version and only refuses the load
    (repository / "missing").mkdir()
    rm = member("extra")
    _, config = loaded_config(rm)
    config["name"] = "missing"
    with pytest.raises(RepositoryError) as refused:
        repo.load("missing", config, deadline_s=60)
    error = str(refused.value)
    assert serverplan.member_state("missing", 1, repo.index()).state == serverplan.ABSENT
    # the stager may still be fetching it: a wait (loaded again each round), until the shell's wait is over
    assert serverplan.member_state("missing", 1, repo.index(), load_error=error).state == serverplan.STAGING
    state = serverplan.member_state("missing", 1, repo.index(), load_error=error, staging_over=True)
    assert state.state == serverplan.FAILED and "missing" in state.reason
    assert all(answers(shared, n) for n in THREE)
    # the server stays ready with two members failed (not strict readiness): the pods keep serving the three
    with urllib.request.urlopen(f"http://{shared['server'].http_url}/v2/health/ready", timeout=5) as resp:
        assert resp.status == 200


# --- the per-model doors: `rankops route` in front of the shared server ---------------------------

import asyncio  # noqa: E402
import http.client  # noqa: E402
import threading  # noqa: E402

from rankops.triton import route  # noqa: E402
from rankops.triton.client import Endpoint  # noqa: E402
from rankops_dev.ports import free_port  # noqa: E402


@pytest.fixture(scope="module")
def doors(shared):
    """The router over the shared server, its routes from a file it reads every 0.2 s."""
    routes_file = shared["work"] / "routes.json"
    ports = {name: free_port() for name in THREE}
    routes_file.write_text(json.dumps({str(ports["coarse"]): "coarse"}))
    loop, stop = asyncio.new_event_loop(), None
    started = threading.Event()

    def serve():
        nonlocal stop
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        started.set()
        loop.run_until_complete(route.run((shared["server"].host, shared["server"].ports["http"]), routes_file, {},
                                          host="127.0.0.1", reload_s=0.2, stop=stop))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    _wait_listening(ports["coarse"])
    yield {"file": routes_file, "ports": ports}
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def _wait_listening(port: int, up: bool = True, timeout_s: float = 10.0) -> None:
    import socket
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            if up:
                return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise AssertionError(f"port {port} {'never opened' if up else 'never closed'}")


def _ask(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def _infer_through(port: int, rm: RankingModel, name: str) -> dict:
    connection = Endpoint(f"127.0.0.1:{port}", name).connect()
    try:
        from rankops.triton.samples import Sample
        inputs = spec_models.request_arrays(rm.spec, candidates=5)
        return connection.infer(connection.build_request(Sample(line=1, inputs=inputs), connection.model_info()))
    finally:
        connection.close()


def test_a_members_port_passes_only_its_own_requests(shared, doors):
    port, key = doors["ports"]["coarse"], shared["repo"].headers
    outputs = _infer_through(port, shared["models"]["coarse"], "coarse")
    assert list(outputs["scores"].shape) == [5, 1]
    for _ in range(20):     # one kept-alive connection, many requests
        assert _ask(port, "GET", "/v2/models/coarse/ready")[0] == 200
    assert _ask(port, "GET", "/v2/health/ready")[0] == 200
    # another member, the repository API (even with the key), and encoded or dotted names stay out
    refused = ["/v2/models/fine/ready", "/v2/models/fine/config", "/v2/models/coarse/../fine/ready",
               "/v2/models/coars%65/ready", "/v2/models//fine", "/v2/systemsharedmemory/status", "/v2/trace/setting"]
    for path in refused:
        assert _ask(port, "GET", path)[0] == 404, path
    assert _ask(port, "POST", "/v2/repository/index", b"{}", key)[0] == 404
    assert _ask(port, "POST", "/v2/repository/models/fine/unload", b"{}", key)[0] == 404
    with pytest.raises(Exception):
        _infer_through(port, shared["models"]["fine"], "fine")
    assert answers(shared, "fine")          # untouched, on the server itself


def test_ports_open_and_close_with_the_routes_file_without_a_restart(shared, doors):
    pid, ports = shared["server"].process.pid, doors["ports"]
    doors["file"].write_text(json.dumps({str(ports[n]): n for n in THREE}))
    for name in ("fine", "rerank"):
        _wait_listening(ports[name])
        assert _infer_through(ports[name], shared["models"][name], name)
    doors["file"].write_text("{not json")               # a bad file keeps the ports as they were
    time.sleep(0.6)
    assert _ask(ports["fine"], "GET", "/v2/models/fine/ready")[0] == 200
    doors["file"].write_text(json.dumps({str(ports["coarse"]): "coarse"}))
    _wait_listening(ports["fine"], up=False)
    _wait_listening(ports["rerank"], up=False)
    assert _ask(ports["coarse"], "GET", "/v2/models/coarse/ready")[0] == 200
    assert shared["server"].process.pid == pid
