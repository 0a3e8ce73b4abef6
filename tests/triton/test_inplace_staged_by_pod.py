"""Issue 41 in a cluster's shape, on one real tritonserver: the Executor in cluster mode (no view of
the pod's files; the override's base is the config the server has the model loaded with, read from
it), the pod's files its stager's.

Measured on tritonserver 2.51 (explicit model control, v1 READY, no directory 2): a load whose
config override lists versions [1, 2] answers 200 with an empty body, loads nothing, and the
index lists v1 READY and no entry for 2 (the server only logs "version 2 is specified for model
'ranker', but the version directory is not present"); v1 keeps answering. Once the directory is
there, the same load loads v2 (READY, and it answers unversioned requests). A load listing no
version present is refused: 400, "load failed for model 'ranker': at least one version must be
available under the version policy of model 'ranker'", the loaded versions untouched.

The test plays the operator (versions.json listing 1 and 2) and the stager (one `stage_round`
with the strict fetcher from file://), after the first load was sent.
"""
from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from rankops.api.rankingmodel import ModelFormat
from rankops.controller.inplace_pods import Executor, PodTarget, Switcher
from rankops.fetcher import stager
from rankops.fetcher.fetch import Limits
from rankops.gates.verdict import error_verdict
from rankops.planner.two_versions import SideBySide
from rankops.render import names
from rankops.render.serving import API_KEY_HEADER, API_KEY_SECRET_KEY
from rankops.rollout import inplace
from rankops_dev import spec_models, triton
from test_conformance import _doc

MODEL = "ranker"
DOC = _doc(versions=[{"name": v, "modelUri": f"s3://models/ranker/{v}", "format": "onnx"} for v in ("1", "2")])
POLICY = inplace.Policy(replicas=1, failure_tolerance=0, max_stable_p99_ms=10_000, load_timeout_s=120)


@pytest.fixture(scope="module")
def pod(triton_install, tmp_path_factory):
    """One server serving v1; the operator's view of it: HTTP, no files."""
    work = tmp_path_factory.mktemp("pod")
    rm, server = triton.server_for_model(DOC, work, "1", install=triton_install)
    spec_models.export(rm.spec, ModelFormat.onnx, work / "store" / "2", fp16_weights=True)
    with server:
        key = server.secrets[names.api_key_secret_name(MODEL)][API_KEY_SECRET_KEY]
        target = PodTarget("pod-0", "uid-0", server.host, server.ports["http"], metrics_port=server.ports["metrics"],
                           headers={API_KEY_HEADER: key})
        executor = Executor(MODEL, {"pod-0": target}, stage=None,
                            gates=lambda p, gate, v, s, reference=None: error_verdict(gate, "NotRun", "not this test's"),
                            load_deadline_s=POLICY.load_timeout_s)
        try:
            yield {"rm": rm, "server": server, "executor": executor, "model_dir": server.repository / MODEL,
                   "work": work, "versions_file": work / "versions.json"}
        finally:
            executor.close()


def _states(executor) -> dict[int, str]:
    (index,) = executor.read()
    return {v: s.state for v, s in (index.versions or {}).items()}


def _answered_by(pod) -> str:
    from tritonclient.http import InferenceServerClient

    from rankops.triton.client import Endpoint
    from rankops.triton.samples import Sample

    connection = Endpoint(pod["server"].http_url, MODEL, timeout_s=10).connect()
    try:
        inputs = spec_models.request_arrays(pod["rm"].spec, candidates=4)
        headers, body = connection.send(connection.build_request(Sample(line=1, inputs=inputs),
                                                                 connection.model_info()))
        length = headers.get("inference-header-content-length")
        result = InferenceServerClient.parse_response_body(body, header_length=int(length) if length else None)
        return result.get_response()["model_version"]
    finally:
        connection.close()


def _round(switcher: Switcher) -> inplace.Switch:
    switch = switcher.round(dt.datetime.now(dt.timezone.utc), stable_p99_ms=5.0)
    switcher.executor.settle(30)
    return switch


def test_cluster_mode_touches_no_file_and_a_load_of_nothing_staged_is_waiting(pod):
    executor, record = pod["executor"], inplace.Record("2", "1", inplace.LOADING, "2026-12-05T08:00:00Z")
    # The override's base: the config the server has the model loaded with (the CPU stand-in's KIND_CPU
    # here, the rendered KIND_GPU on a GPU node), its version policy the one it started with.
    loaded = executor.pods["pod-0"].repository().model_config(MODEL)
    assert loaded["name"] == MODEL and {g["kind"] for g in loaded["instance_group"]} == {"KIND_CPU"}
    assert loaded["version_policy"] == {"specific": {"versions": ["1"]}} or "version_policy" in loaded
    assert executor.submit([inplace.RemoveFiles("pod-0", "1")], record) == []
    assert (pod["model_dir"] / "1").exists()
    executor.submit([inplace.Load("pod-0", "2", ("2",))], record)       # no listed version on the volume
    executor.settle(30)
    assert executor.errors == {}
    assert "none of [2] on pod-0's volume yet" in executor.waiting["pod-0"]
    assert "at least one version must be available under the version policy" in executor.waiting["pod-0"]
    assert _states(executor) == {1: "READY"} and _answered_by(pod) == "1"


def test_a_version_loaded_before_the_stager_fetched_it_is_waited_for_then_loaded(pod):
    executor = pod["executor"]
    assert not (pod["model_dir"] / "2").exists()
    started = inplace.begin("2", "1", dt.datetime.now(dt.timezone.utc), SideBySide(True, "measured on CPU"))
    switcher = Switcher(executor, POLICY, started.record)
    loads = lambda: sum(k == ("repository", "pod-0") for k in executor.sent)  # noqa: E731
    before = loads()

    first = _round(switcher)
    assert first.actions == (inplace.Load("pod-0", "2", ("1", "2")),)
    assert executor.errors == {} and "pod-0" not in executor.waiting, "Triton took it: 200, nothing loaded"
    assert _states(executor) == {1: "READY"}, "no entry for a version whose directory is missing"
    assert _answered_by(pod) == "1"

    again = _round(switcher)
    assert again.record.phase == inplace.LOADING, again.record
    assert "not in its index yet: waiting for its files on pod-0's volume" in again.record.message
    assert loads() == before + 2, "asked again, sent again"

    # The operator lists 2 in versions.json; the pod's stager fetches it (one round).
    wanted = [stager.Wanted(v, int(v), (pod["work"] / where).as_uri()) for v, where in (("1", "artifacts/v1"),
                                                                                       ("2", "store/2"))]
    pod["versions_file"].write_text(json.dumps(stager.versions_document(MODEL, wanted)))
    staged = stager.stage_round(MODEL, pod["model_dir"], pod["versions_file"],
                                stager.fetched_with(Limits(deadline_s=30)), stager.remove_version_dir)
    assert staged.ok and staged.lines[0].startswith("version 2: fetched"), staged.lines

    began = time.monotonic()
    loaded = _round(switcher)
    assert loaded.actions == (inplace.Load("pod-0", "2", ("1", "2")),)
    assert _states(executor) == {1: "READY", 2: "READY"}
    gating = _round(switcher)
    assert gating.record.phase == inplace.GATING, gating.record
    assert executor.errors == {} and executor.waiting == {}
    assert _answered_by(pod) == "2", "v2 READY and numbered above v1 takes unversioned requests"
    assert time.monotonic() - began < 30
