"""Latency-budget planner: from a measured latency profile, a P99 budget and a target QPS to
Triton's batching config, instances per GPU and the GPU count, with the arithmetic shown.

    inputs = inputs_from_spec(spec)           # a RankingModelSpec (duck-typed)
    result = plan(inputs)                     # batching: auto  (raises PlanError)
    result = evaluate(inputs)                 # explicit batching (problems listed, never raises)
    result = with_queue_policy(spec, result)  # slo.overload: Triton's queue policy (OverloadError)
    status["plan"] = result.to_status()
"""
from rankops.planner.inputs import PlanError, PlanInputs, inputs_from_spec
from rankops.planner.memory import MemoryNeeds
from rankops.planner.overload import OverloadError, QueuePolicy, queue_policy, with_queue_policy
from rankops.planner.profile import LatencyProfile, ProfileError
from rankops.planner.result import PlanResult
from rankops.planner.search import evaluate, plan, sustainable_qps
from rankops.planner.simulator import BatcherConfig, SimResult, simulate

__all__ = [
    "BatcherConfig", "LatencyProfile", "MemoryNeeds", "PlanError", "PlanInputs", "PlanResult",
    "ProfileError", "SimResult", "evaluate", "inputs_from_spec", "plan", "simulate", "sustainable_qps",
    "OverloadError", "QueuePolicy", "queue_policy", "with_queue_policy",
]
