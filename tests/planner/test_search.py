"""The search against hand-computed cases and the seeds' worked example."""
import math
from types import SimpleNamespace

import pytest

from rankops.api.planning import PlanStatus
from rankops.planner import search
from rankops.planner import BatcherConfig, PlanError, evaluate, inputs_from_spec, plan
from rankops.planner.search import SATURATION_MARGIN, candidates, sustainable_qps
from rankops.planner.simulator import saturation_qps


def test_seeds_worked_example(make_inputs):
    """Seeds: batch 8 in ~3 ms -> 1000/3*8 ~ 2666 req/s per instance; x0.7 for queueing and
    overhead -> ~1800-2000 req/s per GPU; 2000 QPS peak with >= 50% headroom -> 2 GPUs.
    One request alone costs ~2 ms (batch 8 costs ~30-50% more)."""
    inputs = make_inputs({1: 2.0, 8: 3.0}, p99=10, qps=2000, headroom=0.5, instances_per_gpu=1)
    assert saturation_qps(inputs.profile, BatcherConfig(8)) == pytest.approx(1000 / 3 * 8)
    result = plan(inputs)
    assert result.max_batch_size == 8
    assert result.gpus == 2
    # the simulation is less pessimistic than the seeds' blanket x0.7: queueing within a 10 ms
    # P99 costs ~10%, and 5% is kept off saturation
    assert 0.7 * 2666 < result.qps_per_gpu <= SATURATION_MARGIN * 2667
    assert result.qps_per_gpu * (1 - 0.5) * 2 >= 2000
    # each GPU then carries 1000 req/s, well inside the budget
    assert result.predicted_p99_ms < 10
    assert any("ceil(2000 req/s" in line and "= 2" in line for line in result.explanation)


def test_seeds_blanket_factor_would_need_three_gpus_at_exactly_half_headroom():
    # what the seeds' 0.7 factor implies if 50% headroom is taken literally
    assert math.ceil(2000 / (0.7 * 2666 * 0.5)) == 3


def test_loose_budget_sustains_the_saturation_margin_and_sizes_the_fleet_by_hand(make_inputs):
    # one batch size, 1 ms: saturation 1000 req/s; a 1 s budget never binds: the ceiling is the
    # rate that 10% more load (search.LOAD_MARGIN) would take to saturation, 909 req/s
    ceiling = 1000 / (1 + search.LOAD_MARGIN)
    for headroom, gpus in ((0.0, 3), (0.5, 5)):
        result = plan(make_inputs({1: 1.0}, p99=1000, qps=1900, headroom=headroom, instances_per_gpu=1,
                                  failure_tolerance=0))
        assert result.qps_per_gpu == pytest.approx(ceiling)
        assert result.gpus == gpus == math.ceil(1900 / (ceiling * (1 - headroom)))
    # by default one replica may be lost: ceil(1900 / 909) = 3 must survive it
    assert plan(make_inputs({1: 1.0}, p99=1000, qps=1900, headroom=0.0, instances_per_gpu=1)).gpus == 4


def test_seeds_example_survives_a_single_card_failure_by_default(make_inputs):
    """Seeds: 2,000 QPS peak, P99 50 ms, batch 8 in ~3 ms; headroom for "spikes and a single-card
    failure": 2 GPUs, not 1, even where one GPU alone could carry the peak."""
    inputs = make_inputs({1: 2.0, 8: 3.0}, p99=50, qps=2000, headroom=0.0)
    result = plan(inputs)
    assert result.qps_per_gpu >= 2000, "one GPU could carry the peak"
    assert result.gpus == 2
    assert any("failure tolerance 1" in line and "at least 2 replica(s)" in line for line in result.explanation)
    assert plan(make_inputs({1: 2.0, 8: 3.0}, p99=50, qps=2000, headroom=0.0, failure_tolerance=0)).gpus == 1
    assert plan(make_inputs({1: 2.0, 8: 3.0}, p99=50, qps=2000, headroom=0.0, failure_tolerance=2)).gpus == 3
    # the default headroom already gives 2 here; tolerance does not add a third
    assert plan(make_inputs({1: 2.0, 8: 3.0}, p99=50, qps=2000)).gpus == 2


