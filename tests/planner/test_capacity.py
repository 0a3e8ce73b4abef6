"""Issue 26, item 1: a sustainable rate that holds, runner-ups that meet the budget where quoted,
and a plan with no headroom and no failure tolerance that says so."""
import re

import numpy as np

from rankops.api.planning import PlanStatus
from rankops.planner import search
from rankops.commands.plan import render_text
from rankops.planner.profile import LatencyProfile
from rankops.planner.search import evaluate, meets_budget, plan, sustainable_qps, verified_qps
from rankops.planner.simulator import BatcherConfig, poisson_arrivals_ms, run_batcher, saturation_qps, simulate

# The stand-in of the real-Triton measurements: t(b) = 5 + 2·b ms, instances sharing one GPU.
STAND_IN = {1: 7.0, 2: 9.0, 4: 13.0, 8: 21.0, 16: 37.0, 32: 69.0}


def _takes_all_queued(t, cost, big, instances):
    """A reference batcher written per request: when an instance frees up it takes every request
    queued by then, up to `big` (Triton's dynamic batcher with no queue delay, no preferred sizes)."""
    free, i, sizes = [t[0]] * instances, 0, []
    while i < len(t):
        k = int(np.argmin(free))
        start = max(free[k], t[i])
        j = i
        while j < len(t) and t[j] <= start and j - i < big:
            j += 1
        sizes.append(j - i)
        free[k] = start + cost[j - i]
        i = j
    return sizes


def test_near_saturation_the_batches_are_those_of_a_batcher_that_takes_all_queued():
    profile = LatencyProfile.from_mapping(STAND_IN)
    for config in (BatcherConfig(16, (), 0, 1), BatcherConfig(8, (), 0, 3)):
        cost = profile.table(config.max_batch_size)
        rate = 0.9 * saturation_qps(profile, config, slowdown=0.0)
        t = poisson_arrivals_ms(rate, 3000).tolist()
        _, _, sizes = run_batcher(t, cost, config, slowdown=0.0)
        assert sizes == _takes_all_queued(t, cost, config.max_batch_size, config.instances)
        assert np.mean(sizes) > config.max_batch_size / 2       # near saturation the batches fill up


def test_a_queue_that_builds_up_behind_a_busy_instance_leaves_in_one_batch():
    profile = LatencyProfile.from_mapping(STAND_IN)
    config = BatcherConfig(16, (), 0, 1)
    # one request at 0 runs alone (7 ms); the nine that came meanwhile go together, then the rest
    starts, ends, sizes = run_batcher([0.0, *np.arange(0.5, 5.0, 0.5)], profile.table(16), config, 0.0)
    assert sizes == [1, 9] and ends[0] == 7.0 and starts[1] == 7.0 and ends[1] == 7.0 + 23.0


def test_the_sustainable_rate_meets_the_budget_in_a_long_run_with_margin(make_inputs):
    for budget in (150.0, 50.0):
        inputs = make_inputs(STAND_IN, p99=budget, qps=300, headroom=0.0, failure_tolerance=0,
                             shared_gpu_slowdown=0.5, overhead_ms=1.0)
        result = plan(inputs)
        rate, config = result.qps_per_gpu, result.config
        # a long run on another arrival trace than the search's, at the rate and 5% above it
        for load in (rate, rate * (1 + search.LOAD_MARGIN)):
            long = simulate(inputs.profile, config, rate_qps=load, requests=search.VERIFY_REQUESTS, seed=7,
                            slowdown=0.5, overhead_ms=1.0)
            assert long.p99_ms <= budget, (budget, config, load, long.p99_ms)
        assert meets_budget(inputs, config, rate, search.VERIFY_REQUESTS)
        assert rate < saturation_qps(inputs.profile, config, 0.5)


def test_a_long_run_lowers_a_rate_that_short_runs_let_through(make_inputs):
    inputs = make_inputs(STAND_IN, p99=150, qps=300, shared_gpu_slowdown=0.5)
    config = BatcherConfig(16, (), 0, 4)
    near_saturation = 0.95 * saturation_qps(inputs.profile, config, 0.5)
    verified = verified_qps(inputs, config, near_saturation)
    assert 0 < verified < near_saturation
    assert meets_budget(inputs, config, verified, search.VERIFY_REQUESTS)
    assert sustainable_qps(inputs, config, verify=True) <= sustainable_qps(inputs, config) + 1e-9


def test_no_headroom_and_no_failure_tolerance_is_a_warning_not_a_problem(make_inputs):
    bare = plan(make_inputs(STAND_IN, p99=150, qps=300, headroom=0.0, failure_tolerance=0,
                            shared_gpu_slowdown=0.5))
    assert len(bare.warnings) == 1 and "no headroom and no failure tolerance" in bare.warnings[0]
    assert not bare.problems                                   # it meets the SLO: not Degraded
    status = bare.to_status()
    assert status["warnings"] == bare.warnings
    PlanStatus.model_validate(status)
    assert "Warnings:" in render_text(bare) and "Problems:" not in render_text(bare)
    # either protection is enough to drop it; explicit batching says it too
    for kw in ({"headroom": 0.2, "failure_tolerance": 0}, {"headroom": 0.0, "failure_tolerance": 1}):
        assert not plan(make_inputs(STAND_IN, p99=150, qps=300, shared_gpu_slowdown=0.5, **kw)).warnings
    explicit = evaluate(make_inputs(STAND_IN, p99=150, qps=300, headroom=0.0, failure_tolerance=0,
                                    batching=BatcherConfig(8), shared_gpu_slowdown=0.5))
    assert explicit.warnings and PlanStatus.model_validate(explicit.to_status()).warnings == explicit.warnings


def test_runner_ups_meet_the_budget_at_the_rate_quoted_for_them(make_inputs):
    inputs = make_inputs(STAND_IN, p99=120, qps=400, headroom=0.0, failure_tolerance=0, shared_gpu_slowdown=0.5)
    result = plan(inputs)
    lines = [line for line in result.explanation if line.startswith("runner-up:")]
    assert result.runners_up and len(lines) == len(result.runners_up)
    for config, line in zip(result.runners_up, lines):
        assert config.describe() in line
        quoted = float(re.search(r"sustains (\d+) req/s", line).group(1))
        assert quoted <= result.qps_per_gpu + 0.5
        long = simulate(inputs.profile, config, rate_qps=quoted, requests=search.VERIFY_REQUESTS,
                        slowdown=0.5)
        assert long.p99_ms <= 120
        assert (config.max_batch_size, config.instances) != (result.max_batch_size, result.instances_per_gpu)
