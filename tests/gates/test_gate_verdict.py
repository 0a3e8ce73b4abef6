"""The verdict contract between a gate Job and the operator that reads its termination message."""
import json

import numpy as np
import pytest

from rankops.gates.verdict import (VERDICT_MAX_BYTES, Verdict, error_verdict, parse_verdict,
                                   write_verdict)


def _verdict(**metrics) -> Verdict:
    return Verdict("equivalence", "fail", "RankingDisagrees", "top-50 overlap 0.62 < 0.95", metrics)


def test_round_trip_through_json():
    verdict = _verdict(topKOverlap=0.62, worstRequests=[{"sample": 3, "rankCorrelation": 0.1}])
    parsed = parse_verdict(verdict.to_json())
    assert parsed == verdict
    assert not parsed.passed and parsed.exit_code == 1


@pytest.mark.parametrize("outcome, code", [("pass", 0), ("fail", 1), ("error", 2)])
def test_exit_code_follows_outcome(outcome, code):
    assert Verdict("warmup", outcome, "R", "s").exit_code == code
    assert Verdict("warmup", outcome, "R", "s").passed == (outcome == "pass")


def test_numpy_numbers_and_non_finite_values_become_plain_json():
    text = _verdict(p99Ms=np.float32(12.5), requests=np.int64(2000), bad=float("nan"),
                    inf=np.float64("inf"), nested={"x": [np.float64(1 / 3)]}).to_json()
    data = json.loads(text)   # strict JSON: Kubernetes rejects NaN / Infinity
    assert "NaN" not in text and "Infinity" not in text
    assert data["metrics"]["p99Ms"] == 12.5 and data["metrics"]["requests"] == 2000
    assert isinstance(data["metrics"]["requests"], int)
    assert data["metrics"]["bad"] is None and data["metrics"]["inf"] is None
    assert data["metrics"]["nested"]["x"][0] == pytest.approx(1 / 3, rel=1e-5)


def test_oversized_verdict_is_trimmed_under_the_termination_message_cap():
    worst = [{"sample": i, "row": 0, "maxAbsError": 0.1 * i, "note": "x" * 50} for i in range(200)]
    per_batch = {str(b): {"p99Ms": 1.0 * b, "examples": ["e" * 80] * 20} for b in range(1, 40)}
    verdict = _verdict(topKOverlap=0.5, worstRequests=worst, perBatchSize=per_batch,
                       errorExamples=["boom " * 100] * 10)
    text = verdict.to_json()
    assert len(text.encode()) <= VERDICT_MAX_BYTES
    data = json.loads(text)
    assert data["metrics"]["topKOverlap"] == 0.5          # key numbers survive
    assert data["reason"] == "RankingDisagrees"
    assert len(data["metrics"].get("worstRequests", [])) <= 3


def test_small_verdict_is_not_marked_truncated():
    assert "truncated" not in json.loads(_verdict(a=1).to_json())["metrics"]


def test_multiline_summary_becomes_one_line():
    verdict = Verdict("warmup", "pass", "Ok", "line one\nline two\n")
    assert json.loads(verdict.to_json())["summary"] == "line one line two"


@pytest.mark.parametrize("text, reason", [
    ("", "NoVerdict"),
    (None, "NoVerdict"),
    ("   \n", "NoVerdict"),
    ("Traceback (most recent call last):\n  File x\nKeyError: 'a'", "UnparsableVerdict"),
    ("[1, 2, 3]", "UnparsableVerdict"),
    ('{"gate": "warmup", "outcome": "maybe"}', "UnparsableVerdict"),
    ('{"gate": "warmup", "outcome": "pass"', "UnparsableVerdict"),
])
def test_garbage_becomes_an_error_verdict(text, reason):
    verdict = parse_verdict(text, gate="warmup")
    assert verdict.outcome == "error" and verdict.reason == reason
    assert verdict.gate == "warmup" and verdict.summary


def test_verdict_found_at_the_end_of_log_text():
    # terminationMessagePolicy FallbackToLogsOnError leaves the log tail, the verdict last.
    verdict = Verdict("warmup", "pass", "WarmP99WithinBound", "p99 3ms", {"p99Ms": 3.0})
    logs = "INFO starting\nsome {braces} here\n" + verdict.to_json() + "\n"
    assert parse_verdict(logs.encode()) == verdict


def test_missing_optional_fields_are_tolerated():
    verdict = parse_verdict('{"gate": "warmup", "outcome": "fail", "metrics": [1]}')
    assert verdict.outcome == "fail" and verdict.reason == "Unspecified"
    assert verdict.metrics == {} and verdict.summary == ""


def test_write_verdict_prints_writes_file_and_returns_exit_code(tmp_path, capsys):
    path = tmp_path / "termination-log"
    verdict = error_verdict("equivalence", "ServerUnreachable", "reference at r:8000 does not answer")
    assert write_verdict(verdict, str(path)) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(path.read_text())
    assert "ServerUnreachable" in err


def test_unwritable_verdict_file_is_reported_not_raised(tmp_path, capsys):
    target = tmp_path / "missing-dir" / "verdict.json"
    assert write_verdict(Verdict("warmup", "pass", "Ok", "fine"), str(target)) == 0
    assert "cannot write the verdict" in capsys.readouterr().err
