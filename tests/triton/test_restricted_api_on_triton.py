"""Issue 37: Triton's model-control API answers only rankops' key, on a real tritonserver started
with the rendered Deployment's own arguments (the key's $(VAR) expanded from the container's
environment, as the kubelet does)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from rankops.render import names
from rankops.render.serving import API_KEY_HEADER, API_KEY_SECRET_KEY
from rankops_dev import spec_models
from test_conformance import _doc
from triton_serving import serve


def _post(url: str, body: dict | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _ready(server, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=10) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False


def test_a_plain_pods_unload_is_refused_and_rankops_key_is_accepted(triton_install, tmp_path):
    with serve(triton_install, _doc(), tmp_path) as (rm, server):
        model = rm.metadata["name"]
        base = f"http://{server.http_url}/v2"
        key = server.secrets[names.api_key_secret_name(model)][API_KEY_SECRET_KEY]
        inputs = spec_models.request_arrays(rm.spec, candidates=5)

        # Any pod that reaches the port: no header, a wrong key. Refused, and the model still answers.
        for headers in ({}, {API_KEY_HEADER: "not-the-key"}):
            status, text = _post(f"{base}/repository/models/{model}/unload", headers=headers)
            assert status >= 400, f"unload with {headers or 'no header'} was accepted: {status} {text}"
            assert _ready(server, model)
            assert server.infer(model, inputs)
        # Loading a model with a config override, changing where Triton logs: refused alike.
        status, _ = _post(f"{base}/repository/models/{model}/load", {"parameters": {"config": "{}"}})
        assert status >= 400
        status, _ = _post(f"{base}/logging", {"log_file": str(tmp_path / "stolen.log")})
        assert status >= 400
        assert not (tmp_path / "stolen.log").exists()
        # Health, metadata and inference stay open.
        with urllib.request.urlopen(f"{base}/models/{model}", timeout=10) as resp:
            assert resp.status == 200

        # rankops' own components (the in-place version work) hold the key: accepted.
        status, text = _post(f"{base}/repository/models/{model}/unload", headers={API_KEY_HEADER: key})
        assert status == 200, text
        assert not _ready(server, model)
