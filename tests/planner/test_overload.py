"""slo.overload: Triton's queue policy derived from the P99 budget and the plan (pure, no simulation:
the plans here are built from known numbers, so each derived figure is checked against its arithmetic)."""
from __future__ import annotations

import math

import pytest

from rankops.api.rankingmodel import RankingModel
from rankops.planner import LatencyProfile, PlanInputs, PlanResult
from rankops.planner.overload import MARGIN_FRACTION, QUEUE_LOAD, OverloadError, QueuePolicy, queue_policy
from rankops.planner.result import LoadPoint

PROFILE = {1: 2.0, 4: 2.4, 8: 3.0, 16: 4.6, 32: 8.0}


def spec(slo: dict | None = None, batching=None, planning: dict | None = None, **extra):
    """A RankingModelSpec: explicit batching and a profile unless told otherwise."""
    body = {
        "version": "1", "versions": [{"name": "1", "modelUri": "s3://m/1", "format": "onnx"}],
        "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
        "batching": batching or {"maxBatchSize": 32, "maxQueueDelayMicroseconds": 0},
        "slo": {"p99LatencyMs": 20, "targetQps": 2000, **(slo or {})},
        "planning": {"latencyProfile": PROFILE, **(planning or {})} if planning is not False else None,
        **extra,
    }
    if body["planning"] is None:
        del body["planning"]
    return RankingModel.model_validate({"metadata": {"name": "m", "namespace": "ns"}, "spec": body}).spec


def plan(max_batch=32, instances=1, per_gpu=3000.0, avg_batch=12.5, overhead_ms=1.0, gpus_per_replica=1,
         slowdown=0.75, delay_us=0, preferred=()) -> PlanResult:
    """A PlanResult whose capacity row is known: `per_gpu` req/s sustainable at `avg_batch`."""
    inputs = PlanInputs(profile=LatencyProfile.from_mapping(PROFILE), p99_budget_ms=20.0, target_qps=2000.0,
                        overhead_ms=overhead_ms, gpus_per_replica=gpus_per_replica, shared_gpu_slowdown=slowdown)
    table = [LoadPoint(per_gpu * f, 3.0, 5.0, avg_batch * f, f) for f in (0.25, 0.5, 1.0)]
    return PlanResult(mode="auto", max_batch_size=max_batch, preferred_batch_sizes=list(preferred),
                      max_queue_delay_microseconds=delay_us, instances_per_gpu=instances, replicas=2, gpus=2,
                      predicted_p50_ms=3.0, predicted_p99_ms=6.0, qps_per_gpu=per_gpu, avg_batch_size=avg_batch / 2,
                      gpu_busy_fraction=0.5, memory_mib=None, problems=[], explanation=["x"], inputs=inputs,
                      table=table)


def shed(**queue_policy_fields) -> dict:
    return {"overload": "shed", **({"queuePolicy": queue_policy_fields} if queue_policy_fields else {})}


def test_queue_is_the_default_and_renders_no_policy():
    assert spec().slo.overload.value == "queue"
    assert queue_policy(spec(), plan()) is None
    assert queue_policy(spec(slo={}, planning={"overheadMs": 1}), None) is None


def test_shed_timeout_is_what_the_budget_leaves_after_overhead_a_full_batch_and_the_margin():
    policy = queue_policy(spec(slo=shed(), planning={"overheadMs": 1}), plan())
    # 20 ms budget - 1 ms overhead - compute(32) 8 ms - 10% of 20 ms = 9 ms
    assert policy.shed and policy.timeout_action == "REJECT"
    assert policy.timeout_us == round((20 - 1 - 8.0 - MARGIN_FRACTION * 20) * 1000) == 9000
    # backstop: QUEUE_LOAD x 3000 req/s x 9 ms = 324 (above maxBatchSize 32)
    assert policy.max_queue_size == math.ceil(QUEUE_LOAD * 3000 * 0.009) == 324
    assert policy.allow_timeout_override is True
    text = "\n".join(policy.explanation)
    assert "P99 budget 20 ms - overhead 1 ms (planning.overheadMs) - compute 8.00 ms - margin 2 ms" in text
    assert "a full batch of 32" in text and "average is 12.5" in text, "the batch and why it is not the average"
    assert f"ceil({QUEUE_LOAD} x 3000 req/s per replica x 9 ms)" in text
    assert policy.warnings == ()


def test_instances_sharing_the_gpu_slow_the_batch_a_request_waits_for():
    policy = queue_policy(spec(slo=shed()), plan(instances=2, slowdown=0.5, overhead_ms=0))
    # compute(32) = 8 ms x (1 + 0.5 x 1) = 12 ms: 20 - 0 - 12 - 2 = 6 ms
    assert policy.timeout_us == 6000
    assert "x (1 + 0.5 x 1) with 2 instances sharing the GPU" in "\n".join(policy.explanation)


def test_a_replica_of_several_gpus_drains_more_and_the_backstop_never_falls_below_a_full_batch():
    wide = queue_policy(spec(slo=shed()), plan(gpus_per_replica=2))
    narrow = queue_policy(spec(slo=shed()), plan())
    assert wide.timeout_us == narrow.timeout_us and wide.max_queue_size == math.ceil(QUEUE_LOAD * 6000 * 0.009)
    slow = queue_policy(spec(slo=shed()), plan(per_gpu=100.0))
    assert slow.max_queue_size == 32, "12 x 100 req/s x 9 ms = 10.8 requests: a full batch is the floor"


