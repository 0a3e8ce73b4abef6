"""What a plan is computed from, read off a RankingModel spec (duck-typed, so tests and the CLI
can pass plain namespaces)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rankops.planner.memory import MemoryNeeds
from rankops.planner.profile import LatencyProfile, ProfileError, parse_profile_text
from rankops.planner.simulator import BatcherConfig


class PlanError(ValueError):
    """No plan: the message carries the arithmetic and what to change."""


@dataclass(frozen=True)
class PlanInputs:
    profile: LatencyProfile
    p99_budget_ms: float | None = None
    target_qps: float | None = None
    headroom: float = 0.5
    gpus_per_replica: int = 1
    instances_per_gpu: int | None = None     # None: the search chooses
    replicas: int | None = None              # None: derived from target QPS and headroom
    batching: BatcherConfig | None = None    # None: batching auto; else explicit (instances ignored)
    gpu_memory_mib: float | None = None
    memory: MemoryNeeds | None = None
    overhead_ms: float = 0.0
    shared_gpu_slowdown: float = 0.75
    max_instances_per_gpu: int = 4
    seed: int = 0
    # (fewest, most) items one request brings to a batch: spec.candidates layout batch, where a
    # request of N candidates is a batch of N. None: one item per request. Rates stay requests/s.
    items_per_request: tuple[int, int] | None = None
    failure_tolerance: int = 1               # replicas that may be lost with the SLO still met

    @property
    def auto(self) -> bool:
        return self.batching is None


def _explicit(spec: Any, name: str) -> Any:
    """A spec attribute, or None when a pydantic spec only carries it as a default: under
    batching: auto, replicas and instancesPerGpu left out are the planner's to choose."""
    value = getattr(spec, name, None)
    fields_set = getattr(spec, "model_fields_set", None)
    if fields_set is not None and name not in fields_set:
        return None
    return value


def slowed(inputs: PlanInputs, slowdown: float) -> PlanInputs:
    """`inputs` with every profiled compute time x `slowdown` (the overhead outside the GPU unchanged)."""
    profile = LatencyProfile(tuple((b, ms * slowdown) for b, ms in inputs.profile.points))
    return dataclasses.replace(inputs, profile=profile)


def inputs_from_spec(spec: Any, *, profile: LatencyProfile | dict | str | None = None,
                     gpu_memory_mib: float | None = None, seed: int = 0) -> PlanInputs:
    """Build PlanInputs from a RankingModelSpec.

    profile: overrides planning.latencyProfile; pass the ConfigMap's text (or a parsed profile)
    when planning.latencyProfileConfigMap is used. gpu_memory_mib: the pool's GPU memory, used
    when planning.gpuMemoryMiB is absent.
    """
    slo = getattr(spec, "slo", None)
    planning = getattr(spec, "planning", None)
    batching = getattr(spec, "batching", "auto")
    auto = batching is None or batching == "auto"

    try:
        latency = _profile(planning, profile)
    except ProfileError as exc:
        raise PlanError(str(exc)) from None
    if auto and slo is None:
        raise PlanError("batching: auto needs spec.slo {p99LatencyMs, targetQps} to plan against")

    explicit = None
    if not auto:
        explicit = BatcherConfig(
            max_batch_size=int(getattr(batching, "max_batch_size")),
            preferred_batch_sizes=tuple(sorted(getattr(batching, "preferred_batch_sizes", None) or ())),
            max_queue_delay_us=int(getattr(batching, "max_queue_delay_microseconds", 0) or 0),
            instances=int(getattr(spec, "instances_per_gpu", None) or 1),
        )
    # explicit batching is served with the spec's replicas / instances, defaults included
    instances = _explicit(spec, "instances_per_gpu") if auto else explicit.instances
    replicas = _explicit(spec, "replicas") if auto else getattr(spec, "replicas", None)
    mem = getattr(planning, "memory", None) if planning is not None else None
    gpu_mib = getattr(planning, "gpu_memory_mib", None) if planning is not None else None
    return PlanInputs(
        profile=latency,
        p99_budget_ms=float(slo.p99_latency_ms) if slo is not None else None,
        target_qps=float(slo.target_qps) if slo is not None else None,
        headroom=float(getattr(planning, "headroom", 0.5) if planning is not None else 0.5),
        gpus_per_replica=int(getattr(spec, "gpus_per_replica", 1) or 1),
        instances_per_gpu=int(instances) if instances is not None else None,
        replicas=int(replicas) if replicas is not None else None,
        batching=explicit,
        gpu_memory_mib=float(gpu_mib) if gpu_mib is not None else gpu_memory_mib,
        memory=MemoryNeeds(
            weights_mib=float(getattr(mem, "weights_mib", 0) or 0),
            gpu_embeddings_mib=float(getattr(mem, "gpu_embeddings_mib", 0) or 0),
            activation_mib_per_item=float(getattr(mem, "activation_mib_per_item", 0) or 0),
            runtime_reserve_mib=float(getattr(mem, "runtime_reserve_mib", 0) or 0),
        ) if mem is not None else None,
        overhead_ms=float(getattr(planning, "overhead_ms", 0) or 0) if planning is not None else 0.0,
        shared_gpu_slowdown=float(getattr(planning, "shared_gpu_slowdown", 0.75))
        if planning is not None and getattr(planning, "shared_gpu_slowdown", None) is not None else 0.75,
        max_instances_per_gpu=int(getattr(planning, "max_instances_per_gpu", 4) or 4)
        if planning is not None else 4,
        seed=seed,
        items_per_request=_items_per_request(spec),
        failure_tolerance=int(getattr(planning, "failure_tolerance", 1))
        if planning is not None and getattr(planning, "failure_tolerance", None) is not None else 1,
    )


def _items_per_request(spec: Any) -> tuple[int, int] | None:
    """spec.candidates with layout batch: each request is a batch of its candidates."""
    candidates = getattr(spec, "candidates", None)
    layout = getattr(getattr(candidates, "layout", None), "value", getattr(candidates, "layout", None))
    if candidates is None or layout != "batch":
        return None   # padded: the candidates are inside one batch item
    lo = int(getattr(candidates, "min_per_request", 1) or 1)
    hi = getattr(candidates, "max_per_request", None)
    if hi is None:
        raise PlanError("spec.candidates.layout batch needs maxPerRequest (the most candidates one request "
                        "carries) to plan batches of candidates")
    return (lo, int(hi)) if int(hi) > 1 else None


def _profile(planning: Any, override: LatencyProfile | dict | str | None) -> LatencyProfile:
    if isinstance(override, LatencyProfile):
        return override
    if isinstance(override, dict):
        return LatencyProfile.from_mapping(override, "profile")
    if isinstance(override, str):
        return parse_profile_text(override, "latency profile ConfigMap")
    inline = getattr(planning, "latency_profile", None) if planning is not None else None
    if inline:
        return LatencyProfile.from_mapping(inline, "spec.planning.latencyProfile")
    ref = getattr(planning, "latency_profile_config_map", None) if planning is not None else None
    if ref is not None:
        raise PlanError(f"spec.planning.latencyProfileConfigMap {ref.name}/{ref.key}: read the ConfigMap "
                        "and pass its text as profile=")
    raise PlanError("no latency profile: set spec.planning.latencyProfile (compute ms per batch size, "
                    "e.g. {1: 2.0, 8: 3.0}) or pass --profile with perf_analyzer / Model Analyzer CSV")
