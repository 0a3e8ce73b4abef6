"""API models for the latency-budget planner: `spec.slo`, `spec.planning` and `status.plan`.

The RankingModel model imports these. Schemas stay Kubernetes-structural: optional fields use
`SkipJsonSchema[None]` so they render as their plain type (no `anyOf` with null), and maps give
`additionalProperties` with a type.
"""
from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from rankops.api import bounds
from rankops.api.base import ApiModel

# Batch sizes above this are not a realistic ranking batch; it also bounds the simulator's tables.
MAX_PROFILE_BATCH = 4096


class Overload(str, Enum):
    queue = "queue"
    shed = "shed"


# Bounds of the queue policy: a timeout past 60 s is no ranking deadline (slo.p99LatencyMs stops there
# too); Triton's max_queue_size is a uint32, and a million queued requests is already far past any
# memory backstop a serving pod wants.
MAX_QUEUE_TIMEOUT_US = 60_000_000
MAX_QUEUE_SIZE = 1_000_000


class SloQueuePolicy(ApiModel):
    """Triton's queue policy (dynamic_batching.default_queue_policy), each field given here winning
    over the one rankops derives from the budget and the plan."""

    timeout_microseconds: Annotated[Annotated[int, Field(ge=0, le=MAX_QUEUE_TIMEOUT_US)] | SkipJsonSchema[None], Field(
        default=None,
        description="Longest a request may wait in Triton's queue, in microseconds (default_timeout_microseconds); "
                    "0: no timeout. With overload shed a request that waited longer is rejected; with overload "
                    "queue it waits on behind the requests that are still on time (DELAY). Default (shed): what "
                    "the P99 budget leaves after planning.overheadMs, the compute of a full batch (maxBatchSize) "
                    "and a 10% margin.")]
    max_queue_size: Annotated[Annotated[int, Field(ge=0, le=MAX_QUEUE_SIZE)] | SkipJsonSchema[None], Field(
        default=None,
        description="Most requests Triton's queue holds (max_queue_size); 0: no limit. A request beyond it is "
                    "rejected at once, and Triton counts such rejections in no metric: keep it a memory "
                    "backstop above what the timeout sheds. Default (shed): what arrives within the timeout at "
                    "4x one replica's sustainable rate, at least maxBatchSize.")]
    allow_timeout_override: Annotated[bool | SkipJsonSchema[None], Field(
        default=None,
        description="Whether a request's own timeout (its caller's deadline) replaces the queue timeout "
                    "(allow_timeout_override). Default true: a caller may pass a tighter deadline.")]


class Slo(ApiModel):
    """The latency budget of one ranking call and the load it must carry."""

    p99_latency_ms: Annotated[float, Field(
        gt=0, le=60_000,
        description="99th-percentile latency budget of one ranking request at the server, in ms "
                    "(queueing + batching delay + GPU compute + planning.overheadMs).",
    )]
    target_qps: Annotated[float, Field(
        gt=0,
        description="Peak requests per second the model must serve across all replicas.",
    )]
    overload: Annotated[Overload, Field(
        default=Overload.queue,
        description="What Triton does with a request that can no longer meet p99LatencyMs when load outruns "
                    "capacity. `queue` (default): it waits, however long. `shed`: it is rejected once it has "
                    "queued longer than the budget leaves (queuePolicy), so the requests that can still be on "
                    "time are served. A shed request is an error (HTTP 503 / gRPC UNAVAILABLE, \"Request timeout "
                    "expired\") its caller must answer with a fallback, which rankops cannot know the callers "
                    "have; hence not the default. `shed` is for callers with a deadline, as ranking callers "
                    "are: a late answer is discarded anyway.",
    )]
    queue_policy: Annotated[SloQueuePolicy | SkipJsonSchema[None], Field(
        default=None,
        description="Triton's queue policy; the fields given win over the derived ones (status.plan.queuePolicy "
                    "shows what is served and why).",
    )]


