"""The gates end to end against a real KServe v2 server: MLServer serving ONNX ranking models.

Each test runs the `rankops gate ...` command line (in-process, one through the console script)
and checks the exit code, the printed verdict and the verdict file.
"""
import json
import subprocess
import sys
from pathlib import Path

from rankops.cli import main
from rankops.gates import parse_verdict

TOLERANCES = ["--abs-tolerance", "1e-3", "--rel-tolerance", "1e-2", "--top-k", "10",
              "--min-topk-overlap", "0.95", "--min-rank-correlation", "0.9"]


def _gate(capsys, tmp_path, *argv: str) -> tuple[int, dict]:
    verdict_file = tmp_path / "termination-log"
    code = main(["gate", *argv, "--verdict-file", str(verdict_file)])
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(verdict_file.read_text()) == printed
    assert parse_verdict(verdict_file.read_text()).exit_code == code
    return code, printed


def _warmup(capsys, tmp_path, server, model, samples, *extra):
    return _gate(capsys, tmp_path, "warmup", "--url", server.url, "--model", model, "--samples", str(samples),
                 "--requests", "120", "--concurrency", "4", "--max-p99-ms", "500", "--no-binary-data", *extra)


def _equivalence(capsys, tmp_path, server, candidate, samples, *reference):
    reference = reference or ("--reference-url", server.url, "--reference-model", "reference:1")
    return _gate(capsys, tmp_path, "equivalence", *reference, "--candidate-url", server.url,
                 "--candidate-model", candidate, "--samples", str(samples), *TOLERANCES, "--no-binary-data")


# --- warmup ---------------------------------------------------------------------------------

