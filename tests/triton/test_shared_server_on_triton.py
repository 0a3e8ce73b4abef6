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
import urllib.request

import pytest

from rankops import serverplan
from rankops.api.rankingmodel import RankingModel
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


def member(name: str) -> RankingModel:
    user, item, max_batch = SHAPES[name]
    doc = copy.deepcopy(BASE)
    doc["metadata"]["name"] = name
    doc["spec"]["versions"] = [{"name": "1", "modelUri": f"s3://models/{name}/1", "format": "onnx"}]
    doc["spec"]["inputs"] = [{"name": "user_features", "dataType": "FP32", "dims": user},
                             {"name": "item_features", "dataType": "FP32", "dims": item}]
    doc["spec"]["batching"] = {"maxBatchSize": max_batch, "preferredBatchSizes": [max_batch // 2, max_batch],
                               "maxQueueDelayMicroseconds": 500}
    doc["spec"]["modelWarmup"] = {"batchSizes": [1, max_batch]}
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
        [rm.spec for rm in models.values()]), repository=repository, log_path=work / "tritonserver.log",
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
    assert serverplan.member_state("extra", 1, repo.index()).state == serverplan.ABSENT
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

    # the artifact never came: no version directory, so Triton lists no version and only refuses the load
    (repository / "missing").mkdir()
    rm = member("extra")
    _, config = loaded_config(rm)
    config["name"] = "missing"
    with pytest.raises(RepositoryError) as refused:
        repo.load("missing", config, deadline_s=60)
    error = str(refused.value)
    assert serverplan.member_state("missing", 1, repo.index()).state == serverplan.ABSENT
    state = serverplan.member_state("missing", 1, repo.index(), load_error=error)
    assert state.state == serverplan.FAILED and "missing" in state.reason
    assert all(answers(shared, n) for n in THREE)