def test_explicit_replicas_that_cannot_survive_a_loss_are_a_problem(make_inputs):
    result = plan(make_inputs({1: 2.0, 8: 3.0}, p99=50, qps=2000, headroom=0.0, replicas=1))
    assert any("failure tolerance: with 1 of 1 replica(s) lost" in p and "set replicas to 2" in p
               for p in result.problems)
    assert not plan(make_inputs({1: 2.0, 8: 3.0}, p99=50, qps=2000, headroom=0.0, replicas=1,
                                failure_tolerance=0)).problems


def test_gpus_per_replica_rounds_replicas_up(make_inputs):
    result = plan(make_inputs({1: 1.0}, p99=1000, qps=1900, headroom=0.5, instances_per_gpu=1,
                              gpus_per_replica=3))
    assert (result.replicas, result.gpus) == (2, 6)


def test_search_prefers_batching_under_load_and_stays_in_budget(make_inputs):
    inputs = make_inputs(p99=10, qps=2000)
    result = plan(inputs)
    assert result.max_batch_size > 1                      # batch 1 saturates at 500 req/s
    assert result.qps_per_gpu > 1000 / 2.0
    assert sustainable_qps(inputs, result.config, verify=True) == pytest.approx(result.qps_per_gpu, rel=0.03)
    # the best is at least as good as a few hand-picked configs
    for config in (BatcherConfig(8), BatcherConfig(4, (), 500), BatcherConfig(16, (), 1000, 2)):
        assert result.qps_per_gpu >= sustainable_qps(inputs, config) * 0.99
    for point in result.table:
        if point.per_gpu_qps <= result.qps_per_gpu:
            assert point.p99_ms <= 10


def test_tighter_budget_lowers_sustainable_qps(make_inputs):
    loose = plan(make_inputs(p99=20)).qps_per_gpu
    tight = plan(make_inputs(p99=6)).qps_per_gpu
    assert tight < loose


def test_candidates_leave_out_configs_that_cannot_fit_the_budget(make_inputs):
    inputs = make_inputs(p99=4.0)
    for config in candidates(inputs):
        assert inputs.profile.compute_ms(config.max_batch_size) + config.max_queue_delay_us / 1000 < 4.0
    assert all(c.max_batch_size <= 8 for c in candidates(inputs))   # 16 takes 4.6 ms


def test_budget_below_one_request_is_refused_with_numbers(make_inputs):
    with pytest.raises(PlanError, match=r"one request alone takes 2 ms compute \+ 0.5 ms overhead = 2.5 ms"):
        plan(make_inputs(p99=2.5, overhead_ms=0.5))


def test_explicit_replicas_too_few_is_a_problem(make_inputs):
    result = plan(make_inputs(qps=9000, replicas=1))
    assert result.replicas == 1 and result.gpus == 1
    assert any(p.startswith("capacity:") and "set replicas to" in p for p in result.problems)
    assert any(p.startswith("SLO:") for p in result.problems)


def test_evaluate_predicts_an_slo_miss_without_raising(make_inputs):
    # a 2 ms queue delay with 4 instances time-slicing on a 5 ms budget
    inputs = make_inputs(p99=5, qps=4000, replicas=1, batching=BatcherConfig(16, (), 2000, 4))
    result = evaluate(inputs)
    assert result.mode == "explicit"
    assert any("exceeds slo.p99LatencyMs 5" in p for p in result.problems)
    assert result.predicted_p99_ms > 5


def test_evaluate_good_explicit_config_has_no_problems(make_inputs):
    result = evaluate(make_inputs(qps=1000, batching=BatcherConfig(16, (), 500, 1)))
    assert result.problems == []
    assert result.gpus >= 1 and result.predicted_p99_ms < 10


def test_evaluate_without_slo_still_predicts(make_inputs):
    inputs = make_inputs(batching=BatcherConfig(8), p99=None, qps=None)
    result = evaluate(inputs)
    assert result.problems == [] and result.predicted_p50_ms > 0


