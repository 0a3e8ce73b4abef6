"""The Triton test image's `tritonserver` shim: the rendered config, loadable on a CPU."""
from __future__ import annotations

from pathlib import Path

from rankops_dev import triton, triton_cpu_shim

CONFIG = '''name: "ranker"
platform: "onnxruntime_onnx"
max_batch_size: 512
instance_group [{ count: 2 kind: KIND_GPU gpus: [0] }]
dynamic_batching { max_queue_delay_microseconds: 1000 }
'''


def test_the_only_edit_is_the_one_the_real_triton_fixture_makes():
    text, edits = triton_cpu_shim.cpu_config(CONFIG)
    assert edits == 1 and "KIND_GPU" not in text
    assert text == CONFIG.replace("KIND_GPU", "KIND_CPU")
    fixture_text, fixture_edits = triton.cpu_config(CONFIG)  # the protobuf edit of the real-Triton fixture
    assert "KIND_CPU" in fixture_text and len(fixture_edits) == 1


def test_the_shadow_repository_links_versions_and_rewrites_only_configs(tmp_path: Path):
    repository, shadow = tmp_path / "models", tmp_path / "shadow"
    (repository / "ranker" / "1").mkdir(parents=True)
    (repository / "ranker" / "1" / "model.onnx").write_bytes(b"onnx")
    (repository / "ranker" / "config.pbtxt").write_text(CONFIG)
    (repository / "ranker" / "config.pbtxt").chmod(0o444)  # a ConfigMap's subPath: read-only
    triton_cpu_shim.shadow(repository, shadow)
    assert (shadow / "ranker" / "1").is_symlink() and (shadow / "ranker" / "1" / "model.onnx").read_bytes() == b"onnx"
    assert "KIND_CPU" in (shadow / "ranker" / "config.pbtxt").read_text()
    assert (repository / "ranker" / "config.pbtxt").read_text() == CONFIG   # the source is untouched
    # A restarted container finds its /tmp as it left it: the shadow is made again, not refused.
    (repository / "ranker" / "2").mkdir()
    triton_cpu_shim.shadow(repository, shadow)
    assert (shadow / "ranker" / "2").is_symlink()


def test_the_mirror_follows_versions_a_stager_adds_and_removes(tmp_path: Path):
    repository, shadow = tmp_path / "models", tmp_path / "shadow"
    (repository / "ranker" / "1").mkdir(parents=True)
    (repository / "ranker" / "config.pbtxt").write_text(CONFIG)
    triton_cpu_shim.shadow(repository, shadow)
    # the stager's way: a hidden complete copy, then the version's link to it
    (repository / "ranker" / ".2.v-abc").mkdir()
    (repository / "ranker" / "2").symlink_to(".2.v-abc")
    triton_cpu_shim.shadow(repository, shadow, quiet=True)
    assert (shadow / "ranker" / "2").is_dir() and (shadow / "ranker" / "2").is_symlink()
    (repository / "ranker" / "1").rmdir()
    triton_cpu_shim.shadow(repository, shadow, quiet=True)
    assert sorted(p.name for p in (shadow / "ranker").iterdir()) == [".2.v-abc", "2", "config.pbtxt"]
    # a running server's config stays what it started with
    (shadow / "ranker" / "config.pbtxt").write_text("as loaded")
    triton_cpu_shim.shadow(repository, shadow, quiet=True)
    assert (shadow / "ranker" / "config.pbtxt").read_text() == "as loaded"


def test_the_server_is_started_on_the_shadow_with_every_other_argument_as_given(tmp_path, monkeypatch):
    (tmp_path / "models" / "m").mkdir(parents=True)
    monkeypatch.setattr(triton_cpu_shim, "SHADOW", tmp_path / "shadow")
    calls = []
    monkeypatch.setattr(triton_cpu_shim.os, "execv", lambda path, argv: calls.append((path, argv)))
    monkeypatch.setattr(triton_cpu_shim.os, "fork", lambda: calls.append("forked the mirror") or 4242)
    triton_cpu_shim.main([f"--model-repository={tmp_path / 'models'}", "--model-control-mode=explicit",
                          "--load-model=m", "--http-port=8000"])
    assert calls == ["forked the mirror", (triton_cpu_shim.REAL, [triton_cpu_shim.REAL, f"--model-repository={tmp_path / 'shadow'}",
                                             "--model-control-mode=explicit", "--load-model=m", "--http-port=8000"])]


def test_a_shared_server_s_loads_reach_triton_on_the_cpu_and_nothing_else_changes():
    """Only a shared server (no model named at start) is relayed; a load's override says KIND_CPU on
    the way, every other request (a keep-alive connection, a body) passes byte for byte."""
    import http.server
    import json
    import threading

    from rankops.render.serving import API_KEY_HEADER
    from rankops.triton.repository import Repository, config_json
    from rankops_dev.ports import free_port

    assert triton_cpu_shim.is_shared_server(["--model-control-mode=explicit", "--http-port=8000"])
    assert not triton_cpu_shim.is_shared_server(["--model-control-mode=explicit", "--load-model=ranker"])
    seen: list[tuple[str, dict, bytes]] = []

    class Upstream(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, dict(self.headers), body))
            answer = b'{"models": []}' if self.path.endswith("/index") else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    threading.Thread(target=triton_cpu_shim.serve_loads_on_cpu, args=(port, upstream.server_address[1], "127.0.0.1"),
                     daemon=True).start()
    repo = Repository("127.0.0.1", port, {API_KEY_HEADER: "k"})
    for _ in range(50):
        try:
            repo.index()
            break
        except Exception:  # noqa: BLE001 - not listening yet
            threading.Event().wait(0.1)
    repo.load("ranker", config_json(CONFIG))
    upstream.shutdown()
    path, headers, body = seen[-1]
    override = json.loads(json.loads(body)["parameters"]["config"])
    assert path == "/v2/repository/models/ranker/load" and headers[API_KEY_HEADER] == "k"
    assert [g["kind"] for g in override["instance_group"]] == ["KIND_CPU"]
    assert int(headers["Content-Length"]) == len(body)
    assert seen[0][0] == "/v2/repository/index" and json.loads(seen[0][2]) == {"ready": False}