class MemoryBudget(ApiModel):
    """What one model instance holds in GPU memory, plus what the runtime keeps per GPU."""

    weights_mib: Annotated[float, Field( alias="weightsMiB",
        default=0, ge=0, description="Model weights per instance, MiB (each instance loads its own copy).")]
    gpu_embeddings_mib: Annotated[float, Field( alias="gpuEmbeddingsMiB",
        default=0, ge=0,
        description="Embedding tables held on the GPU per instance, MiB (0 when they live in a "
                    "feature service or CPU memory).")]
    activation_mib_per_item: Annotated[float, Field( alias="activationMiBPerItem",
        default=0, ge=0,
        description="Activation memory per batch item, MiB; multiplied by maxBatchSize.")]
    runtime_reserve_mib: Annotated[float, Field( alias="runtimeReserveMiB",
        default=0, ge=0,
        description="Per-GPU reserve for the CUDA context, Triton and allocator caches, MiB.")]


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the RankingModel's namespace."""

    name: Annotated[str, Field(pattern=bounds.DNS_SUBDOMAIN, max_length=bounds.DNS_SUBDOMAIN_MAX,
                               description="ConfigMap name.")]
    key: Annotated[str, Field(
        pattern=bounds.CONFIG_MAP_KEY, max_length=bounds.DNS_SUBDOMAIN_MAX,
        description="Key holding the profile: a YAML/JSON map {batchSize: ms}, or perf_analyzer "
                    "(-f) / Model Analyzer CSV output.")]


class Planning(ApiModel):
    """Inputs of the latency-budget planner beyond the SLO."""

    headroom: Annotated[float, Field(
        default=0.5, ge=0, le=0.95,
        description="Fraction of sustainable capacity kept spare at targetQps (0.5 = each GPU runs "
                    "at most half of what it could sustain within the P99 budget).")]
    gpu_memory_mib: Annotated[int | SkipJsonSchema[None], Field(
        default=None, gt=0, alias="gpuMemoryMiB",
        description="Usable memory of one GPU, MiB. When absent the pool's GPU product may supply "
                    "it; without either, memory is not checked.")]
    latency_profile: Annotated[Annotated[dict[int, Annotated[float, Field(gt=0)]], Field(
        max_length=MAX_PROFILE_BATCH)] | SkipJsonSchema[None], Field(
        default=None,
        description="GPU compute time in ms per batch size on the target GPU, e.g. "
                    "{1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}. Sizes between entries are interpolated.")]
    latency_profile_config_map: Annotated[ConfigMapKeyRef | SkipJsonSchema[None], Field(
        default=None, description="Read the latency profile from a ConfigMap key instead.")]
    memory: Annotated[MemoryBudget | SkipJsonSchema[None], Field(
        default=None, description="GPU memory the model needs; checked against gpuMemoryMiB.")]
    overhead_ms: Annotated[float, Field(
        default=0, ge=0,
        description="Latency every request pays outside the GPU (network, (de)serialisation, "
                    "Triton request handling), ms; counted against the P99 budget.")]
    shared_gpu_slowdown: Annotated[float, Field(
        default=0.75, ge=0, le=1,
        description="How much one more concurrently running instance on the same GPU slows each "
                    "execution, as a fraction of its solo time: 1 = instances time-slice the GPU "
                    "(no gain), 0 = perfect overlap.")]
    max_instances_per_gpu: Annotated[int, Field(
        default=4, ge=1, le=16, description="Largest instance count per GPU the search tries.")]
    failure_tolerance: Annotated[int, Field(
        default=1, ge=0, le=100,
        description="Replicas the fleet may lose (a GPU or node failure) and still carry slo.targetQps "
                    "within the P99 budget, each surviving GPU at most at its sustainable rate. 1 (default) "
                    "survives a single card failure; 0 sizes for headroom alone.")]

    @field_validator("latency_profile")
    @classmethod
    def _profile_sane(cls, profile: dict[int, float] | None) -> dict[int, float] | None:
        if profile is None:
            return None
        if not profile:
            raise ValueError("latencyProfile is empty: give compute ms per batch size, e.g. {1: 2.0, 8: 3.0}")
        bad = [b for b in profile if not 1 <= b <= MAX_PROFILE_BATCH]
        if bad:
            raise ValueError(f"latencyProfile batch sizes must be 1..{MAX_PROFILE_BATCH}, got {sorted(bad)}")
        return dict(sorted(profile.items()))

    @model_validator(mode="after")
    def _one_profile_source(self) -> Planning:
        if self.latency_profile is not None and self.latency_profile_config_map is not None:
            raise ValueError("give either latencyProfile or latencyProfileConfigMap, not both")
        return self


