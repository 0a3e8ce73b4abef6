"""The pure parts of benchmarks/correction_bench.py: what the planner is told, and the spec."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import correction_bench as bench  # noqa: E402


def test_the_profile_given_is_the_truth_divided_by_the_slowdown():
    assert bench.profile_given(1.3)[8] == round(60.0 / 1.3, 3)
    assert bench.profile_given(0.7)[1] == round(25.0 / 0.7, 3)


def test_the_spec_is_a_valid_autoscaled_plan_with_the_switch():
    from rankops.api.rankingmodel import RankingModelSpec

    on = RankingModelSpec.model_validate(bench.spec_for(1.3, True))
    off = RankingModelSpec.model_validate(bench.spec_for(1.3, False))
    assert on.autoscaling.correct_capacity and not off.autoscaling.correct_capacity
    assert on.autoscaling.by_rankops and on.slo.p99_latency_ms == bench.BUDGET_MS


def test_settled_takes_the_last_readings_worst_p99():
    rows = [bench.Reading(1.3, True, i, 10.0, 3, p99, None, 0.7, 1.4, 3, "WithinTarget")
            for i, p99 in enumerate([500.0, 90.0, 120.0])]
    assert bench.settled(rows) == (3, 120.0, 0.7)
