"""API models of `spec.autoscaling` and `status.autoscaling`: replicas that follow the load Triton
itself counts, against a per-replica capacity that holds the P99 budget (the plan's), or left to
the user's own HorizontalPodAutoscaler or KEDA ScaledObject (docs/autoscaling.md).

The decision is rankops.autoscale's, a pure function; what it needs across a restart (the last
counter reading, the recommendations of the stabilization windows) lives in status.autoscaling.
"""
from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import Field, model_validator

from rankops.api.base import ApiModel


class AutoscalingMode(str, Enum):
    rankops = "rankops"
    external = "external"


# The HorizontalPodAutoscaler's behavior windows, a model's and a shared server's alike (autoscale.stabilize).
ScaleUpWindow = Annotated[int, Field(ge=0, le=3600, description=(
    "Scale up only to the lowest replica count recommended over this window (0: at once)."))]
ScaleDownWindow = Annotated[int, Field(ge=0, le=3600, description=(
    "Scale down only to the highest replica count recommended over this window, so a dip in the load "
    "does not remove replicas the next peak needs."))]


class Autoscaling(ApiModel):
    """Replicas of the stable track that follow the load."""
    enabled: Annotated[bool, Field(description=(
        "Scale the stable track's replicas (spec.replicas and the plan's count are then only the start)."))] = False
    mode: Annotated[AutoscalingMode, Field(description=(
        "`rankops`: the operator reads each serving pod's Triton counters every --interval, derives the request "
        "rate and queue time, and sets the replicas. `external`: a HorizontalPodAutoscaler or KEDA ScaledObject "
        "of yours targets the stable Deployment; rankops applies it without spec.replicas (server-side apply "
        "leaves that field to the autoscaler) and reads nothing from the pods."))] = AutoscalingMode.rankops
    min_replicas: Annotated[int, Field(ge=1, le=1000, description=(
        "Fewest stable replicas, planning.failureTolerance included."))] = 1
    max_replicas: Annotated[int | None, Field(ge=1, le=1000, description=(
        "Most stable replicas (required with mode rankops): what the pool's GPUs and the budget allow."))] = None
    target_utilization: Annotated[float, Field(gt=0, le=1, description=(
        "Fraction of a replica's sustainable rate (the plan's qpsPerGpu x gpusPerReplica, or "
        "capacityPerReplicaQps) each replica is sized to carry; the rest is headroom for the time a new "
        "replica takes to start and warm."))] = 0.7
    capacity_per_replica_qps: Annotated[float | None, Field(gt=0, le=10_000_000, description=(
        "Requests per second one replica sustains within the P99 budget. Required unless the model has an "
        "slo and a planning latency profile (batching: auto, or explicit batching evaluated by the planner), "
        "whose sustainable rate is used; given, it wins over the plan's."))] = None
    max_avg_queue_ms: Annotated[float | None, Field(gt=0, le=3_600_000, description=(
        "Average time a request waits in Triton's queue (ms, from nv_inference_queue_duration_us) above which "
        "one more replica is added even when the rate says the replicas suffice (the capacity was optimistic); "
        "null: the queue time is reported only."))] = None
    correct_capacity: Annotated[bool, Field(description=(
        "Compare the stable replicas' mean request latency at their observed rate (Triton's counters) with what "
        "the plan predicted there, and scale against the plan's capacity x a correction factor (1 / slowdown, "
        "smoothed, within 0.5..2; lowered at once, raised after 3 readings in a row). On by default: an offline "
        "profile is a prior, and an optimistic one otherwise breaks the P99 budget before anything scales. A "
        "capacity from capacityPerReplicaQps is measured against the plan (when there is one) but not corrected: "
        "it is already the user's measurement. Recorded in status.autoscaling.capacityCorrection."))] = True
    scale_up_stabilization_seconds: ScaleUpWindow = 0
    scale_down_stabilization_seconds: ScaleDownWindow = 300

    @model_validator(mode="after")
    def _bounds(self) -> "Autoscaling":
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscaling.minReplicas {self.min_replicas} exceeds autoscaling.maxReplicas "
                             f"{self.max_replicas}")
        if self.enabled and self.mode is AutoscalingMode.rankops and self.max_replicas is None:
            raise ValueError("autoscaling.maxReplicas is required with autoscaling.enabled and mode rankops "
                             "(the most replicas the pool and the budget allow)")
        return self

    @property
    def by_rankops(self) -> bool:
        return self.enabled and self.mode is AutoscalingMode.rankops

    @property
    def external(self) -> bool:
        return self.enabled and self.mode is AutoscalingMode.external


AUTOSCALING_RULES = [
    {"rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
     "message": "autoscaling.minReplicas must not exceed autoscaling.maxReplicas", "fieldPath": ".minReplicas"},
    {"rule": "!has(self.enabled) || !self.enabled || (has(self.mode) && self.mode == 'external') || "
             "has(self.maxReplicas)",
     "message": "autoscaling.maxReplicas is required with autoscaling.enabled and mode rankops",
     "fieldPath": ".maxReplicas"},
]


