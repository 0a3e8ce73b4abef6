"""The pure parts of `rankops warm`: judging a round, when warming ends, what /ready answers."""
from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

import pytest

from rankops.triton.samples import SamplesError, dump_samples, generate_samples, parse_input_spec
from rankops.gates.warm import (WAITING, WARM, WARMING, RoundResult, WarmState, host_port, judge_round, outcome,
                                serve_readiness)
from rankops.commands.warm import read_samples
from rankops.gates.warmup import Observations

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _observed(latencies: dict[int, list[float]], errors: dict[int, int] | None = None) -> Observations:
    seen = Observations()
    for batch, values in latencies.items():
        for value in values:
            seen.record(batch, value, None)
    for batch, count in (errors or {}).items():
        for _ in range(count):
            seen.record(batch, None, f"batch {batch} failed")
    return seen


def test_a_round_is_within_the_bound_only_with_no_error_and_its_p99_under_it():
    fast = judge_round(1, _observed({1: [1.0] * 99 + [4.0], 8: [2.0] * 100}))
    assert fast.requests == 200 and fast.errors == 0 and fast.p99_ms < 4.0
    assert fast.within(4.0) and not fast.within(1.5)
    assert fast.per_batch["8"]["requests"] == 100 and fast.per_batch["8"]["p99Ms"] == 2.0
    failing = judge_round(2, _observed({1: [1.0] * 10}, {8: 1}))
    assert not failing.within(1000.0) and failing.first_error == "batch 8 failed"
    assert failing.per_batch["8"] == {"requests": 1}
    record = failing.record(1000.0)
    assert (record["event"], record["round"], record["errors"], record["withinBound"]) == ("round", 2, 1, False)
    assert not judge_round(3, _observed({}, {1: 5})).within(1000.0), "no latency at all is not warm"


def _round(p99: float, errors: int = 0) -> RoundResult:
    return RoundResult(1, 10, errors, {"p99Ms": p99}, {}, {}, None)


@pytest.mark.parametrize("rounds,elapsed,expected", [
    ([], 0.0, None),
    ([_round(30.0)], 5.0, None),             # still cold: another round
    ([_round(30.0), _round(9.0)], 5.0, "warm"),
    ([_round(9.0, errors=1)], 5.0, None),    # a failing round is not warm
    ([_round(30.0)], 300.0, "timeout"),       # fail open at the deadline
    ([_round(9.0)], 300.0, "warm"),           # warm wins over the deadline
    ([_round(40.0), _round(30.0), _round(25.0)], 5.0, None),        # still getting faster
    ([_round(40.0), _round(30.0), _round(29.0), _round(31.0)], 5.0, "plateau"),  # as warm as it gets
    ([_round(40.0), _round(30.0, errors=1), _round(29.0)], 5.0, None),  # errors are no plateau
])
def test_warming_ends_warm_or_at_the_deadline(rounds, elapsed, expected):
    assert outcome(rounds, 10.0, elapsed, 300.0) == expected


def test_ready_answers_503_until_warm_and_200_with_the_numbers_after():
    state = WarmState()
    server = serve_readiness("127.0.0.1", 0, state)
    port = server.server_address[1]

    def get(path: str) -> tuple[int, dict]:
        try:
            with _DIRECT.open(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        assert get("/ready") == (503, {"phase": WAITING, "tritonStarts": 0})
        state.set(WARMING)
        assert get("/ready") == (503, {"phase": WARMING, "tritonStarts": 1})
        state.set(WARM, {"p99Ms": 3.2})
        assert get("/ready") == (200, {"phase": WARM, "tritonStarts": 1, "last": {"p99Ms": 3.2}})
        assert get("/healthz")[0] == 200 and get("/other")[0] == 404
        state.set(WAITING)  # Triton went away: its next start is cold
        assert get("/ready")[0] == 503
    finally:
        server.shutdown()


def test_host_port_brackets_an_ipv6_pod_ip():
    assert host_port("10.1.2.3", 8000) == "10.1.2.3:8000"
    assert host_port("fd00::5", 8000) == "[fd00::5]:8000"


SPEC = '[{"name": "x", "dataType": "FP32", "dims": [4]}]'


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"samples": None, "generate_samples": 3, "inputs_spec": SPEC, "batch_sizes": "1,4",
                                 "int_high": 10, **kw})


def test_recorded_samples_are_used_when_mounted_and_generated_ones_when_the_file_is_missing(tmp_path):
    recorded = tmp_path / "samples.jsonl"
    recorded.write_text(dump_samples(generate_samples(parse_input_spec(SPEC), 5, [2])))
    samples, source = read_samples(_args(samples=str(recorded)))
    assert (len(samples), source) == (5, str(recorded))
    samples, source = read_samples(_args(samples=str(tmp_path / "gone.jsonl")))
    assert len(samples) == 3 and [s.batch_size for s in samples] == [1, 4, 1]
    assert source == f"generated ({tmp_path / 'gone.jsonl'} missing)"
    with pytest.raises(SamplesError, match="missing and there is nothing to generate"):
        read_samples(_args(samples=str(tmp_path / "gone.jsonl"), generate_samples=0))
