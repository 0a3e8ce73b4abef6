"""`rankops fetch-model` against real servers: moto's S3 server as a process (credentials enforced)
and a local HTTP server that can send fewer bytes than it announces or stall mid-body."""
from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path, PurePosixPath

import pytest

from rankops.commands.fetch import FetchError, client_settings, fetch, object_plan
from rankops.devcluster.objectstore import ObjectStore

RANKOPS = str(Path(sys.executable).with_name("rankops"))
MODEL = {"model.onnx": os.urandom(300_000), "tokenizer/vocab.txt": b"a\nb\n", "metadata.json": b"{}"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ObjectStore:
    source = tmp_path_factory.mktemp("model-src")
    for rel, data in MODEL.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_bytes(data)
    with ObjectStore(tmp_path_factory.mktemp("objectstore")) as running:
        running.upload_tree("models", "ctr-ranker/3", source)
        # Shares the prefix "ctr-ranker/3" as a string but is another directory: must not be fetched.
        running.put_object("models", "ctr-ranker/30/model.onnx", b"other version")
        yield running


@pytest.fixture
def s3_env(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in store.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return {**os.environ}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def siblings(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir()) if dest.parent.exists() else []


def test_prefix_lands_complete_and_rerun_replaces_it(s3_env: dict, tmp_path: Path) -> None:
    dest = tmp_path / "models" / "ctr-ranker" / "1"
    fetch("s3://models/ctr-ranker/3", dest, "model.onnx")
    assert tree(dest) == MODEL
    assert siblings(dest) == ["1"]
    (dest / "stale.bin").write_bytes(b"from an older fetch")
    fetch("s3://models/ctr-ranker/3/", dest, "model.onnx")
    assert tree(dest) == MODEL
    assert siblings(dest) == ["1"]


def test_single_object_to_a_file_dest(s3_env: dict, tmp_path: Path) -> None:
    dest = tmp_path / "reference" / "model.pt"
    fetch("s3://models/ctr-ranker/3/model.onnx", dest)
    assert dest.read_bytes() == MODEL["model.onnx"]
    assert siblings(dest) == ["model.pt"]


@pytest.mark.parametrize("uri, words", [
    ("s3://models/ctr-ranker/9", ["s3://models/ctr-ranker/9", "no object at this key or under this prefix"]),
    ("s3://models/ctr-ranker/3/model.plan", ["no object"]),
    ("s3://no-such-bucket/ctr-ranker/3", ["s3://no-such-bucket/ctr-ranker/3", "bucket does not exist"]),
])
def test_missing_object_or_bucket(s3_env: dict, tmp_path: Path, uri: str, words: list[str]) -> None:
    dest = tmp_path / "m" / "1"
    with pytest.raises(FetchError) as err:
        fetch(uri, dest, "model.onnx")
    for word in words:
        assert word in str(err.value)
    assert siblings(dest) == []


@pytest.mark.parametrize("variable, code", [("AWS_ACCESS_KEY_ID", "InvalidAccessKeyId"),
                                            ("AWS_SECRET_ACCESS_KEY", "SignatureDoesNotMatch")])
def test_bad_credentials_are_refused_by_the_server(s3_env: dict, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path, variable: str, code: str) -> None:
    monkeypatch.setenv(variable, "AKIAWRONGWRONGWRONG0" if variable == "AWS_ACCESS_KEY_ID" else "wrong-secret")
    dest = tmp_path / "m" / "1"
    with pytest.raises(FetchError) as err:
        fetch("s3://models/ctr-ranker/3", dest, "model.onnx")
    message = str(err.value)
    assert code in message and variable in message and "modelCredentialsSecret" in message
    assert "s3://models/ctr-ranker/3" in message and "\n" not in message
    assert siblings(dest) == []


def test_expect_missing_leaves_nothing(s3_env: dict, tmp_path: Path) -> None:
    dest = tmp_path / "m" / "1"
    with pytest.raises(FetchError) as err:
        fetch("s3://models/ctr-ranker/3", dest, "model.plan")
    assert "has no model.plan" in str(err.value) and "model.onnx" in str(err.value)
    assert siblings(dest) == []


def test_cli_exit_codes(store: ObjectStore, tmp_path: Path) -> None:
    env = {**os.environ, **store.env(), "AWS_EC2_METADATA_DISABLED": "true"}
    dest = tmp_path / "models" / "ctr-ranker" / "1"
    ok = subprocess.run([RANKOPS, "fetch-model", "--uri", "s3://models/ctr-ranker/3", "--dest", str(dest),
                         "--expect", "model.onnx"], env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert tree(dest) == MODEL
    bad = subprocess.run([RANKOPS, "fetch-model", "--uri", "s3://models/ctr-ranker/3", "--dest", str(tmp_path / "x" / "1")],
                         env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"}, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("rankops fetch-model: s3://models/ctr-ranker/3:")
    assert "SignatureDoesNotMatch" in bad.stderr


# --- https: a real HTTP server that can lie about its length or stall ---------------------------

BODY = os.urandom(200_000)


class _Handler(http.server.BaseHTTPRequestHandler):
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/missing.onnx":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if self.path == "/model.onnx":
            self.wfile.write(BODY)
        elif self.path == "/short.onnx":
            self.wfile.write(BODY[: len(BODY) // 2])
            self.close_connection = True
        elif self.path == "/stall.onnx":
            self.wfile.write(BODY[: len(BODY) // 2])
            self.wfile.flush()
            self.release.wait(300)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_base() -> str:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Handler.release.set()
    server.shutdown()
    server.server_close()


def test_https_fetch_and_missing(http_base: str, tmp_path: Path) -> None:
    dest = tmp_path / "m" / "1"
    fetch(f"{http_base}/model.onnx", dest, "model.onnx")
    assert tree(dest) == {"model.onnx": BODY}
    with pytest.raises(FetchError, match="missing.onnx: not found \\(404\\)"):
        fetch(f"{http_base}/missing.onnx", tmp_path / "n" / "1")
    assert siblings(tmp_path / "n" / "1") == []


def test_truncated_download_leaves_no_dest(http_base: str, tmp_path: Path) -> None:
    dest = tmp_path / "m" / "1"
    with pytest.raises(FetchError) as err:
        fetch(f"{http_base}/short.onnx", dest, "model.onnx")
    assert f"{http_base}/short.onnx" in str(err.value)
    assert f"truncated ({len(BODY) // 2} of {len(BODY)} bytes)" in str(err.value)
    assert siblings(dest) == []


def _start_stalled_fetch(http_base: str, dest: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([RANKOPS, "fetch-model", "--uri", f"{http_base}/stall.onnx", "--dest", str(dest)],
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size for p in dest.parent.glob(".1.partial-*/stall.onnx")):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the fetch never started writing"
        time.sleep(0.1)
    return process


def test_interrupted_fetch_leaves_no_half_directory(http_base: str, tmp_path: Path) -> None:
    dest = tmp_path / "m" / "1"
    process = _start_stalled_fetch(http_base, dest)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143 and "interrupted" in stderr
    assert siblings(dest) == []


def test_killed_fetch_is_cleaned_by_the_next_run(http_base: str, tmp_path: Path) -> None:
    dest = tmp_path / "m" / "1"
    process = _start_stalled_fetch(http_base, dest)
    process.kill()
    process.communicate(timeout=60)
    assert not dest.exists() and len(siblings(dest)) == 1  # the hidden staging directory only
    fetch(f"{http_base}/model.onnx", dest, "model.onnx")
    assert siblings(dest) == ["1"] and tree(dest) == {"model.onnx": BODY}


def test_file_uri_still_copies(tmp_path: Path) -> None:
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "model.onnx").write_bytes(b"m")
    (tmp_path / "src" / "sub" / "x").write_bytes(b"x")
    dest = tmp_path / "models" / "m" / "1"
    fetch(f"file://{tmp_path / 'src'}", dest, "model.onnx")
    assert tree(dest) == {"model.onnx": b"m", "sub/x": b"x"}
    with pytest.raises(FetchError, match="does not exist"):
        fetch(f"file://{tmp_path / 'nope'}", tmp_path / "models" / "m" / "2")


# --- pure helpers --------------------------------------------------------------------------------

def test_object_plan_keeps_to_the_prefix_directory_and_refuses_escapes() -> None:
    listed = [("m/3/model.onnx", 5), ("m/3/", 0), ("m/30/model.onnx", 7), ("m/3/a/b", 1)]
    assert object_plan("s3://b/m/3", "m/3", listed) == [
        ("m/3/model.onnx", PurePosixPath("model.onnx"), 5), ("m/3/a/b", PurePosixPath("a/b"), 1)]
    assert object_plan("s3://b/m/3/model.onnx", "m/3/model.onnx", listed) == [
        ("m/3/model.onnx", PurePosixPath("model.onnx"), 5)]
    with pytest.raises(FetchError, match="outside --dest"):
        object_plan("s3://b/m/3", "m/3", [("m/3/../../etc/passwd", 1)])


def test_client_settings() -> None:
    assert client_settings("s3", {"AWS_DEFAULT_REGION": "eu-west-1"}) == {"config": {}}
    assert client_settings("s3", {"AWS_ENDPOINT_URL": "http://minio:9000"})["config"] == {
        "s3": {"addressing_style": "path"}}
    gs = client_settings("gs", {"AWS_ENDPOINT_URL": "http://minio:9000"})
    assert gs["endpoint_url"] == "https://storage.googleapis.com"