class PlanInputsStatus(ApiModel):
    """What the plan was computed from."""

    p99_latency_ms: Annotated[float | SkipJsonSchema[None], Field(default=None, description="SLO P99 budget, ms.")]
    target_qps: Annotated[float | SkipJsonSchema[None], Field(default=None, description="SLO target QPS.")]
    headroom: Annotated[float, Field(description="Spare capacity fraction kept at target QPS.")]
    failure_tolerance: Annotated[int, Field(
        default=1, description="Replicas that may be lost with targetQps still served within the P99 budget.")]
    candidates_per_request: Annotated[list[int] | SkipJsonSchema[None], Field(
        default=None, description="[fewest, most] candidates per request when spec.candidates has layout batch "
                                  "(rates count requests, batch sizes candidates).")]
    gpu_memory_mib: Annotated[int | SkipJsonSchema[None], Field(default=None, alias="gpuMemoryMiB", description="GPU memory, MiB.")]
    profile: Annotated[dict[str, float], Field(description="Compute ms per batch size used.")]


class QueuePolicyStatus(ApiModel):
    """`status.plan.queuePolicy`: the queue policy config.pbtxt renders, and the arithmetic of each number."""

    shed: Annotated[bool, Field(description="slo.overload shed: a request queued past the timeout is rejected "
                                            "(REJECT); false: it waits on (DELAY).")]
    timeout_microseconds: Annotated[int, Field(ge=0, le=MAX_QUEUE_TIMEOUT_US,
                                               description="default_timeout_microseconds (0: none).")]
    max_queue_size: Annotated[int, Field(ge=0, le=MAX_QUEUE_SIZE, description="max_queue_size (0: no limit).")]
    allow_timeout_override: Annotated[bool, Field(description="allow_timeout_override: a request's own "
                                                              "timeout replaces the queue timeout.")]
    explanation: Annotated[list[str], Field(default_factory=list, description="Where each number comes from.")]


class PlanStatus(ApiModel):
    """`status.plan`: the batching/instance choice, its prediction and what it was derived from."""

    mode: Annotated[str, Field(description="`auto` (planned) or `explicit` (the spec's values, evaluated).")]
    max_batch_size: Annotated[int, Field(description="max_batch_size of config.pbtxt.")]
    preferred_batch_sizes: Annotated[list[int], Field(description="dynamic_batching.preferred_batch_size.")]
    max_queue_delay_microseconds: Annotated[int, Field(description="dynamic_batching.max_queue_delay_microseconds.")]
    instances_per_gpu: Annotated[int, Field(description="instance_group count (KIND_GPU).")]
    replicas: Annotated[int, Field(description="Serving replicas.")]
    gpus: Annotated[int, Field(description="replicas x GPUs per replica.")]
    qps_per_gpu: Annotated[float, Field(description="Most QPS one GPU sustains within the P99 budget.")]
    predicted_p50_ms: Annotated[float, Field(description="Predicted P50 at target QPS, ms.")]
    predicted_p99_ms: Annotated[float, Field(description="Predicted P99 at target QPS, ms.")]
    avg_batch_size: Annotated[float, Field(description="Predicted average executed batch at target QPS.")]
    gpu_busy_fraction: Annotated[float, Field(description="Predicted fraction of time the GPU is busy at target QPS.")]
    memory_mib: Annotated[float | SkipJsonSchema[None], Field(
        default=None, alias="memoryMiB", description="Predicted GPU memory per GPU, MiB (absent when no memory budget given).")]
    problems: Annotated[list[str], Field(description="SLO misses, capacity shortfalls, OOMs.")]
    warnings: Annotated[list[str], Field(default_factory=list, description=(
        "Risks a plan takes although it meets the SLO (e.g. no headroom and no failure tolerance); "
        "not Degraded."))]
    summary: Annotated[str, Field(description="One line: why this choice.")]
    queue_policy: Annotated[QueuePolicyStatus | SkipJsonSchema[None], Field(default=None, description=(
        "Triton's queue policy from slo.overload and slo.queuePolicy (absent: requests queue without limit)."))]
    inputs: Annotated[PlanInputsStatus, Field(description="The inputs of the plan.")]
    inputs_digest: Annotated[str | SkipJsonSchema[None], Field(default=None, max_length=64, description=(
        "sha256 of what the plan was computed from (SLO, profile, planning, the replicas and instances the "
        "spec sets, tensors, the planner's code): while it matches, the operator does not plan again."))]


def status_schema() -> dict:
    """JSON schema of `status.plan` (the shape `PlanResult.to_status()` returns)."""
    return PlanStatus.model_json_schema(by_alias=True)
