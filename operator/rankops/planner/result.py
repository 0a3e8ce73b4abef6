"""The outcome of planning or evaluating a config, and its status / JSON shapes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rankops.planner.inputs import PlanInputs
from rankops.planner.simulator import BatcherConfig, SimResult


@dataclass(frozen=True)
class LoadPoint:
    """One row of the predicted latency/throughput table."""
    per_gpu_qps: float
    p50_ms: float
    p99_ms: float
    avg_batch_size: float
    gpu_busy_fraction: float

    @classmethod
    def of(cls, sim: SimResult) -> LoadPoint:
        return cls(sim.offered_qps, sim.p50_ms, sim.p99_ms, sim.avg_batch_size, sim.gpu_busy_fraction)


@dataclass(frozen=True)
class PlanResult:
    mode: str                                   # "auto" or "explicit"
    max_batch_size: int
    preferred_batch_sizes: list[int]
    max_queue_delay_microseconds: int
    instances_per_gpu: int
    replicas: int
    gpus: int
    predicted_p50_ms: float                     # at target QPS spread over `gpus`
    predicted_p99_ms: float
    qps_per_gpu: float                          # most QPS per GPU within the P99 budget
    avg_batch_size: float
    gpu_busy_fraction: float
    memory_mib: float | None
    problems: list[str]
    explanation: list[str]
    inputs: PlanInputs
    table: list[LoadPoint] = field(default_factory=list)
    runners_up: list[BatcherConfig] = field(default_factory=list)  # the closest alternatives (auto)
    warnings: list[str] = field(default_factory=list)  # risks the plan takes though it meets the SLO
    queue_policy: Any = None   # rankops.planner.overload.QueuePolicy, set by with_queue_policy

    @property
    def config(self) -> BatcherConfig:
        return BatcherConfig(self.max_batch_size, tuple(self.preferred_batch_sizes),
                             self.max_queue_delay_microseconds, self.instances_per_gpu)

    def to_status(self) -> dict:
        """`status.plan` (schema: rankops.api.planning.PlanStatus)."""
        status = {
            "mode": self.mode,
            "maxBatchSize": self.max_batch_size,
            "preferredBatchSizes": list(self.preferred_batch_sizes),
            "maxQueueDelayMicroseconds": self.max_queue_delay_microseconds,
            "instancesPerGpu": self.instances_per_gpu,
            "replicas": self.replicas,
            "gpus": self.gpus,
            "qpsPerGpu": _r(self.qps_per_gpu, 1),
            "predictedP50Ms": _r(self.predicted_p50_ms),
            "predictedP99Ms": _r(self.predicted_p99_ms),
            "avgBatchSize": _r(self.avg_batch_size, 2),
            "gpuBusyFraction": _r(self.gpu_busy_fraction, 3),
            "problems": list(self.problems),
            "warnings": list(self.warnings) + list(self.queue_policy.warnings if self.queue_policy else ()),
            "summary": self.explanation[0] if self.explanation else "",
            "inputs": {
                "headroom": self.inputs.headroom,
                "failureTolerance": self.inputs.failure_tolerance,
                "profile": {str(b): ms for b, ms in self.inputs.profile.points},
            },
        }
        if self.queue_policy is not None:
            status["queuePolicy"] = self.queue_policy.to_status()
        if self.memory_mib is not None:
            status["memoryMiB"] = _r(self.memory_mib, 1)
        for key, value in (("p99LatencyMs", self.inputs.p99_budget_ms), ("targetQps", self.inputs.target_qps)):
            if value is not None:
                status["inputs"][key] = value
        if self.inputs.gpu_memory_mib is not None:
            status["inputs"]["gpuMemoryMiB"] = int(self.inputs.gpu_memory_mib)
        if self.inputs.items_per_request is not None:
            status["inputs"]["candidatesPerRequest"] = list(self.inputs.items_per_request)
        return status

    def to_json(self) -> dict:
        """`rankops plan -o json`: the status plus the explanation and the load table."""
        out = self.to_status()
        out["explanation"] = list(self.explanation)
        out["table"] = [
            {"perGpuQps": _r(p.per_gpu_qps, 1), "p50Ms": _r(p.p50_ms), "p99Ms": _r(p.p99_ms),
             "avgBatchSize": _r(p.avg_batch_size, 2), "gpuBusyFraction": _r(p.gpu_busy_fraction, 3)}
            for p in self.table
        ]
        return out


def _r(value: float, digits: int = 3) -> float:
    return round(float(value), digits)