class Recommendation(ApiModel):
    at: Annotated[str, Field(description="When (RFC 3339).")]
    replicas: Annotated[int, Field(description="The replicas the load needed then, bounds and tolerance applied.")]


class CapacityCorrection(ApiModel):
    """`status.autoscaling.capacityCorrection`: the plan's capacity corrected by what the replicas show."""
    factor: Annotated[float, Field(description=(
        "What the capacity per replica is multiplied by (1 / slowdown, smoothed; 0.5..2)."))]
    slowdown: Annotated[float | None, Field(description=(
        "The last evidence's observed / predicted mean request latency at the observed per-replica rate."))] = None
    readings: Annotated[int, Field(description="Readings that counted as evidence against this plan.")] = 0
    raise_streak: Annotated[int, Field(description=(
        "Readings in a row that say raise; the factor rises at 3 (it is lowered at once)."))] = 0
    evidence: Annotated[str | None, Field(description=(
        "The last reading: per-replica rate, requests, observed vs predicted mean latency."))] = None
    updated_at: Annotated[str | None, Field(description="When the last reading was taken (RFC 3339).")] = None
    message: Annotated[str | None, Field(description="What the last reading did to the factor, and why.")] = None
    plan_basis: Annotated[str | None, Field(description=(
        "Digest of the plan measured against (status.plan.inputsDigest): a new plan starts the correction over."))] = None
    applied: Annotated[bool, Field(description=(
        "Whether the autoscaler scales against it (false: the capacity is the spec's own, measured only)."))] = True
    curve: Annotated[list[list[float]], Field(default_factory=list, max_length=32, description=(
        "The plan's predicted mean request latency per replica rate ([req/s, ms] pairs) the evidence is "
        "compared with: kept so a restarted operator, which takes the plan from status.plan without "
        "simulating it again, goes on comparing."))]


class AutoscalingStatus(ApiModel):
    """`status.autoscaling`: what the autoscaler saw and decided, and what it needs after a restart."""
    mode: Annotated[str, Field(description="rankops or external.")]
    external: Annotated[str | None, Field(description=(
        "mode external: the autoscaler that owns the stable Deployment's replicas, e.g. "
        "HorizontalPodAutoscaler/ctr-ranker or ScaledObject/ctr-ranker."))] = None
    observed_qps: Annotated[float | None, Field(description=(
        "Requests per second the serving pods answered between the last two readings (Triton's "
        "nv_inference_request_success + failure)."))] = None
    avg_queue_ms: Annotated[float | None, Field(description=(
        "Average time those requests waited in Triton's queue, ms (nv_inference_queue_duration_us)."))] = None
    shed_ratio: Annotated[float | None, Field(description=(
        "Share of the requests Triton rejected (queue timeout, nv_inference_request_failure reason REJECTED) "
        "between the last two readings. Shed requests count in observedQps: they were asked for."))] = None
    capacity_per_replica_qps: Annotated[float | None, Field(description=(
        "Requests per second one replica sustains within the P99 budget (the plan's, or the spec's), x "
        "capacityCorrection.factor when that is applied: what the replicas are sized against."))] = None
    capacity_source: Annotated[str | None, Field(description="plan or spec (autoscaling.capacityPerReplicaQps).")] = None
    desired_replicas: Annotated[int | None, Field(description="The stable replicas decided.")] = None
    reason: Annotated[str | None, Field(description=(
        "Why, in CamelCase: NoReading, ScaledUp, ScaledDown, WithinTarget, ScaleDownStabilizing, "
        "ScaleUpStabilizing, AtMaxReplicas, AtMinReplicas, QueueTimeHigh, Shedding, External."))] = None
    message: Annotated[str | None, Field(description="The numbers behind the decision, for people.")] = None
    capacity_correction: Annotated[CapacityCorrection | None, Field(description=(
        "The capacity per replica corrected by the replicas' observed latency (spec.autoscaling.correctCapacity); "
        "absent without a plan to predict from or with the correction off."))] = None
    last_scale_time: Annotated[str | None, Field(description="When the replicas last changed (RFC 3339).")] = None
    read_at: Annotated[str | None, Field(description="When the serving pods were last read (RFC 3339).")] = None
    reading: Annotated[dict[str, Any] | None, Field(
        description=("Each serving pod's Triton counters at the last reading ({pod: {requests, rejected, served, queueUs, "
                     "requestUs, computeUs, track, at}}), "
                     "the start of the next rate's window; kept so a restarted operator goes on from it."),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})] = None
    recommendations: Annotated[list[Recommendation], Field(default_factory=list, max_length=200, description=(
        "Recent recommendations, oldest first (consecutive equal ones kept once, at the latest), for the "
        "stabilization windows."))]