def test_warmup_passes_with_recorded_samples(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _warmup(capsys, tmp_path, mlserver, "reference", golden_samples)
    m = verdict["metrics"]
    assert (code, verdict["outcome"], verdict["reason"]) == (0, "pass", "WarmP99WithinBound")
    assert m["requests"] == 120 and m["errors"] == 0 and m["coldRequests"] == 24
    assert 0 < m["p50Ms"] <= m["p95Ms"] <= m["p99Ms"] <= m["maxMs"] <= 500
    assert set(m["perBatchSize"]) == {"1", "2", "4"}
    assert sum(b["requests"] for b in m["perBatchSize"].values()) == 120
    assert f"{m['p99Ms']:.2f}ms" in verdict["summary"]


def test_warmup_generates_samples_from_the_input_spec(capsys, tmp_path, mlserver, input_spec):
    code, verdict = _gate(capsys, tmp_path, "warmup", "--url", f"http://{mlserver.url}/", "--model", "fp16:1",
                          "--generate-samples", "6", "--inputs-spec", json.dumps(input_spec),
                          "--batch-sizes", "1,4,8", "--requests", "60", "--concurrency", "2",
                          "--max-p99-ms", "500", "--no-binary-data")
    assert code == 0, verdict
    assert set(verdict["metrics"]["perBatchSize"]) == {"1", "4", "8"}
    assert verdict["metrics"]["distinctSamples"] == 6


def test_warmup_fails_when_p99_is_above_the_bound(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _warmup(capsys, tmp_path, mlserver, "reference", golden_samples, "--max-p99-ms", "0.001")
    assert (code, verdict["reason"]) == (1, "P99AboveBound")
    assert verdict["metrics"]["p99Ms"] > 0.001 and "> 0.001ms" in verdict["summary"]


def test_warmup_fails_a_candidate_whose_requests_error(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _warmup(capsys, tmp_path, mlserver, "broken", golden_samples)
    assert (code, verdict["outcome"], verdict["reason"]) == (1, "fail", "RequestsFailed")
    m = verdict["metrics"]   # every cold request failed: the replay never started
    assert (m["coldErrors"], m["requests"], m["errors"]) == (m["coldRequests"], 0, 0) and "HTTP 500" in verdict["summary"]
    assert f"0 of 0 warm requests failed ({m['coldErrors']} of {m['coldRequests']} in the cold pass)" in verdict["summary"]


def test_warmup_fails_a_candidate_with_a_renamed_input(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _warmup(capsys, tmp_path, mlserver, "renamed", golden_samples)
    assert (code, verdict["reason"]) == (1, "InputsMismatch")
    assert "missing ['user_feats']" in verdict["summary"] and "unexpected ['user_features']" in verdict["summary"]


def test_warmup_fails_an_unknown_model(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _warmup(capsys, tmp_path, mlserver, "no-such-model", golden_samples)
    assert (code, verdict["reason"]) == (1, "ModelNotReady")


def test_binary_tensors_against_a_plain_v2_server_is_a_configuration_error(capsys, tmp_path, mlserver,
                                                                           golden_samples):
    code, verdict = _gate(capsys, tmp_path, "warmup", "--url", mlserver.url, "--model", "reference",
                          "--samples", str(golden_samples), "--requests", "5", "--max-p99-ms", "500")
    assert (code, verdict["outcome"], verdict["reason"]) == (2, "error", "BinaryDataUnsupported")
    assert "--no-binary-data" in verdict["summary"]


def test_unreachable_server_cannot_be_judged_and_prints_no_traceback(tmp_path, golden_samples):
    verdict_file = tmp_path / "verdict.json"
    rankops = Path(sys.executable).parent / "rankops"
    result = subprocess.run([str(rankops), "gate", "warmup", "--url", "127.0.0.1:1", "--model", "reference",
                             "--samples", str(golden_samples), "--requests", "10", "--concurrency", "2",
                             "--max-p99-ms", "15", "--reach-within-s", "2", "--verdict-file", str(verdict_file)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    verdict = parse_verdict(verdict_file.read_text())
    assert (verdict.outcome, verdict.reason) == ("error", "ServerUnreachable")
    assert "127.0.0.1:1" in verdict.summary and "waited 2s" in verdict.summary


def test_bad_samples_cannot_be_judged(capsys, tmp_path, mlserver):
    samples = tmp_path / "bad.jsonl"
    samples.write_text('{"inputs": {"user_features": [[1.0]]}}\n{"inputs": oops}\n')
    code, verdict = _warmup(capsys, tmp_path, mlserver, "reference", samples)
    assert (code, verdict["reason"]) == (2, "BadSamples") and "line 2" in verdict["summary"]


def test_bad_command_line_still_leaves_a_verdict(tmp_path, golden_samples):
    verdict_file = tmp_path / "verdict.json"
    rankops = Path(sys.executable).parent / "rankops"
    result = subprocess.run([str(rankops), "gate", "warmup", "--url", "x:1", "--model", "m",
                             "--samples", str(golden_samples), "--requests", "many",
                             "--verdict-file", str(verdict_file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    verdict = parse_verdict(verdict_file.read_text())
    assert verdict.reason == "BadArguments" and "--requests" in verdict.summary


# --- equivalence ----------------------------------------------------------------------------

def test_fp16_candidate_is_equivalent_to_the_stable_version(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "fp16", golden_samples)
    m = verdict["metrics"]
    assert (code, verdict["reason"]) == (0, "OutputsEquivalent"), verdict["summary"]
    assert 0 < m["maxAbsError"] <= 1e-3          # really different weights, within tolerance
    assert m["topKOverlap"] >= 0.95 and m["rankCorrelation"] >= 0.9
    assert m["requests"] == 24 and m["rankedLists"] == 56 and m["output"] == "scores"


def test_perturbed_candidate_fails_on_ranking_agreement(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "perturbed", golden_samples)
    m = verdict["metrics"]
    assert (code, verdict["outcome"], verdict["reason"]) == (1, "fail", "RankingDisagrees")
    assert m["topKOverlap"] < 0.95 and m["rankCorrelation"] < 0.9
    assert {"topKOverlap", "rankCorrelation"} <= set(m["failedChecks"])
    assert f"{m['rankCorrelation']:.3f}" in verdict["summary"]
    assert len(m["worstRequests"]) == 3
    assert m["worstRequests"][0]["rankCorrelation"] == m["rankCorrelationMin"]


def test_equivalence_with_spearman(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "fp16", golden_samples,
                                 "--reference-url", mlserver.url, "--reference-model", "reference",
                                 "--rank-correlation-method", "spearman")
    assert code == 0 and verdict["metrics"]["rankCorrelationMethod"] == "spearman"


def test_original_torchscript_model_as_the_reference(capsys, tmp_path, mlserver, ranking_models, golden_samples):
    torchscript = ("--reference-torchscript", str(ranking_models.torchscript))
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "reference", golden_samples, *torchscript)
    assert code == 0, verdict["summary"]
    assert verdict["metrics"]["maxAbsError"] < 1e-4      # the ONNX export of the same weights
    assert verdict["metrics"]["reference"].startswith("torchscript ")
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "perturbed", golden_samples, *torchscript)
    assert (code, verdict["reason"]) == (1, "RankingDisagrees")


def test_candidate_with_renamed_input_fails_equivalence(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "renamed", golden_samples)
    assert (code, verdict["reason"]) == (1, "CandidateInputsMismatch")


def test_candidate_whose_requests_error_fails_equivalence(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "broken", golden_samples)
    assert (code, verdict["reason"]) == (1, "CandidateRequestFailed") and "sample 1" in verdict["summary"]


def test_unreachable_reference_cannot_be_judged(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "fp16", golden_samples,
                                 "--reference-url", "127.0.0.1:1", "--reference-model", "reference",
                                 "--reach-within-s", "2")
    assert (code, verdict["outcome"], verdict["reason"]) == (2, "error", "ServerUnreachable")
    assert "reference" in verdict["summary"] and "waited 2s" in verdict["summary"]


def test_missing_reference_is_a_bad_argument(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _gate(capsys, tmp_path, "equivalence", "--candidate-url", mlserver.url,
                          "--candidate-model", "fp16", "--samples", str(golden_samples), *TOLERANCES)
    assert (code, verdict["reason"]) == (2, "BadArguments") and "--reference-torchscript" in verdict["summary"]


def test_unloadable_torchscript_reference_cannot_be_judged(capsys, tmp_path, mlserver, golden_samples):
    bogus = tmp_path / "model.pt"
    bogus.write_bytes(b"not a torchscript archive")
    code, verdict = _equivalence(capsys, tmp_path, mlserver, "fp16", golden_samples,
                                 "--reference-torchscript", str(bogus))
    assert (code, verdict["reason"]) == (2, "ReferenceUnloadable") and str(bogus) in verdict["summary"]


def test_conflicting_model_versions_are_a_bad_argument(capsys, tmp_path, mlserver, golden_samples):
    code, verdict = _warmup(capsys, tmp_path, mlserver, "reference:1", golden_samples, "--model-version", "2")
    assert (code, verdict["reason"]) == (2, "BadArguments") and "give the version once" in verdict["summary"]


def test_gates_report_progress_on_a_terminal_and_stay_quiet_otherwise(capsys, monkeypatch, tmp_path, mlserver,
                                                                       golden_samples):
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    code, _ = _warmup(capsys, tmp_path, mlserver, "reference", golden_samples)
    assert code == 0 and capsys.readouterr().err == ""  # not a TTY: the verdict alone
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _warmup(capsys, tmp_path, mlserver, "reference", golden_samples)
    _equivalence(capsys, tmp_path, mlserver, "fp16", golden_samples)
    lines = terminal.getvalue()
    for step in ("cold pass(es) over", "warmup: replaying 120 warm requests, 4 in flight", "warmup: 120 sent, 0 failed",
                 "equivalence: sending", "equivalence: running the same samples on the reference",
                 "equivalence: comparing"):
        assert step in lines, lines
