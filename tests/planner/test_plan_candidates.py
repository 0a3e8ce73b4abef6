"""Requests that carry several candidates (spec.candidates layout batch): a request is a batch of
its candidates, so the planner counts requests in its rates and candidates in its batch sizes."""
import random
from types import SimpleNamespace

import pytest

from rankops.api.rankingmodel import RankingModel
from rankops.planner import BatcherConfig, PlanError, inputs_from_spec, plan
from rankops.planner.profile import LatencyProfile
from rankops.planner.search import candidates
from rankops.planner.simulator import run_batcher, run_batcher_items, saturation_qps, simulate

# compute ms per batch of candidates, roughly a ranking model on a GPU: 1.5 ms + 4 us per candidate
PROFILE = LatencyProfile.from_mapping({1: 1.5, 128: 2.0, 512: 3.5, 1024: 5.6, 2048: 9.7})


def _items(config, arrivals, weights, slowdown=0.75):
    return run_batcher_items(arrivals, tuple(weights), PROFILE.table(config.max_batch_size), config, slowdown)


@pytest.mark.parametrize("config", [BatcherConfig(8), BatcherConfig(8, (), 1000), BatcherConfig(5, (), 300, 2),
                                    BatcherConfig(16, (), 2000, 3)])
def test_one_item_per_request_batches_as_the_plain_batcher(config):
    rng = random.Random(4)
    arrivals = sorted(rng.uniform(0, 200) for _ in range(600))
    cost = PROFILE.table(config.max_batch_size)
    starts, ends, sizes = run_batcher(arrivals, cost, config, 0.75)
    starts2, ends2, counts, items = run_batcher_items(arrivals, (1,) * len(arrivals), cost, config, 0.75)
    assert counts == items == sizes
    assert starts2 == pytest.approx(starts) and ends2 == pytest.approx(ends)


def test_a_request_that_does_not_fit_waits_for_the_next_batch():
    # three requests of 400 candidates at once, max 1000: two go together, the third next
    _, _, counts, items = _items(BatcherConfig(1000), [0.0, 0.0, 0.0], [400, 400, 400])
    assert counts == [2, 1] and items == [800, 400]


def test_preferred_size_is_an_exact_candidate_count_and_the_largest_is_a_cut():
    config = BatcherConfig(1024, (512,), 5000)
    # 200 + 312 = 512 exactly: sent at the second arrival, not after the 5 ms delay
    starts, _, counts, items = _items(config, [0.0, 0.1, 0.2], [200, 312, 100])
    assert (counts[0], items[0], starts[0]) == (2, 512, pytest.approx(0.1))
    # 300 + 300 would pass 512: the batch is cut before it, at once
    starts, _, counts, items = _items(config, [0.0, 0.1], [300, 300])
    assert (counts, items) == ([1, 1], [300, 300]) and starts[0] == pytest.approx(0.1)


def test_delay_holds_a_batch_that_can_still_grow():
    starts, _, counts, items = _items(BatcherConfig(1024, (), 1000), [0.0, 0.5, 3.0], [100, 100, 100])
    assert counts[:1] == [2] and items[0] == 200 and starts[0] == pytest.approx(1.0)


def test_overload_throughput_in_requests_reaches_the_bound_over_mean_candidates():
    config = BatcherConfig(1024, (), 0, 2)
    bound = saturation_qps(PROFILE, config, 0.5, (100, 500))
    assert bound == pytest.approx(2 * 1024 / 300 / (5.6 * 1.5) * 1000)
    sim = simulate(PROFILE, config, rate_qps=bound * 2, requests=20_000, slowdown=0.5, items=(100, 500))
    # packing wastes the tail of each batch (a request that does not fit waits), so a bit below
    assert 0.8 * bound <= sim.throughput_qps <= bound * 1.01
    assert 1024 - 500 <= sim.avg_batch_size <= 1024, "avg batch counts candidates"


def test_more_candidates_per_request_sustain_fewer_requests():
    config = BatcherConfig(1024, (), 500)
    light = simulate(PROFILE, config, rate_qps=800, items=(10, 50))
    heavy = simulate(PROFILE, config, rate_qps=800, items=(100, 500))
    assert heavy.p99_ms > light.p99_ms and heavy.avg_batch_size > light.avg_batch_size


def _inputs(items, p99=20.0, qps=3000.0, **kw):
    return inputs_from_spec(SimpleNamespace(
        slo=SimpleNamespace(p99_latency_ms=p99, target_qps=qps),
        planning=SimpleNamespace(latency_profile=PROFILE.as_dict(), headroom=0.5),
        batching="auto", candidates=SimpleNamespace(layout="batch", min_per_request=items[0],
                                                    max_per_request=items[1]), **kw))


def test_plan_holds_the_largest_request_and_counts_requests():
    inputs = _inputs((100, 500))
    assert inputs.items_per_request == (100, 500)
    assert all(c.max_batch_size >= 500 for c in candidates(inputs))
    result = plan(inputs)
    assert result.max_batch_size >= 500
    sat = saturation_qps(PROFILE, result.config, inputs.shared_gpu_slowdown, (100, 500))
    assert result.qps_per_gpu <= sat * 0.95 + 1e-6
    # the same SLO planned as one candidate per request would claim ~300x the requests
    single = plan(_inputs((1, 1)))
    assert single.qps_per_gpu > 50 * result.qps_per_gpu
    assert any("requests carry 100..500 candidates" in line for line in result.explanation)
    assert result.predicted_p99_ms <= 20


def test_a_budget_the_largest_request_cannot_meet_is_refused_naming_it():
    with pytest.raises(PlanError, match=r"largest request \(2048 candidates.*9.7 ms"):
        plan(_inputs((100, 2048), p99=9.0))


def test_padded_layout_is_one_item_per_request():
    inputs = inputs_from_spec(SimpleNamespace(
        slo=SimpleNamespace(p99_latency_ms=20, target_qps=3000),
        planning=SimpleNamespace(latency_profile={1: 2.0}), batching="auto",
        candidates=SimpleNamespace(layout="padded", min_per_request=1, max_per_request=500)))
    assert inputs.items_per_request is None


def test_rankingmodel_with_candidates_batch_may_ask_for_batching_auto():
    rm = RankingModel.model_validate({
        "apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel", "metadata": {"name": "ctr", "namespace": "ns"},
        "spec": {"version": "1", "versions": [{"name": "1", "modelUri": "s3://m/1", "format": "onnx"}],
                 "inputs": [{"name": "item", "dataType": "FP32", "dims": [32]}],
                 "outputs": [{"name": "score", "dataType": "FP32", "dims": [1]}],
                 "candidates": {"layout": "batch", "minPerRequest": 100, "maxPerRequest": 500},
                 "slo": {"p99LatencyMs": 20, "targetQps": 3000},
                 "planning": {"latencyProfile": PROFILE.as_dict()}, "batching": "auto"}})
    result = plan(inputs_from_spec(rm.spec))
    assert result.max_batch_size >= 500 and rm.spec.tensor_size_problems(result.max_batch_size) == []
