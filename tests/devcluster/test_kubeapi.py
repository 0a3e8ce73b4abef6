"""The harness's own API client (dev/rankops_dev/kubeapi.py), against a small HTTP server: what the
pod runner relies on (JSON in and out, None for 404, ApiException for a refusal, the content type it
names, a watch read as it comes)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes.client.exceptions import ApiException

from rankops_dev.kubeapi import Api


class Handler(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str, bytes]] = []

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append((self.command, self.path, self.headers.get("Content-Type", ""), self.rfile.read(length)))
        if self.path.startswith("/api/v1/nodes/gone"):
            self._answer(404, b'{"kind":"Status","code":404}')
        elif self.command == "POST":
            self._answer(409, b'{"kind":"Status","code":409,"reason":"AlreadyExists"}')
        elif "watch=true" in self.path:
            self._answer(200, b'{"type":"ADDED","object":{}}\n{"type":"DELETED","object":{}}\n')
        else:
            self._answer(200, json.dumps({"path": self.path}).encode())

    do_GET = do_POST = do_PATCH = do_DELETE = _any

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def api(tmp_path):
    Handler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "t", "user": {"token": "x"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    yield Api(str(kubeconfig))
    server.shutdown()


def test_calls_answer_json_none_for_404_and_raise_for_a_refusal(api):
    assert api.call("GET", "/api/v1/nodes/n1", query=[("a", "b")]) == {"path": "/api/v1/nodes/n1?a=b"}
    assert api.call("GET", "/api/v1/nodes/gone") is None
    with pytest.raises(ApiException) as refused:
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    assert refused.value.status == 409
    api.call("PATCH", "/api/v1/nodes/n1", {"spec": {}}, content_type="application/merge-patch+json")
    method, path, content_type, body = Handler.seen[-1]
    assert (method, content_type, json.loads(body)) == ("PATCH", "application/merge-patch+json", {"spec": {}})


def test_a_watch_is_read_as_it_comes(api):
    response = api.stream("/api/v1/pods", [("watch", "true")])
    lines = b"".join(response.stream(65536, decode_content=True)).splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["ADDED", "DELETED"]
