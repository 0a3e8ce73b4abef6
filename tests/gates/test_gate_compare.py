"""The equivalence gate's arithmetic, on arrays: tolerances, top-K overlap, rank correlation."""
import json

import numpy as np
import pytest

from rankops.gates.equivalence import (Criteria, compare, kendall_tau_b, ranked_lists, spearman_rho,
                                       topk_overlap)
from rankops.triton.samples import Sample
from rankops.gates.verdict import VERDICT_MAX_BYTES

CRITERIA = Criteria(abs_tolerance=1e-3, rel_tolerance=1e-2, top_k=5, min_topk_overlap=0.95,
                    min_rank_correlation=0.9)


def _samples(n: int) -> list[Sample]:
    return [Sample(line=i + 1, inputs={"x": np.zeros((2, 1))}) for i in range(n)]


def _scores(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"scores": rng.standard_normal((2, 20)).astype(np.float32)} for _ in range(n)]


def test_kendall_and_spearman_known_values():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    swapped = np.array([1.0, 3.0, 2.0, 4.0])      # one discordant pair of six
    assert kendall_tau_b(x, swapped) == pytest.approx(4 / 6)
    assert spearman_rho(x, swapped) == pytest.approx(0.8)
    assert kendall_tau_b(x, -x) == pytest.approx(-1.0)
    assert spearman_rho(x, x * 10 + 3) == pytest.approx(1.0)


def test_kendall_tau_b_with_ties_and_blocks():
    x = np.array([1.0, 2.0, 2.0, 3.0])
    y = np.array([1.0, 2.0, 3.0, 3.0])
    # concordant 4, discordant 0; pairs untied in x: 5, in y: 5 -> 4/5
    assert kendall_tau_b(x, y) == pytest.approx(0.8)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(700), rng.standard_normal(700)
    assert kendall_tau_b(a, b, block=64) == pytest.approx(kendall_tau_b(a, b, block=1000))


def test_degenerate_lists():
    assert kendall_tau_b(np.array([1.0]), np.array([2.0])) is None
    assert kendall_tau_b(np.ones(4), np.ones(4)) == 1.0
    assert spearman_rho(np.ones(4), np.arange(4.0)) == 0.0


def test_topk_overlap():
    ref = np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0], dtype=float)
    cand = ref.copy()
    cand[[2, 9]] = cand[[9, 2]]        # item 2 drops out of the top 3, item 9 enters it
    assert topk_overlap(ref, cand, 3) == pytest.approx(2 / 3)
    assert topk_overlap(ref, cand, 100) == 1.0       # k larger than the list: the whole list


@pytest.mark.parametrize("shape, lists", [((2, 20), (2, 20)), ((20,), (1, 20)), ((20, 1), (1, 20)),
                                          ((3, 4, 5), (12, 5)), ((), (1, 1))])
def test_ranked_lists_shapes(shape, lists):
    assert ranked_lists(np.zeros(shape)).shape == lists


def test_identical_outputs_pass():
    ref = _scores(4)
    verdict = compare(_samples(4), ref, [dict(r) for r in ref], "scores", CRITERIA)
    assert verdict.passed and verdict.reason == "OutputsEquivalent"
    assert verdict.metrics["maxAbsError"] == 0 and verdict.metrics["rankedLists"] == 8
    assert verdict.metrics["topKOverlap"] == 1.0 and verdict.metrics["rankCorrelation"] == 1.0


def test_reversed_ranking_fails_with_the_numbers():
    ref = _scores(3)
    cand = [{"scores": -r["scores"]} for r in ref]
    verdict = compare(_samples(3), ref, cand, "scores", CRITERIA)
    assert verdict.outcome == "fail" and verdict.reason == "RankingDisagrees"
    assert verdict.metrics["rankCorrelation"] == pytest.approx(-1.0)
    assert verdict.metrics["topKOverlap"] == 0.0
    assert set(verdict.metrics["failedChecks"]) == {"topKOverlap", "rankCorrelation", "tolerance"}
    assert "-1.000" in verdict.summary and "0.000" in verdict.summary


def test_monotone_rescale_keeps_ranking_but_breaks_tight_tolerance():
    # What INT8 may do: scores move, ranking stays.
    ref = _scores(3)
    cand = [{"scores": r["scores"] * 1.5 + 0.2} for r in ref]
    tight = compare(_samples(3), ref, cand, "scores", CRITERIA)
    assert tight.reason == "ScoresOutOfTolerance" and tight.metrics["failedChecks"] == ["tolerance"]
    assert tight.metrics["rankCorrelation"] == pytest.approx(1.0)
    assert tight.metrics["outOfTolerance"] > 0
    loose = compare(_samples(3), ref, cand, "scores",
                    Criteria(abs_tolerance=10, rel_tolerance=0, top_k=5, min_topk_overlap=1, min_rank_correlation=1))
    assert loose.passed


