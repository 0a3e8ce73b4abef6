"""`rankops dev images --check`: run what was built, with buildah and no container runtime.

Each rankops image runs its entry point's `--help` as the image's own user; the Triton test image
runs its tritonserver over a model repository holding an ONNX model (served by the onnxruntime
CPU stand-in through the Python backend's stub) and answers one inference request on loopback.
`buildah run --isolation chroot` shares the host's network namespace, so the request goes to
127.0.0.1.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .image_builds import ISOLATION, TRITON_TARGET
from .ports import free_ports

ENTRY_POINTS = {"operator": ["rankops", "--help"], "validator": ["rankops", "validate-node", "--help"],
                "gates": ["rankops", "gate", "--help"]}
MODEL = "add"
CONFIG = f"""name: "{MODEL}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [{{ name: "a" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "b" data_type: TYPE_FP32 dims: [ 4 ] }}]
output [{{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
"""


@contextmanager
def container(tag: str) -> Iterator[str]:
    name = subprocess.run(["buildah", "from", "--pull-never", tag], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True)


def run_in(tag: str, command: list[str]) -> subprocess.CompletedProcess:
    with container(tag) as name:
        return subprocess.run(["buildah", "run", f"--isolation={ISOLATION}", name, "--", *command],
                              capture_output=True, text=True, timeout=120)


def check_entry_point(target: str, tag: str) -> tuple[str, bool]:
    who = run_in(tag, ["id"])
    helped = run_in(tag, ENTRY_POINTS[target])
    passed = who.returncode == 0 and "uid=1001" in who.stdout and helped.returncode == 0 and "usage:" in helped.stdout
    first = (helped.stdout.splitlines() or [helped.stderr.strip()[-300:]])[0]
    return f"{target}: `{' '.join(ENTRY_POINTS[target])}` as {who.stdout.strip() or who.stderr.strip()}: {first}", passed


def write_repository(root: Path) -> Path:
    """/models/add: y = a + b as an ONNX graph (needs the onnx package on this side)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], MODEL,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # onnxruntime 1.19 reads up to IR 10; 8 is safe
    version = root / "models" / MODEL / "1"
    version.mkdir(parents=True)
    onnx.save(model, str(version / "model.onnx"))
    (version.parent / "config.pbtxt").write_text(CONFIG)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the image's user 1000
    return root / "models"


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def check_triton(tag: str, say: Callable[[str], None]) -> tuple[str, bool]:
    work = Path(tempfile.mkdtemp(prefix="rankops-triton-image-"))
    work.chmod(0o755)
    line, passed = _serve_and_ask(tag, work, say)
    if passed:  # a failure keeps the repository and the server's log for a look
        shutil.rmtree(work, ignore_errors=True)
    return line, passed


def _serve_and_ask(tag: str, work: Path, say: Callable[[str], None]) -> tuple[str, bool]:
    repository = write_repository(work)
    http, grpc, metrics = free_ports(3, "127.0.0.1")
    log_path = work / "tritonserver.log"
    with container(tag) as name, open(log_path, "wb") as log:
        command = ["buildah", "run", f"--isolation={ISOLATION}", "-v", f"{repository}:/models:ro", name, "--",
                   "tritonserver", "--model-repository=/models", "--http-address=127.0.0.1",
                   f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
                   "--metrics-address=127.0.0.1", f"--metrics-port={metrics}"]
        say(f"triton-test: {' '.join(command)}")
        start = time.monotonic()
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready = _wait_ready(server, f"http://127.0.0.1:{http}/v2/health/ready", 120)
            if not ready:
                return f"triton-test: not ready (log {log_path}): {log_path.read_text(errors='replace')[-800:]}", False
            ready_s = time.monotonic() - start
            answer = _post(f"http://127.0.0.1:{http}/v2/models/{MODEL}/infer", {"inputs": [
                {"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]}]})
            y = next(o for o in answer["outputs"] if o["name"] == "y")["data"]
            uid = _server_uid(server.pid)
            passed = y == [11, 22, 33, 44] and uid == 1000
            return (f"triton-test: ready in {ready_s:.1f} s, {MODEL}(a=[1,2,3,4], b=[10,20,30,40]) -> {y} "
                    f"(onnxruntime stand-in), tritonserver uid {uid}"), passed
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def _wait_ready(server: subprocess.Popen, url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.5)
    return False


def _server_uid(session: int) -> int | None:
    """The real uid of the tritonserver process in `session` (buildah's process group)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getsid(int(proc.name)) != session or (proc / "comm").read_text().strip() != "tritonserver":
                continue
            status = (proc / "status").read_text()
        except (OSError, ProcessLookupError):
            continue
        return int(next(l for l in status.splitlines() if l.startswith("Uid:")).split()[1])
    return None


def check(tags: dict[str, str], say: Callable[[str], None]) -> list[tuple[str, bool]]:
    results = [check_entry_point(target, tag) for target, tag in tags.items() if target in ENTRY_POINTS]
    if TRITON_TARGET in tags:
        results.append(check_triton(tags[TRITON_TARGET], say))
    return results
