"""Triton's queue policy from the SLO: what a request may wait before it can no longer be on time.

With `slo.overload: shed` a request that has queued longer than the P99 budget leaves is rejected
(Triton answers 503 "Request timeout expired" and counts it as nv_inference_request_failure
{reason="REJECTED"}), so under a spike the requests that can still meet the budget are served
instead of every request arriving late. The derivation, each number with its arithmetic:

    timeout        = p99LatencyMs - planning.overheadMs - compute(full batch) - margin
    max_queue_size = max(maxBatchSize, ceil(QUEUE_LOAD x replica's sustainable rate x timeout))

`slo.queuePolicy` values win and are checked. Pure: the spec is duck-typed (the CLI passes a
planning view), the plan is the PlanResult of plan() or evaluate().
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from rankops.planner.inputs import PlanError

# Part of the budget held back from the timeout. The compute time is the profile's figure for the
# batch the plan expects at capacity: real executions spread around it (a larger batch, a slower
# run, a request checked against its timeout just before an instance frees), and a request that
# passes the timeout check still has its whole execution ahead. 10% keeps those from turning an
# on-time request into a late answer without shedding much that could have made it.
MARGIN_FRACTION = 0.10
# max_queue_size is a memory backstop, never the shedder: Triton counts a request rejected for queue
# size in no metric (measured on 2.51: 15 rejected by size, failure{reason="REJECTED"} = 4, the
# timeouts), so the autoscaler and the canary analysis would not see it. Triton drops a timed-out
# request only when its batcher next looks at the queue, so under overload the queue holds more than
# λ x timeout: at 4x the sustainable rate x timeout, 37% of the sheds at 3x overload were by size
# (benchmarks/overload_bench.py: 4011 503s, 2532 counted); at 12x every shed at 2x and 3x was a
# counted timeout, and goodput rose (2x: 156 -> 162/s, 3x: 150 -> 171/s). Memory stays small:
# 12 x 1000 req/s x 20 ms = 240 requests.
QUEUE_LOAD = 12


class OverloadError(PlanError):
    """slo.overload shed cannot be served as asked: the message has the arithmetic and the fixes."""


@dataclass(frozen=True)
class QueuePolicy:
    """dynamic_batching.default_queue_policy of config.pbtxt, with where each number comes from."""
    shed: bool                       # REJECT a request queued past the timeout (else DELAY it)
    timeout_us: int                  # 0: no timeout
    max_queue_size: int              # 0: no limit
    allow_timeout_override: bool
    explanation: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def timeout_action(self) -> str:
        return "REJECT" if self.shed else "DELAY"

    def to_status(self) -> dict:
        """status.plan.queuePolicy (schema: rankops.api.planning.QueuePolicyStatus)."""
        return {"shed": self.shed, "timeoutMicroseconds": self.timeout_us, "maxQueueSize": self.max_queue_size,
                "allowTimeoutOverride": self.allow_timeout_override, "explanation": list(self.explanation)}

    @classmethod
    def from_status(cls, status: Any) -> QueuePolicy | None:
        """The policy a status.plan.queuePolicy (QueuePolicyStatus) records; None for none."""
        if status is None:
            return None
        return cls(bool(status.shed), int(status.timeout_microseconds), int(status.max_queue_size),
                   bool(status.allow_timeout_override), tuple(status.explanation or ()))


@dataclass(frozen=True)
class _Capacity:
    """What the plan says one replica does at its sustainable rate."""
    per_gpu_qps: float
    per_replica_qps: float
    avg_batch: float
    batch: int                       # the batch Triton forms there (avg rounded up)
    compute_ms: float                # that batch's execution, instances sharing the GPU
    line: str                        # the compute's arithmetic


def _value(obj: Any, name: str, default: Any = None) -> Any:
    value = getattr(obj, name, default) if obj is not None else default
    return default if value is None else value


def _overload(slo: Any) -> str:
    word = _value(slo, "overload", "queue")
    return str(getattr(word, "value", word))


def _max_batch(spec: Any, plan: Any) -> int | None:
    if plan is not None:
        return int(plan.max_batch_size)
    batching = _value(spec, "batching")
    size = getattr(batching, "max_batch_size", None)
    return int(size) if size is not None else None


def _queue_delay_us(spec: Any, plan: Any) -> int:
    if plan is not None:
        return int(plan.max_queue_delay_microseconds)
    return int(_value(_value(spec, "batching"), "max_queue_delay_microseconds", 0))


def _capacity(plan: Any) -> _Capacity | None:
    """What one replica does when requests queue long enough to be shed, from the plan: its
    sustainable rate (the last row of the plan's load table: the table runs up to that rate, or to
    the saturation bound when none holds the budget) and the execution a queued request waits for.

    The batch is maxBatchSize, not the average the plan expects at the sustainable rate: a request
    is shed only when the queue is long, and then Triton forms full batches. A request let through
    just before its timeout still runs such a batch, so the served P99 under overload is about
    timeout + compute(full batch) + overhead; sized on the average batch at capacity (smaller and
    faster) it would break the budget exactly when shedding is meant to hold it."""
    if plan is None or not plan.table:
        return None
    point = plan.table[-1]
    inputs = plan.inputs
    batch = plan.max_batch_size
    solo = inputs.profile.compute_ms(batch)
    n, slowdown = plan.instances_per_gpu, inputs.shared_gpu_slowdown
    # Under overload every instance runs: each execution is slowed as the simulator slows it.
    shared = solo * (1 + slowdown * (n - 1))
    items = " candidates" if inputs.items_per_request else ""
    per_gpu = plan.qps_per_gpu if plan.qps_per_gpu > 0 else point.per_gpu_qps
    line = (f"compute {shared:.2f} ms: a full batch of {batch}{items} (maxBatchSize: requests are shed only when "
            f"they queue, and then Triton forms full batches; at the sustainable {point.per_gpu_qps:.0f} req/s per "
            f"GPU the average is {point.avg_batch_size:.1f}) takes {solo:g} ms"
            + (f" x (1 + {slowdown:g} x {n - 1}) with {n} instances sharing the GPU" if n > 1 else ""))
    return _Capacity(per_gpu, per_gpu * inputs.gpus_per_replica, point.avg_batch_size, batch, shared, line)


def queue_policy(spec: Any, plan: Any = None) -> QueuePolicy | None:
    """The queue policy of `spec` (a RankingModelSpec) served as `plan` (a PlanResult, None when
    nothing was planned); None when overload is queue and no slo.queuePolicy is given.

    Raises OverloadError when overload is shed and no timeout can be had: the budget leaves no time
    to queue (the arithmetic), or there is neither a latency profile nor slo.queuePolicy.timeoutMicroseconds."""
    slo = _value(spec, "slo")
    if slo is None:
        return None
    given = _value(slo, "queue_policy")
    shed = _overload(slo) == "shed"
    if not shed and given is None:
        return None
    given_timeout = _value(given, "timeout_microseconds")
    given_size = _value(given, "max_queue_size")
    allow = bool(_value(given, "allow_timeout_override", True))
    budget_ms = float(slo.p99_latency_ms)
    overhead_ms = float(plan.inputs.overhead_ms if plan is not None
                        else _value(_value(spec, "planning"), "overhead_ms", 0.0))
    max_batch = _max_batch(spec, plan)
    capacity = _capacity(plan)
    why: list[str] = []
    warnings: list[str] = []

    derived_us, derived_line = None, None
    if shed and capacity is not None:
        margin_ms = MARGIN_FRACTION * budget_ms
        left_ms = budget_ms - overhead_ms - capacity.compute_ms - margin_ms
        derived_us = math.floor(left_ms * 1000 + 1e-6)
        derived_line = (f"P99 budget {budget_ms:g} ms - overhead {overhead_ms:g} ms (planning.overheadMs) - "
                        f"compute {capacity.compute_ms:.2f} ms - margin {margin_ms:g} ms ({MARGIN_FRACTION:.0%} of "
                        f"the budget) = {left_ms:.2f} ms")
        if derived_us <= 0 and given_timeout is None:
            raise OverloadError(
                f"slo.overload shed: the P99 budget leaves no time to queue: {derived_line} ({capacity.line}); "
                "raise slo.p99LatencyMs, make batches cheaper (a smaller maxBatchSize, fewer instances per GPU, "
                "a faster model), or set slo.queuePolicy.timeoutMicroseconds")

    if given_timeout is not None:
        timeout_us = int(given_timeout)
        source = "slo.queuePolicy.timeoutMicroseconds"
        if derived_us is not None:
            source += f"; derived: {derived_line}" + (" (no time to queue)" if derived_us <= 0 else "")
        why.append(f"timeout {timeout_us} us ({source})")
    elif shed and derived_us is not None:
        timeout_us = derived_us
        why.append(f"timeout {timeout_us} us = {derived_line}: a request queued longer cannot answer within the "
                   "budget, so it is rejected (REJECT) and the on-time ones are served")
        why.append(capacity.line)
    elif shed:
        raise OverloadError(
            "slo.overload shed needs a queue timeout, and there is no latency profile to derive one from: set "
            "slo.queuePolicy.timeoutMicroseconds (what a request may wait in Triton's queue, us), or give "
            "planning.latencyProfile (or planning.latencyProfileConfigMap) so rankops derives it from the budget")
    else:
        timeout_us = 0
    if not shed:
        why.insert(0, "slo.overload queue: no request is rejected for its wait; "
                      + ("one queued past the timeout waits behind those still on time (DELAY)" if timeout_us
                         else "no timeout"))

    budget_us = budget_ms * 1000
    if given_timeout is not None and timeout_us > budget_us:
        warnings.append(f"slo.queuePolicy.timeoutMicroseconds {timeout_us} is longer than slo.p99LatencyMs "
                        f"{budget_ms:g} ms: requests that wait this long already missed the budget"
                        + (f"; derived: {derived_us} us" if derived_us and derived_us > 0 else ""))
    if shed and timeout_us == 0:
        warnings.append("slo.queuePolicy.timeoutMicroseconds 0 with slo.overload shed: no timeout, so no request is "
                        "shed for being late; only maxQueueSize rejects, and Triton counts those in no metric")
    delay_us = _queue_delay_us(spec, plan)
    if 0 < timeout_us < delay_us:
        warnings.append(f"the queue timeout {timeout_us} us is shorter than max_queue_delay_microseconds {delay_us}: "
                        "a request held for its batch to fill times out even at light load; lower the batching "
                        "delay or raise the timeout")

    if given_size is not None:
        size = int(given_size)
        why.append(f"maxQueueSize {size} (slo.queuePolicy.maxQueueSize)" + (": no limit" if size == 0 else ""))
        if max_batch is not None and 0 < size < max_batch:
            warnings.append(f"slo.queuePolicy.maxQueueSize {size} is below maxBatchSize {max_batch}: Triton rejects "
                            "by queue size before a full batch can form, and counts such rejections in no metric; "
                            f"set it at least {max_batch}, or leave it out to have it derived")
    elif shed and capacity is not None and timeout_us > 0:
        drained = capacity.per_replica_qps * timeout_us / 1e6
        size = max(max_batch or 1, math.ceil(QUEUE_LOAD * drained - 1e-9))
        why.append(f"maxQueueSize {size} = max(maxBatchSize {max_batch}, ceil({QUEUE_LOAD} x "
                   f"{capacity.per_replica_qps:.0f} req/s per replica x {timeout_us / 1000:g} ms)): a memory "
                   f"backstop that holds what arrives within the timeout at up to {QUEUE_LOAD}x the sustainable "
                   "rate; the timeout does the shedding (Triton counts queue-size rejections in no metric)")
    else:
        size = 0
        why.append("maxQueueSize 0 (no limit): "
                   + ("no latency profile to size a backstop from; " if shed and capacity is None else "")
                   + ("the timeout sheds" if shed and timeout_us else "requests queue without limit")
                   + "; set slo.queuePolicy.maxQueueSize to bound the queue's memory")
    why.append(f"allowTimeoutOverride {str(allow).lower()} ("
               + ("slo.queuePolicy.allowTimeoutOverride" if _value(given, "allow_timeout_override") is not None
                  else "default") + "): " + ("a request's own timeout (its caller's deadline) replaces the queue's"
                                              if allow else "every request gets the queue timeout"))
    return QueuePolicy(shed, timeout_us, size, allow, tuple(why), tuple(warnings))


def with_queue_policy(spec: Any, plan: Any) -> Any:
    """`plan` (a PlanResult) carrying the queue policy of `spec` (status.plan.queuePolicy, `rankops plan`)."""
    return dataclasses.replace(plan, queue_policy=queue_policy(spec, plan))