def test_tolerance_combines_abs_and_rel():
    ref = [{"scores": np.array([[100.0, 1.0, 0.0]])}]
    cand = [{"scores": np.array([[100.5, 1.0, 0.0005]])}]   # 0.5 <= 1e-3 + 1e-2*100; 5e-4 <= 1e-3
    verdict = compare(_samples(1), ref, cand, "scores", CRITERIA)
    assert verdict.metrics["outOfTolerance"] == 0
    assert verdict.metrics["maxAbsError"] == pytest.approx(0.5)
    assert verdict.metrics["maxRelError"] > 1.0        # relative error at a zero reference is large, finite
    json.loads(verdict.to_json())


def test_spearman_method_is_reported():
    ref = _scores(2)
    criteria = Criteria(1e-3, 1e-2, 5, 0.95, 0.9, method="spearman")
    verdict = compare(_samples(2), ref, ref, "scores", criteria)
    assert verdict.metrics["rankCorrelationMethod"] == "spearman" and verdict.passed


def test_worst_requests_are_the_least_correlated():
    ref = _scores(6)
    cand = [dict(r) for r in ref]
    cand[4] = {"scores": -ref[4]["scores"]}
    verdict = compare(_samples(6), ref, cand, "scores", CRITERIA)
    worst = verdict.metrics["worstRequests"]
    assert len(worst) == 3 and worst[0]["sample"] == 5 and worst[1]["sample"] == 5
    assert worst[0]["rankCorrelation"] == pytest.approx(-1.0)


def test_many_requests_keep_the_verdict_small():
    ref = _scores(300)
    cand = [{"scores": r["scores"] + np.float32(0.01)} for r in ref]
    verdict = compare(_samples(300), ref, cand, "scores", CRITERIA)
    assert len(verdict.to_json().encode()) < VERDICT_MAX_BYTES


def test_nan_scores_fail_the_candidate():
    ref = _scores(2)
    cand = [dict(r) for r in ref]
    cand[1] = {"scores": ref[1]["scores"].copy()}
    cand[1]["scores"][0, 3] = np.nan
    verdict = compare(_samples(2), ref, cand, "scores", CRITERIA)
    assert verdict.outcome == "fail" and verdict.reason == "NonFiniteOutputs"
    assert verdict.metrics == {"nonFinite": 1, "sample": 2, "output": "scores"}


def test_nan_in_the_reference_cannot_be_judged():
    ref = [{"scores": np.array([[np.inf, 1.0]])}]
    verdict = compare(_samples(1), ref, [{"scores": np.array([[1.0, 2.0]])}], "scores", CRITERIA)
    assert verdict.outcome == "error" and verdict.reason == "ReferenceNonFinite"


def test_shape_mismatch_and_missing_output():
    ref = _scores(1)
    shape = compare(_samples(1), ref, [{"scores": np.zeros((2, 19))}], "scores", CRITERIA)
    assert shape.reason == "OutputShapeMismatch" and shape.outcome == "fail"
    missing = compare(_samples(1), ref, [{"logits": np.zeros((2, 20))}], "scores", CRITERIA)
    assert missing.reason == "OutputMissing" and missing.outcome == "fail"


def test_other_outputs_get_their_own_errors():
    ref = [{"scores": np.array([[1.0, 2.0]]), "aux": np.array([[0.0]])}]
    cand = [{"scores": np.array([[1.0, 2.0]]), "aux": np.array([[0.25]])}]
    verdict = compare(_samples(1), ref, cand, "scores", CRITERIA)
    assert verdict.metrics["outputs"]["aux"]["maxAbsError"] == 0.25
    assert verdict.reason == "ScoresOutOfTolerance"


@pytest.mark.parametrize("criteria, message", [
    (Criteria(-1, 0, 5, 0.9, 0.9), "--abs-tolerance"),
    (Criteria(0, 0, 0, 0.9, 0.9), "--top-k"),
    (Criteria(0, 0, 5, 1.5, 0.9), "--min-topk-overlap"),
    (Criteria(0, 0, 5, 0.9, 2), "--min-rank-correlation"),
    (Criteria(0, 0, 5, 0.9, 0.9, method="pearson"), "--rank-correlation-method"),
])
def test_bad_criteria(criteria, message):
    assert message in criteria.problem()
