from pathlib import Path

import pytest

from rankops.planner import LatencyProfile, PlanInputs

FIXTURES = Path(__file__).parent / "fixtures"

# The issue's example profile: compute ms per batch size on the target GPU.
ISSUE_PROFILE = {1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}


def _make_inputs(profile=None, p99=10.0, qps=2000.0, **kw) -> PlanInputs:
    return PlanInputs(profile=LatencyProfile.from_mapping(profile or ISSUE_PROFILE),
                      p99_budget_ms=p99, target_qps=qps, **kw)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def make_inputs():
    """PlanInputs from a profile (default: the issue's), a P99 budget and a target QPS."""
    return _make_inputs