def test_a_budget_smaller_than_one_batch_is_refused_with_the_arithmetic():
    tight = spec(slo={"p99LatencyMs": 10, **shed()}, batching={"maxBatchSize": 16, "maxQueueDelayMicroseconds": 0},
                 planning={"overheadMs": 5})
    with pytest.raises(OverloadError) as refused:
        queue_policy(tight, plan(max_batch=16, overhead_ms=5))
    message = str(refused.value)
    # 10 - 5 - 4.6 (compute of 16) - 1 = -0.6 ms
    assert "P99 budget 10 ms - overhead 5 ms (planning.overheadMs) - compute 4.60 ms - margin 1 ms" in message
    assert "= -0.60 ms" in message and "a full batch of 16" in message
    assert "raise slo.p99LatencyMs" in message and "slo.queuePolicy.timeoutMicroseconds" in message


def test_given_values_win_and_are_checked():
    given = spec(slo=shed(timeoutMicroseconds=25000, maxQueueSize=8, allowTimeoutOverride=False))
    policy = queue_policy(given, plan())
    assert (policy.timeout_us, policy.max_queue_size, policy.allow_timeout_override) == (25000, 8, False)
    text = "\n".join(policy.explanation)
    assert "timeout 25000 us (slo.queuePolicy.timeoutMicroseconds; derived: P99 budget 20 ms" in text
    assert "maxQueueSize 8 (slo.queuePolicy.maxQueueSize)" in text
    assert "allowTimeoutOverride false (slo.queuePolicy.allowTimeoutOverride)" in text
    longer, smaller = policy.warnings
    assert "timeoutMicroseconds 25000 is longer than slo.p99LatencyMs 20 ms" in longer
    assert "requests that wait this long already missed the budget" in longer
    assert "maxQueueSize 8 is below maxBatchSize 32" in smaller and "counts such rejections in no metric" in smaller


def test_one_given_field_keeps_the_others_derived():
    policy = queue_policy(spec(slo=shed(timeoutMicroseconds=5000)), plan())
    assert policy.timeout_us == 5000 and policy.warnings == ()
    assert policy.max_queue_size == math.ceil(QUEUE_LOAD * 3000 * 0.005), "the backstop follows the timeout served"
    policy = queue_policy(spec(slo=shed(maxQueueSize=0)), plan())
    assert policy.timeout_us == 9000 and policy.max_queue_size == 0


def test_a_given_timeout_is_served_where_the_budget_leaves_none_and_the_refusal_is_said():
    tight = spec(slo={"p99LatencyMs": 10, **shed(timeoutMicroseconds=2000)})
    policy = queue_policy(tight, plan(overhead_ms=5))
    assert policy.timeout_us == 2000
    assert "(no time to queue)" in policy.explanation[0]


def test_shed_without_a_timeout_or_a_profile_is_refused_naming_both_fixes():
    no_profile = spec(slo=shed(), planning=False)
    with pytest.raises(OverloadError) as refused:
        queue_policy(no_profile, None)
    assert "slo.queuePolicy.timeoutMicroseconds" in str(refused.value)
    assert "planning.latencyProfile" in str(refused.value)
    given = queue_policy(spec(slo=shed(timeoutMicroseconds=4000), planning=False), None)
    assert (given.shed, given.timeout_us, given.max_queue_size) == (True, 4000, 0)
    assert "no latency profile to size a backstop from" in "\n".join(given.explanation)


def test_max_batch_size_one_waits_for_one_request():
    policy = queue_policy(spec(slo=shed(), batching={"maxBatchSize": 1}), plan(max_batch=1, avg_batch=1.0))
    # 20 - 1 - compute(1) 2 ms - 2 = 15 ms
    assert policy.timeout_us == 15000 and policy.max_queue_size == math.ceil(QUEUE_LOAD * 3000 * 0.015)


def test_a_timeout_shorter_than_the_batching_delay_is_a_warning():
    policy = queue_policy(spec(slo=shed(timeoutMicroseconds=500), batching={"maxBatchSize": 32}), None)
    assert any("shorter than max_queue_delay_microseconds 1000" in w for w in policy.warnings)


def test_shed_with_a_zero_timeout_sheds_nothing_for_lateness_and_says_so():
    policy = queue_policy(spec(slo=shed(timeoutMicroseconds=0)), plan())
    assert policy.timeout_us == 0 and any("no request is shed for being late" in w for w in policy.warnings)


def test_queue_with_a_given_policy_delays_late_requests_instead_of_rejecting_them():
    policy = queue_policy(spec(slo={"queuePolicy": {"timeoutMicroseconds": 30000, "maxQueueSize": 500}}), plan())
    assert not policy.shed and policy.timeout_action == "DELAY"
    assert (policy.timeout_us, policy.max_queue_size) == (30000, 500)
    assert "waits behind those still on time (DELAY)" in policy.explanation[0]
    assert any("already missed the budget" in w for w in policy.warnings)


def test_the_status_records_the_policy_and_gives_it_back():
    from rankops.api.planning import QueuePolicyStatus

    policy = queue_policy(spec(slo=shed(), planning={"overheadMs": 1}), plan())
    status = QueuePolicyStatus.model_validate(policy.to_status())
    assert status.timeout_microseconds == 9000 and status.shed
    back = QueuePolicy.from_status(status)
    assert back == QueuePolicy(policy.shed, policy.timeout_us, policy.max_queue_size, policy.allow_timeout_override,
                               policy.explanation)
    assert QueuePolicy.from_status(None) is None


@pytest.mark.parametrize("field,value", [("timeoutMicroseconds", -1), ("maxQueueSize", -1),
                                         ("timeoutMicroseconds", 60_000_001), ("unknown", 1)])
def test_a_bad_queue_policy_is_an_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        spec(slo=shed(**{field: value}))


def test_an_unknown_overload_word_is_an_error():
    with pytest.raises(ValueError, match="overload"):
        spec(slo={"overload": "drop"})
