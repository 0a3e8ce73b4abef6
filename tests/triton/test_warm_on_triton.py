"""`rankops warm` (the container beside Triton) against a real tritonserver.

The command line is the rendered Deployment's own warm container, with only the pod's address
and ports filled in: it answers 503 while its Triton is down, replays the warmup requests once
Triton is up, answers 200 once a round is within the bound, and warms again after a restart.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from rankops.render import gate_requests
from rankops_dev import triton
from rankops_dev.ports import free_port, free_ports

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml").read_text())
MODEL = EXAMPLE["metadata"]["name"]
HOST = "127.0.0.1"
# Loose: the CPU stand-in shares two cores with the rest of the suite; the point is the sequence.
BOUND_MS = 1000
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ready(port: int) -> tuple[int, dict] | None:
    try:
        with _DIRECT.open(f"http://{HOST}:{port}/ready", timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


def _wait(what: str, check, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _warm_command(doc: dict, server: triton.TritonServer, port: int) -> list[str]:
    """The rendered warm container's command, on this machine's address and ports."""
    _, deployment, _ = triton.rendered_serving(doc)
    [warm] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "warm"]
    command = [a.replace("$(POD_IP)", HOST) for a in warm["command"]]
    for flag, value in (("--http-port", server.ports["http"]), ("--metrics-port", server.ports["metrics"]),
                        ("--port", port)):
        command[command.index(flag) + 1] = str(value)
    assert command[:2] == ["rankops", "warm"]
    return [str(Path(sys.executable).parent / "rankops"), *command[1:]]


def _doc(**warm) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["spec"]["warmReplicas"] = {"maxP99Ms": BOUND_MS, "requests": 60, **warm}
    return doc


def test_warm_is_not_ready_until_it_has_warmed_its_triton_and_warms_it_again_after_a_restart(
        triton_install, tmp_path):
    doc = _doc()
    rm, server = triton.server_for_model(doc, tmp_path, install=triton_install)
    *ports, port = free_ports(4, HOST)
    server.ports = dict(zip(("http", "grpc", "metrics"), ports))
    log = tmp_path / "warm.log"
    with open(log, "wb") as out:
        warm = subprocess.Popen(_warm_command(doc, server, port), stdout=out, stderr=subprocess.STDOUT)
    try:
        # No Triton yet: the readiness endpoint answers, and says not ready.
        code, body = _wait("the readiness endpoint", lambda: _ready(port), 60)
        assert (code, body["phase"]) == (503, "WaitingForTriton"), body
        with server:
            code, body = _wait("warm", lambda: (r := _ready(port)) and r[0] == 200 and r)
            first = [e for e in _events(log) if e["event"] == "warm"]
            assert len(first) == 1, _events(log)
            summary = first[0]
            assert body["last"] == summary and summary["ready"] == "warm", summary
            assert summary["errors"] == 0 and 0 < summary["p99Ms"] <= BOUND_MS, summary
            assert summary["warmRequests"] >= 60 and summary["coldRequests"] == summary["samples"] > 0, summary
            # The shapes production sends: one request per user, the candidate counts spread.
            assert summary["batchSizes"] == gate_requests.batch_sizes(rm.spec) and \
                len(summary["batchSizes"]) == gate_requests.CANDIDATE_COUNTS, summary
            rounds = [e for e in _events(log) if e["event"] == "round"]
            assert rounds and rounds[-1]["withinBound"] and rounds[-1]["p99Ms"] == summary["p99Ms"], rounds
            # Triton's own view of the round, read from its metrics port.
            assert rounds[-1]["server"]["requests"] == rounds[-1]["requests"], rounds[-1]
            assert rounds[-1]["server"]["avgBatchSize"] >= 100, "a batch item is a candidate"
            print(f"\nwarm: {json.dumps(summary)}")
        # Triton stopped: a restart is a cold start, so the pod goes un-Ready until warmed again.
        _wait("not ready after Triton stopped", lambda: (r := _ready(port)) and r[0] == 503, 60)
        server.start()  # the same ports: the pod's Triton container restarted
        try:
            _wait("warm again", lambda: (r := _ready(port)) and r[0] == 200 and r[1]["tritonStarts"] == 2)
        finally:
            server.stop()
        events = [e["event"] for e in _events(log)]
        assert events.count("warm") == 2 and "tritonGone" in events, events
        assert events.index("tritonGone") < len(events) - 1 - events[::-1].index("coldPass"), events
    finally:
        warm.terminate()
        warm.wait(10)


def test_a_replica_that_cannot_meet_the_bound_goes_ready_anyway_and_says_why(triton_install, tmp_path):
    doc = _doc(maxP99Ms=0.001, requests=20)
    _, server = triton.server_for_model(doc, tmp_path, install=triton_install)
    with server:
        port, log = free_port(HOST), tmp_path / "warm.log"
        command = _warm_command(doc, server, port)
        command[command.index("--deadline-s") + 1] = "1"
        with open(log, "wb") as out:
            warm = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            code, body = _wait("ready at the deadline", lambda: (r := _ready(port)) and r[0] == 200 and r)
        finally:
            warm.terminate()
            warm.wait(10)
    summary = body["last"]
    # At the deadline, or earlier once more rounds stopped making it faster.
    assert summary["ready"] in ("timeout", "plateau") and summary["p99Ms"] > 0.001, summary
    assert "taking traffic" in summary["message"] and "0.001 ms" in summary["message"], summary
