"""Issue 41: the repository API client on a real tritonserver started with the rendered Deployment's
own arguments (explicit model control, the restricted-API key): v2 loaded beside v1 by a config
override whose version policy lists both, both answer, the unversioned request goes to the highest;
v1 dropped the same way, v2 still answers; the index says each state."""
from __future__ import annotations

import time

import numpy as np
import pytest

from rankops.api.rankingmodel import ModelFormat
from rankops_dev import spec_models
from rankops.render import names
from rankops.render.serving import API_KEY_HEADER, API_KEY_SECRET_KEY
from rankops.triton.client import Endpoint, InferenceFailed, ModelNotReady
from rankops.triton.repository import Repository, RepositoryError, config_json, with_versions
from rankops.triton.samples import Sample
from test_conformance import _doc
from triton_serving import serve


def _scores(server, model: str, version: str, inputs) -> np.ndarray:
    connection = Endpoint(server.http_url, model, version).connect()
    try:
        out = connection.infer(connection.build_request(Sample(line=1, inputs=inputs), connection.model_info()))
        return next(iter(out.values()))
    finally:
        connection.close()


def _settled(repo: Repository, model: str, within_s: float = 30.0):
    deadline = time.monotonic() + within_s
    while True:
        index = repo.versions(model)
        if all(e.state != "UNLOADING" for e in index.values()) or time.monotonic() > deadline:
            return index
        time.sleep(0.2)


def test_two_versions_load_side_by_side_then_the_old_one_is_dropped(triton_install, tmp_path):
    with serve(triton_install, _doc(), tmp_path) as (rm, server):
        model = rm.metadata["name"]
        key = server.secrets[names.api_key_secret_name(model)][API_KEY_SECRET_KEY]
        host, port = server.http_url.rsplit(":", 1)
        repo = Repository(host, int(port), {API_KEY_HEADER: key})
        inputs = spec_models.request_arrays(rm.spec, candidates=5)
        assert {v: e.state for v, e in repo.versions(model).items()} == {1: "READY"}

        # v2, other weights, fetched into the model's directory beside v1 (what the fetcher will do)
        spec_models.export(rm.spec, ModelFormat.onnx, server.repository / model / "2", seed=7)
        config = config_json((server.repository / model / "config.pbtxt").read_text())
        started = time.monotonic()
        repo.load(model, with_versions(config, [1, 2]))
        print(f"load of v2 beside v1 answered in {(time.monotonic() - started) * 1000:.0f} ms")
        assert {v: e.state for v, e in repo.versions(model).items()} == {1: "READY", 2: "READY"}
        v1, v2 = _scores(server, model, "1", inputs), _scores(server, model, "2", inputs)
        assert not np.allclose(v1, v2)
        # a request naming no version is answered by the highest READY one (rollout/inplace.py relies on it)
        assert np.allclose(_scores(server, model, "", inputs), v2)

        started = time.monotonic()
        repo.load(model, with_versions(config, [2]))
        # the load answers with v2 kept; v1 is UNLOADING until its requests are done
        index = _settled(repo, model)
        print(f"v1 dropped (v2 kept) in {(time.monotonic() - started) * 1000:.0f} ms")
        assert (index[1].state, index[1].reason, index[2].state) == ("UNAVAILABLE", "unloaded", "READY")
        assert np.allclose(_scores(server, model, "2", inputs), v2)
        with pytest.raises((InferenceFailed, ModelNotReady)):
            _scores(server, model, "1", inputs)

        # without the key, the restricted API refuses, and says so
        with pytest.raises(RepositoryError, match="load of ranker refused"):
            Repository(host, int(port)).load(model, with_versions(config, [1]))
        # a load Triton cannot do comes back with Triton's error; v2 keeps serving
        with pytest.raises(RepositoryError, match="load of ranker refused: .*no_such_backend"):
            repo.load(model, dict(with_versions(config, [2]), platform="", backend="no_such_backend"))
        assert repo.versions(model)[2].state == "READY"
        assert np.allclose(_scores(server, model, "2", inputs), v2)

        repo.unload(model)
        assert all(e.state == "UNAVAILABLE" for e in _settled(repo, model).values())
