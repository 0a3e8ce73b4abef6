"""`rankops warm` never fails open on errors: the error-ratio bound, the back-off between rounds,
the termination message the operator reads, and the warmup gate's one count (issue 24, 5 and 6)."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from rankops.commands import warm as warm_cli
from rankops.gates.warm import (FAILING, FAILING_ROUNDS, WARMUP_FAILING, RoundResult, WarmConfig, Warmer, WarmState,
                                backoff_s, failing_message, outcome, termination_message)
from rankops.gates.warmup import Observations, WarmupConfig, _verdict
from rankops.rollout import warming


def _round(errors: int, requests: int = 200, p99: float = 5.0, first: str | None = None) -> RoundResult:
    stats = {"p99Ms": p99} if requests > errors else {}
    return RoundResult(1, requests, errors, stats, {}, {}, first or ("boom" if errors else None))


@pytest.mark.parametrize("rounds,elapsed,expected", [
    ([_round(150)] * (FAILING_ROUNDS - 1), 5.0, None),          # not yet: a blip at start may pass
    ([_round(150)] * FAILING_ROUNDS, 5.0, "failing"),           # 75% failing, 3 rounds in a row
    ([_round(150), _round(150), _round(2)], 5.0, None),          # 1% is within the bound: not failing
    ([_round(150), _round(1), _round(150)], 5.0, None),          # not in a row
    ([_round(150)], 300.0, "failing"),                           # the deadline never fails open on errors
    ([_round(2)], 300.0, "timeout"),                             # errors within the bound: slow, fails open
    ([_round(0, p99=50.0)], 300.0, "timeout"),                   # slow alone: fails open at the deadline
    ([_round(0, requests=0)] * FAILING_ROUNDS, 5.0, "failing"),  # nothing could be sent
])
def test_a_replay_failing_above_the_error_ratio_is_failing_never_warm_or_timed_out(rounds, elapsed, expected):
    assert outcome(rounds, 10.0, elapsed, 300.0, max_error_ratio=0.01) == expected


def test_rounds_with_errors_back_off_exponentially_up_to_a_cap_and_an_error_free_round_resets_it():
    assert backoff_s([]) == 0.0 and backoff_s([_round(0)]) == 0.0
    assert [backoff_s([_round(5)] * n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_s([_round(5)] * 4 + [_round(0), _round(5)]) == 1.0


def test_the_failing_message_names_the_share_the_bound_and_the_first_error():
    message = failing_message([_round(150, first="HTTP 400: index out of range")] * 3, 0.01)
    assert message == ("75% of 600 warm requests failed in the last 3 rounds (at most 1% may): "
                       "HTTP 400: index out of range")
    data = json.loads(termination_message({"reason": WARMUP_FAILING, "message": "x" * 5000, "rounds": 3, "other": 1}))
    assert data["reason"] == WARMUP_FAILING and "other" not in data


class _Failing(Warmer):
    """A warmer whose Triton is up and whose every round fails 3 of 4 requests (no network)."""

    def __init__(self, config: WarmConfig, state: WarmState, log: list):
        super().__init__(None, [], config, state, log.append)
        self.pauses: list[float] = []
        self.stop.wait = lambda s=None: self.pauses.append(s) or False   # back-offs recorded, not slept

    def _wait_for_triton(self):
        return 0.1

    def warm(self, waited_s):
        import rankops.gates.warm as warm

        seen = Observations()
        for i in range(200):
            seen.record(1, 1.0, None if i % 4 == 0 else "HTTP 400: embedding id out of range")
        saved = (warm.replay, warm.triton_ready, warm._send)
        warm.replay, warm.triton_ready, warm._send = (lambda *a, **k: seen), (lambda e: True), (lambda *a: None)
        self._requests = lambda: ([], None)
        self.endpoint = type("E", (), {"connect": lambda s: type("C", (), {"close": lambda c: None})(),
                                       "describe": lambda s: "fake"})()
        try:
            return super().warm(waited_s)
        finally:
            warm.replay, warm.triton_ready, warm._send = saved


def test_a_warmer_whose_model_fails_stops_not_ready_after_backing_off_and_says_why():
    state, log = WarmState(), []
    warmer = _Failing(WarmConfig(requests=200, max_p99_ms=100.0), state, log)
    summary = warmer.run()
    assert summary["reason"] == WARMUP_FAILING and summary["ready"] == "failing" and summary["rounds"] == 3
    assert summary["errorRatio"] == 0.75 and "75% of 600 warm requests failed" in summary["message"]
    assert state.answer()[0] == 503 and state.phase == FAILING, "a failing pod is never Ready"
    assert warmer.pauses == [1.0, 2.0], "rounds back off instead of hammering the model"
    assert [r["event"] for r in log].count("backoff") == 2


def test_the_cli_exits_1_with_the_reason_in_its_termination_message(monkeypatch, tmp_path, capsys):
    failed = {"reason": WARMUP_FAILING, "message": "75% of 600 warm requests failed", "rounds": 3}
    monkeypatch.setattr(warm_cli.Warmer, "run", lambda self: failed)
    spec = json.dumps([{"name": "x", "dataType": "FP32", "dims": [4]}])
    path = tmp_path / "termination-log"
    parser = argparse.ArgumentParser()
    warm_cli.add_commands(parser.add_subparsers())
    args = parser.parse_args(["warm", "--host", "127.0.0.1", "--port", "0", "--model", "m", "--max-p99-ms", "10",
                              "--generate-samples", "2", "--inputs-spec", spec, "--termination-file", str(path)])
    code = args.func(args)
    assert code == 1
    # What the operator reads back from the pod's status names the pod and the failures.
    pod = {"metadata": {"name": "m-stable-abc"},
           "status": {"conditions": [{"type": "Ready", "status": "False"}],
                      "containerStatuses": [{"name": "warm", "ready": False, "restartCount": 1,
                                             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                             "lastState": {"terminated": {"exitCode": 1,
                                                                          "message": path.read_text()}}}]}}
    assert warming.warm_failure(pod) == ("pod m-stable-abc: 75% of 600 warm requests failed "
                                         "(warm container restarted 1x, CrashLoopBackOff)")
    assert "WarmupFailing" in capsys.readouterr().err


def test_the_operator_and_the_warm_container_agree_on_the_reason():
    assert warming.WARMUP_FAILING == WARMUP_FAILING


# -- the warmup gate: one count for the summary and the metrics (issue 24, 6) --

def _seen(sent: int, failed: int) -> Observations:
    seen = Observations()
    for i in range(sent):
        seen.record(1, None if i < failed else 2.0, "HTTP 500" if i < failed else None)
    return seen


@pytest.mark.parametrize("cold,warm", [((16, 4), (14, 14)), ((16, 16), (0, 0)), ((16, 0), (200, 3))])
def test_the_warmup_gates_summary_says_the_numbers_of_its_metrics(cold, warm):
    config = WarmupConfig(requests=200, concurrency=2, max_p99_ms=10.0)
    verdict = _verdict(_seen(*cold), _seen(*warm), config, 16)
    m = verdict.metrics
    assert (m["coldRequests"], m["coldErrors"], m["requests"], m["errors"]) == (*cold, *warm)
    said = re.search(r"(\d+) of (\d+) warm requests failed \((\d+) of (\d+) in the cold pass\)", verdict.summary)
    assert said, verdict.summary
    assert tuple(int(n) for n in said.groups()) == (m["errors"], m["requests"], m["coldErrors"], m["coldRequests"])


# -- against a real v2 server (MLServer): a model whose every request fails --

def test_rankops_warm_against_a_model_failing_every_request_exits_1_not_ready_after_backing_off(
        capsys, tmp_path, mlserver, golden_samples):
    from rankops.cli import main

    path = tmp_path / "termination-log"
    host, port = mlserver.url.rsplit(":", 1)
    code = main(["warm", "--host", host.split("//")[-1], "--http-port", port, "--metrics-port", "0", "--port", "0",
                 "--model", "broken", "--samples", str(golden_samples), "--requests", "20", "--max-p99-ms", "500",
                 "--no-binary-data", "--termination-file", str(path)])
    out = capsys.readouterr()
    log = [json.loads(line) for line in out.out.splitlines() if line.startswith("{")]
    assert code == 1, out
    rounds = [r for r in log if r["event"] == "round"]
    assert len(rounds) == FAILING_ROUNDS and all(r["errors"] == r["requests"] == 20 for r in rounds)
    assert [r["seconds"] for r in log if r["event"] == "backoff"] == [1.0, 2.0]
    message = json.loads(path.read_text())
    assert message["reason"] == WARMUP_FAILING and message["errorRatio"] == 1.0, message
    assert message["message"].startswith("100% of 60 warm requests failed in the last 3 rounds") and "500" in message["message"]