def test_plan_is_memoised(make_inputs):
    inputs = make_inputs(p99=12)
    assert plan(inputs) is plan(inputs)


def test_status_and_json_shapes(make_inputs):
    result = plan(make_inputs())
    status = result.to_status()
    PlanStatus.model_validate(status)                     # the CRD's status schema describes it
    assert len(str(status)) < 1500
    data = result.to_json()
    for key in ("maxBatchSize", "preferredBatchSizes", "maxQueueDelayMicroseconds", "instancesPerGpu",
                "gpus", "predictedP99Ms", "qpsPerGpu"):
        assert key in data
    assert data["explanation"] and len(data["table"]) == 5


def _spec(**overrides):
    spec = dict(
        slo=SimpleNamespace(p99_latency_ms=10, target_qps=2000),
        planning=SimpleNamespace(headroom=0.5, gpu_memory_mib=None, latency_profile={"1": 2.0, "8": 3.0},
                                 latency_profile_config_map=None, memory=None, overhead_ms=0.0,
                                 shared_gpu_slowdown=0.75, max_instances_per_gpu=4),
        batching="auto", gpus_per_replica=1, instances_per_gpu=None, replicas=None,
    )
    spec.update(overrides)
    return SimpleNamespace(**spec)


def test_inputs_from_a_duck_typed_spec():
    inputs = inputs_from_spec(_spec())
    assert inputs.auto and inputs.profile.as_dict() == {1: 2.0, 8: 3.0}
    assert (inputs.p99_budget_ms, inputs.target_qps, inputs.instances_per_gpu) == (10, 2000, None)
    explicit = inputs_from_spec(_spec(batching=SimpleNamespace(
        max_batch_size=16, preferred_batch_sizes=[8, 4], max_queue_delay_microseconds=750), instances_per_gpu=2))
    assert explicit.batching == BatcherConfig(16, (4, 8), 750, 2)


def test_inputs_need_a_profile_and_an_slo():
    with pytest.raises(PlanError, match="latencyProfile"):
        inputs_from_spec(_spec(planning=None))
    with pytest.raises(PlanError, match="spec.slo"):
        inputs_from_spec(_spec(slo=None))
    ref = SimpleNamespace(name="profiles", key="t4.csv")
    planning = SimpleNamespace(latency_profile=None, latency_profile_config_map=ref)
    with pytest.raises(PlanError, match="profiles/t4.csv"):
        inputs_from_spec(_spec(planning=planning))
    # the operator reads the ConfigMap and hands its text over
    assert inputs_from_spec(_spec(planning=planning), profile="1: 2.0\n8: 3.0\n").profile.max_batch == 8


def test_pool_gpu_memory_is_the_fallback():
    assert inputs_from_spec(_spec(), gpu_memory_mib=16384).gpu_memory_mib == 16384


def test_pydantic_spec_defaults_are_left_to_the_planner():
    from rankops.api import rankingmodel     # the project's own module: an import error fails the test
    doc = {
        "version": "1", "versions": [{"name": "1", "modelUri": "s3://b/m", "format": "onnx"}],
        "inputs": [{"name": "x", "dataType": "FP32", "dims": [8]}],
        "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
        "batching": "auto", "slo": {"p99LatencyMs": 10, "targetQps": 2000},
        "planning": {"latencyProfile": {"1": 2.0, "8": 3.0}},
    }
    spec = rankingmodel.RankingModelSpec.model_validate(doc)
    inputs = inputs_from_spec(spec)
    assert inputs.replicas is None and inputs.instances_per_gpu is None
    pinned = inputs_from_spec(rankingmodel.RankingModelSpec.model_validate({**doc, "replicas": 3}))
    assert pinned.replicas == 3
    # explicit batching runs with the spec's replicas, defaults included: evaluate those
    explicit = rankingmodel.RankingModelSpec.model_validate({**doc, "batching": {"maxBatchSize": 8}})
    assert inputs_from_spec(explicit).replicas == explicit.replicas
    assert inputs_from_spec(explicit).batching.instances == explicit.instances_per_gpu
