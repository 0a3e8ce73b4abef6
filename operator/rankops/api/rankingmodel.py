"""RankingModel: one ranking model, its versions, how Triton serves it, and how versions roll out.

These models are the single source of truth: the CRD schema (crds/) is generated from them, the
operator parses every object through them, and `rankops render` uses them offline.
"""
from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, field_validator, model_validator

from rankops.api import bounds
from rankops.api.autoscaling import AUTOSCALING_RULES, Autoscaling, AutoscalingStatus
from rankops.api.base import ApiModel, refuse_unquoted_version
from rankops.api.conditions import Condition
from rankops.api.phases import ModelPhase, RolloutPhase
from rankops.api.planning import Planning, PlanStatus, Slo
from rankops.images import FETCHER_IMAGE, GATES_IMAGE

DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.05-py3"
DEFAULT_FETCHER_IMAGE = FETCHER_IMAGE
DEFAULT_GATES_IMAGE = GATES_IMAGE
# Any image with the package (dev demo's `rankops infer` Job): the fetcher's, the smallest.
DEFAULT_RANKOPS_IMAGE = DEFAULT_FETCHER_IMAGE

# A version name ends up in object names, labels and (when numeric) Triton's version directory.
VERSION_NAME = r"^[a-z0-9]([a-z0-9.-]{0,18}[a-z0-9])?$"
TENSOR_NAME = r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,127}$"
MODEL_URI = r"^(s3|gs|pvc|file|https?)://.+"
# Fetched by the gate Job's `rankops fetch-model`, which has no claim to read: no pvc://.
REFERENCE_URI = r"^(s3|gs|file|https?)://.+"
TENSORRT_VERSION = r"^[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}(\.[0-9]{1,3})?$"
TRITON_RELEASE = r"^[0-9]{2}\.[0-9]{2}$"


class ModelFormat(str, Enum):
    onnx = "onnx"
    tensorrt_plan = "tensorrt_plan"
    torchscript = "torchscript"


class Precision(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"


class DataType(str, Enum):
    """Triton tensor data types (ModelConfig's TYPE_* without the prefix)."""
    BOOL = "BOOL"
    UINT8 = "UINT8"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BF16 = "BF16"
    STRING = "STRING"


class ModelVersion(ApiModel):
    name: Annotated[str, Field(pattern=VERSION_NAME, max_length=20, description=(
        "Version name: lower-case letters, digits, '.' and '-', at most 20 characters. A numeric "
        "name is also Triton's version directory."))]
    model_uri: Annotated[str, Field(pattern=MODEL_URI, max_length=bounds.URI_MAX, description=(
        "Where this version's artifact directory is: s3://bucket/path, gs://bucket/path, "
        "pvc://claim/path, https://..., or file:///path (tests and single-node labs)."))]
    format: Annotated[ModelFormat, Field(description="Artifact format.")]
    precision: Annotated[Precision, Field(description=(
        "Numeric precision. For onnx, fp16/int8 turn on Triton's TensorRT execution accelerator."))] = Precision.fp32
    tensorrt_version: Annotated[str | None, Field(pattern=TENSORRT_VERSION, max_length=20, description=(
        'For tensorrt_plan: the TensorRT version that built the engine, e.g. "10.0.1.6" (an engine loads only '
        "on that TensorRT). rankops compares it with the TensorRT of spec.tritonImage's release and reports a "
        "mismatch as Degraded before any pod starts; unset, the engine cannot be checked."))] = None
    built_with_triton: Annotated[str | None, Field(pattern=TRITON_RELEASE, max_length=5, description=(
        'For tensorrt_plan: the Triton release (YY.MM, e.g. "24.05") whose container built the engine, when '
        "tensorrtVersion is not known; the engine is checked against spec.tritonImage's release."))] = None
    sha256: Annotated[str | None, Field(pattern=r"^[0-9a-f]{64}$", min_length=64, max_length=64, description=(
        "SHA-256 (64 lower-case hex digits, as `sha256sum` prints) of the model file Triton loads: "
        "model.onnx, model.plan or model.pt in the artifact directory modelUri names (or the file it "
        "names). The fetcher refuses an artifact whose file differs (replaced at the URI, corrupted, or "
        "cut short by a server that sent no length) and the previous version keeps serving. Only for "
        "fetched URIs (s3://, gs://, https://): pvc:// and file:// are mounted, never read through."))] = None

    @field_validator("tensorrt_version", "built_with_triton", mode="before")
    @classmethod
    def _versions_are_quoted(cls, value: Any, info) -> Any:
        return refuse_unquoted_version(cls, value, info.field_name, "24.10")

    @model_validator(mode="after")
    def _sha256_only_when_fetched(self) -> "ModelVersion":
        if self.sha256 and self.model_uri.split("://", 1)[0].lower() in ("pvc", "file"):
            raise ValueError(f"version {self.name!r}: sha256 is checked by the fetcher, and a "
                             f"{self.model_uri.split('://', 1)[0]}:// artifact is mounted, not fetched: "
                             "remove sha256 or fetch the artifact from s3://, gs:// or https://")
        return self

    @model_validator(mode="after")
    def _engine_fields_only_for_plans(self) -> "ModelVersion":
        if (self.tensorrt_version or self.built_with_triton) and self.format is not ModelFormat.tensorrt_plan:
            raise ValueError(f"version {self.name!r}: tensorrtVersion and builtWithTriton describe a TensorRT "
                             f"engine; they apply only to format tensorrt_plan, not {self.format.value}")
        return self


class TensorSpec(ApiModel):
    name: Annotated[str, Field(pattern=TENSOR_NAME, max_length=128, description="Tensor name as the model declares it.")]
    data_type: Annotated[DataType, Field(description="Triton data type, e.g. FP32.")]
    dims: Annotated[list[Annotated[int, Field(ge=-1)]], Field(
        min_length=1, max_length=8,
        description="Shape without the batch dimension; -1 marks a variable dimension (e.g. the candidate count).")]
    max_dims: Annotated[list[Annotated[int, Field(ge=1)]] | None, Field(
        default=None, max_length=8,
        description="Upper bound for each dimension; required where dims has -1 (used for warmup and TensorRT profiles).")] = None

    @model_validator(mode="after")
    def _variable_dims_need_bounds(self) -> "TensorSpec":
        if 0 in self.dims:
            raise ValueError(f"tensor {self.name}: dims {self.dims} has 0; each dimension is -1 (variable) or at least 1")
        if self.max_dims is not None:
            if len(self.max_dims) != len(self.dims):
                raise ValueError(f"tensor {self.name}: maxDims must have as many entries as dims ({len(self.dims)})")
            for d, m in zip(self.dims, self.max_dims):
                if d != -1 and d != m:
                    raise ValueError(f"tensor {self.name}: maxDims {self.max_dims} must equal dims {self.dims} "
                                     "where the dimension is fixed")
        return self

    def warmup_dims(self) -> list[int]:
        """Concrete dims for warmup and profiles: the stated maxima where the dim is variable."""
        return list(self.max_dims) if self.max_dims else list(self.dims)


class Batching(ApiModel):
    max_batch_size: Annotated[int, Field(ge=1, le=4096, description="Triton max_batch_size.")]
    preferred_batch_sizes: Annotated[list[Annotated[int, Field(ge=1, le=4096)]], Field(
        default_factory=list, max_length=16,
        description="Batch sizes the dynamic batcher prefers to form; each <= maxBatchSize.")]
    max_queue_delay_microseconds: Annotated[int, Field(ge=0, le=1_000_000, description=(
        "How long a request may wait for a batch to fill. 500-2000 us is typical; "
        "0 sends batches as soon as an instance is free."))] = 1000

    @model_validator(mode="after")
    def _preferred_within_max(self) -> "Batching":
        too_big = [b for b in self.preferred_batch_sizes if b > self.max_batch_size]
        if too_big:
            raise ValueError(f"preferredBatchSizes {too_big} exceed maxBatchSize {self.max_batch_size}: "
                             "lower them or raise maxBatchSize")
        if len(set(self.preferred_batch_sizes)) != len(self.preferred_batch_sizes):
            raise ValueError("preferredBatchSizes has duplicates")
        return self


class CandidateLayout(str, Enum):
    batch = "batch"
    padded = "padded"


class Candidates(ApiModel):
    """Where a request's candidates are, so that requests with different candidate counts batch."""
    layout: Annotated[CandidateLayout, Field(description=(
        "`batch`: each candidate is one batch item (per-user inputs repeated per candidate), so a "
        "request of N candidates is a batch of N and Triton's dynamic batcher joins requests of any N "
        "up to maxBatchSize candidates (recommended). `padded`: the model takes a fixed candidate count "
        "(dims without -1) and clients pad every request to it, so all requests share one shape."))]
    min_per_request: Annotated[int, Field(ge=1, le=4096, description=(
        "Fewest candidates a request carries; gate samples span minPerRequest..maxPerRequest."))] = 1
    max_per_request: Annotated[int | None, Field(ge=1, le=4096, description=(
        "Most candidates a request carries; required with layout `batch`, where it must be <= "
        "batching.maxBatchSize (Triton refuses a request larger than max_batch_size)."))] = None

    @model_validator(mode="after")
    def _range(self) -> "Candidates":
        if self.layout is CandidateLayout.batch and self.max_per_request is None:
            raise ValueError("candidates.maxPerRequest is required with layout batch (the most candidates "
                             "one request carries)")
        if self.max_per_request is not None and self.min_per_request > self.max_per_request:
            raise ValueError(f"candidates.minPerRequest {self.min_per_request} exceeds maxPerRequest "
                             f"{self.max_per_request}")
        return self


class ModelWarmup(ApiModel):
    batch_sizes: Annotated[list[Annotated[int, Field(ge=1, le=4096)]], Field(
        default_factory=list, max_length=16,
        description="Batch sizes Triton runs with random data at load (model_warmup); each <= maxBatchSize.")]


class SamplesSource(ApiModel):
    config_map: Annotated[str | None, Field(pattern=bounds.DNS_SUBDOMAIN, max_length=bounds.DNS_SUBDOMAIN_MAX, description=(
        "ConfigMap in the model's namespace holding JSON Lines requests under key `samples.jsonl`. "
        "Omit to generate random requests from the input spec."))] = None
    key: Annotated[str, Field(pattern=bounds.CONFIG_MAP_KEY, max_length=bounds.DNS_SUBDOMAIN_MAX,
                              description="Key in the ConfigMap.")] = "samples.jsonl"


class LatencyJudge(str, Enum):
    server = "server"
    client = "client"


class WarmupGate(ApiModel):
    requests: Annotated[int, Field(ge=1, le=1_000_000, description="Requests replayed against the canary.")] = 2000
    concurrency: Annotated[int, Field(ge=1, le=256, description="Requests in flight.")] = 8
    max_p99_ms: Annotated[float, Field(gt=0, description="Warm P99 bound (ms) the canary must meet.")] = 15.0
    judge_on: Annotated[LatencyJudge, Field(description=(
        "Whose P99 is held to maxP99Ms: `server` (Triton's own, from its metrics port: the gate first waits "
        "up to 70 s for Triton's 60 s latency window to drop the load-time and cold requests) or `client` "
        "(the gate's own, round trips included, with no wait; Triton's numbers are still reported)."))] = \
        LatencyJudge.server
    samples: SamplesSource = Field(default_factory=SamplesSource, description=(
        "Requests the warmup gate replays: recorded ones from a ConfigMap, or random ones from the input spec."))
    pod_annotations: bounds.pod_annotations(
        "Annotations added to this gate's Job pods, over rollout.gateJobs.podAnnotations.")


class TorchscriptReference(ApiModel):
    torchscript_uri: Annotated[str, Field(pattern=REFERENCE_URI, max_length=bounds.URI_MAX, description=(
        "The original TorchScript model (a .pt file URI: s3://, gs://, https://, or file:// where the tenant "
        "policy allows it) to compare the candidate against, fetched with spec.modelCredentialsSecret."),
        json_schema_extra={"x-kubernetes-validations": [{
            "rule": "!self.startsWith('pvc://')",
            "message": "torchscriptUri cannot be pvc://: the gate Job fetches the reference and mounts no claim; "
                       "put the .pt file in s3://, gs:// or https://"}]})]


class EquivalenceGate(ApiModel):
    reference: Annotated[Union[Annotated[str, Field(pattern=r"^(stable|[a-z0-9]([a-z0-9.-]{0,18}[a-z0-9])?)$")],
                               TorchscriptReference], Field(description=(
        "What the candidate is compared with: `stable` (the serving version), the name of an "
        "entry of versions[], or {torchscriptUri: ...} for the original model."),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})] = "stable"
    samples: SamplesSource = Field(default_factory=SamplesSource, description=(
        "Requests sent to both the reference and the candidate: recorded ones from a ConfigMap, or random "
        "ones from the input spec."))
    output: Annotated[str | None, Field(pattern=TENSOR_NAME, max_length=128, description=(
        "Score output to compare; default the first output."))] = None
    abs_tolerance: Annotated[float, Field(ge=0, description="Max absolute score error.")] = 1e-3
    rel_tolerance: Annotated[float, Field(ge=0, description="Max relative score error.")] = 1e-2
    top_k: Annotated[int, Field(ge=1, le=10_000, description="K for the top-K overlap.")] = 50
    min_top_k_overlap: Annotated[float, Field(ge=0, le=1, description="Minimum mean top-K overlap.")] = 0.95
    min_rank_correlation: Annotated[float, Field(ge=-1, le=1, description=(
        "Minimum mean per-request rank correlation (Kendall tau)."))] = 0.9
    pod_annotations: bounds.pod_annotations(
        "Annotations added to this gate's Job pods, over rollout.gateJobs.podAnnotations.")


class TrafficMode(str, Enum):
    replicas = "replicas"
    gateway_api = "gatewayAPI"
    openshift_route = "openshiftRoute"


class CanaryStep(ApiModel):
    weight: Annotated[int, Field(ge=1, le=99, description="Percent of traffic the canary gets in this step.")]
    duration_seconds: Annotated[int, Field(ge=0, le=7 * 24 * 3600, description=(
        "How long the step holds its weight; the canary analysis judges this step's own window."))]


class NoVerdictPolicy(str, Enum):
    rollback = "rollback"
    hold = "hold"
    promote = "promote"


class CanaryCapacity(str, Enum):
    surge = "surge"
    replace = "replace"


class CanaryAnalysis(ApiModel):
    """Bounds the canary is held to while it serves, from each serving pod's Triton metrics."""
    enabled: Annotated[bool, Field(description=(
        "Judge the canary on Triton's own numbers while it serves; off: the canary is only held for its "
        "duration."))] = True
    max_failure_ratio: Annotated[float, Field(ge=0, le=1, description=(
        "Failed / all requests of the canary in the window, requests Triton shed (rejected from its queue) "
        "left out of both; above it the canary is rolled back."))] = 0.01
    max_p99_ms: Annotated[float | None, Field(gt=0, le=3_600_000, description=(
        "Absolute bound on the canary's server-side P99 (ms); default slo.p99LatencyMs."))] = None
    max_p99_vs_stable: Annotated[float | None, Field(ge=1, le=1000, description=(
        "Bound on canary P99 / stable P99 measured over the same window; null: not compared."))] = 1.5
    min_requests: Annotated[int, Field(ge=1, le=10_000_000, description=(
        "Canary requests a step's window needs before it can be judged, and requests served (not shed, not "
        "failed) before it can pass; with fewer, the step's hold is extended (up to maxExtensionSeconds) "
        "until the canary has served that many."))] = 100
    max_avg_queue_ms: Annotated[float | None, Field(gt=0, le=3_600_000, description=(
        "Bound on the canary's average time in Triton's queue (ms, from nv_inference_queue_duration_us) in "
        "the window; null: not bounded."))] = None
    max_avg_queue_vs_stable: Annotated[float | None, Field(ge=1, le=1000, description=(
        "Bound on canary / stable average queue time over the same window; null: not compared."))] = None
    max_shed_ratio_vs_stable: Annotated[float | None, Field(ge=0, le=1, description=(
        "Bound on how much more of its requests the canary may shed than the stable in the same window, "
        "as a difference of shed ratios (requests Triton rejected from its queue: "
        "nv_inference_request_failure reason REJECTED, / all requests): 0.02 fails a canary shedding 3% "
        "beside a stable shedding 0.5%, not one shedding 30% beside a stable shedding 30% (a spike both "
        "share). The difference must also exceed what chance allows at the window's request counts. Shed "
        "requests are never counted in maxFailureRatio. null: not compared."))] = 0.02
    max_extension_seconds: Annotated[int, Field(ge=0, le=7 * 24 * 3600, description=(
        "How long past a step's durationSeconds its hold is extended while the analysis has no verdict "
        "(too few canary requests, or no pod's metrics could be read); then onNoVerdict decides."))] = 600
    on_no_verdict: Annotated[NoVerdictPolicy, Field(description=(
        "What happens to a step whose analysis still has no verdict at the end of its extension: `rollback` "
        "(the default), `hold` (the rollout waits for a person: annotation rankops.io/promote or "
        "rankops.io/abort, said in status and an Event) or `promote` (moves on without a verdict, recorded "
        "in status.gates as such). With enabled: false the canary is held for its duration alone."))] = NoVerdictPolicy.rollback


class Canary(ApiModel):
    weight: Annotated[int, Field(ge=1, le=99, description=(
        "Percent of traffic the canary gets (the single step when steps is empty)."))] = 10
    duration_seconds: Annotated[int, Field(ge=0, le=7 * 24 * 3600, description=(
        "How long the canary holds its weight before promotion (the single step when steps is empty)."))] = 600
    steps: Annotated[list[CanaryStep], Field(max_length=20, description=(
        "Progressive weights: the canary takes each step's weight for its duration, judged on that step's "
        "own window, then the next; promoted after the last. Empty: one step of weight for durationSeconds."))] = []
    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis, description=(
        "Canary analysis while it serves: failure ratio and server-side P99 against bounds and the stable's."))
    traffic: Annotated[TrafficMode, Field(description=(
        "How the weight is honoured: `replicas` (ratio of Ready pods behind the shared Service, approximate), "
        "`gatewayAPI` (HTTPRoute backend weights, exact) or `openshiftRoute` (Route alternateBackends)."))] = TrafficMode.replicas
    capacity: Annotated[CanaryCapacity, Field(description=(
        "Where the canary's GPUs come from: `surge` (beside all stable replicas: needs room for the canary's "
        "pods) or `replace` (the canary takes stable replicas' GPUs: from the canary's start to the end of "
        "the rollout the stable runs that many fewer, at most planning.failureTolerance of them (1 without "
        "planning) and never its last; for GPU-tight clusters)."))] = CanaryCapacity.surge
    parent_ref: Annotated[str | None, Field(pattern=bounds.PARENT_REF, max_length=bounds.DNS_SUBDOMAIN_MAX + 64, description=(
        "gatewayAPI mode: the Gateway (name or namespace/name) the HTTPRoute attaches to."))] = None

    def step_plan(self) -> list[CanaryStep]:
        """The steps the canary goes through: `steps`, or one of `weight` for `durationSeconds`."""
        return list(self.steps) or [CanaryStep(weight=self.weight, duration_seconds=self.duration_seconds)]


class RolloutStrategy(str, Enum):
    pods = "pods"
    in_place = "inPlace"


class InPlace(ApiModel):
    """rollout.strategy inPlace: a new version loaded beside the serving one in the running pods."""
    max_stable_p99_ms: Annotated[float | None, Field(gt=0, le=3_600_000, description=(
        "While a version loads or warms in a pod that serves, the serving version's server-side P99 (ms, "
        "Triton's summary over its pods' last minute) is held within this; past it the switch stops, the new "
        "version is unloaded and the rollout goes on with pods (said in status.rollout and an Event). "
        "Default slo.p99LatencyMs; without an slo, 1000."))] = None
    load_timeout_seconds: Annotated[int, Field(ge=30, le=86_400, description=(
        "How long one pod may take to hold the new version READY (the artifact fetched beside Triton, "
        "Triton's load and its model_warmup); past it the switch falls back to pods."))] = 600


class GateResources(ApiModel):
    """What a gate Job's container asks for. The replay and the comparison are light; the
    equivalence gate holds the reference's and the canary's scores of every batch."""
    cpu: bounds.cpu_quantity(
        "CPU request of a gate's container (no limit: a gate that finishes sooner frees the node sooner). "
        "Lower it where a namespace's quota or a small node cannot give a whole core.") = "1"
    memory: bounds.memory_quantity("Memory request of a gate's container; its limit is memoryLimit.") = "1Gi"
    memory_limit: bounds.memory_quantity(
        "Memory limit of a gate's container: a TorchScript reference is loaded in it.") = "4Gi"

    @model_validator(mode="after")
    def _limit_covers_request(self) -> "GateResources":
        if bounds.quantity(self.memory_limit) < bounds.quantity(self.memory):
            raise ValueError(f"rollout.gateJobs.resources.memoryLimit {self.memory_limit} is below memory "
                             f"{self.memory}: raise memoryLimit to at least the request")
        return self


class GateJobs(ApiModel):
    image: Annotated[str, Field(pattern=bounds.IMAGE_REFERENCE, max_length=bounds.IMAGE_REFERENCE_MAX,
                                description="Image running `rankops gate ...` (images/Dockerfile, target gates).")] = DEFAULT_GATES_IMAGE
    timeout_seconds: Annotated[int, Field(ge=30, le=24 * 3600, description=(
        "A gate Job that has not finished by then fails the rollout (Job activeDeadlineSeconds)."))] = 900
    pod_annotations: bounds.pod_annotations("Annotations added to gate Job pods.")
    resources: GateResources = Field(default_factory=GateResources, description=(
        "CPU and memory of a gate Job's container."), json_schema_extra={"x-kubernetes-validations": [{
            "rule": "!has(self.memoryLimit) || !has(self.memory) || "
                    "quantity(self.memoryLimit).compareTo(quantity(self.memory)) >= 0",
            "message": "rollout.gateJobs.resources.memoryLimit must be at least memory"}]})


class Rollout(ApiModel):
    warmup: WarmupGate = Field(default_factory=WarmupGate, description=(
        "First gate: replay requests against the canary until warm; it passes when none fails and the warm "
        "P99 is within maxP99Ms."))
    equivalence: EquivalenceGate = Field(default_factory=EquivalenceGate, description=(
        "Second gate: the canary's scores and rankings against the reference's, within the tolerances."))
    canary: Canary = Field(default_factory=Canary, description=(
        "After both gates pass: the share of traffic the new version gets, how, and for how long before promotion."))
    gate_jobs: GateJobs = Field(default_factory=GateJobs, description=(
        "The Jobs that run the gates: image, deadline and pod annotations."))
    paused: Annotated[bool, Field(description="Freeze the rollout where it is: no phase changes, except that a canary failing its analysis is still rolled back (abort works too).")] = False
    strategy: Annotated[RolloutStrategy, Field(description=(
        "How a new version reaches the GPUs: `pods` (a canary Deployment on GPUs of its own, then the stable "
        "pods restarted with it) or `inPlace` (loaded beside the serving version inside the running Triton "
        "pods, gated on one pod, then switched pod by pod; no pod restarts and no extra GPU). inPlace is "
        "used when both versions fit one GPU by the plan's memory arithmetic and one Triton model can hold "
        "both (same format, precision and TensorRT); otherwise, and when a load interferes past "
        "inPlace.maxStableP99Ms, the rollout uses pods and says why. See docs/in-place.md."))] = RolloutStrategy.pods
    in_place: InPlace = Field(default_factory=InPlace, description=(
        "strategy inPlace: the serving version's P99 bound while a version loads, and the load's deadline."))

    @property
    def switches_in_place(self) -> bool:
        """strategy inPlace: the one test of it (the switch is still decided per rollout, by the memory)."""
        return self.strategy is RolloutStrategy.in_place


class WarmReplicas(ApiModel):
    enabled: Annotated[bool, Field(description=(
        "Every Triton pod (stable, canary, reference; at every start) gets a `warm` container that replays "
        "the warmup requests against its own Triton and keeps the pod un-Ready until a round's P99 is within "
        "maxP99Ms. Costs start time (the replay, seconds) and the container's 250m CPU and 192Mi memory (more "
        "for large requests) per pod; see docs/warm-replicas.md."))] = True
    requests: Annotated[int, Field(ge=1, le=100_000, description="Warm requests per round.")] = 200
    concurrency: Annotated[int, Field(ge=1, le=64, description="Requests in flight while warming.")] = 2
    max_p99_ms: Annotated[float | None, Field(gt=0, description=(
        "A round whose client P99 (ms) is within this, with no error, makes the pod warm; default "
        "rollout.warmup.maxP99Ms."))] = None
    deadline_seconds: Annotated[int, Field(ge=10, le=3600, description=(
        "A pod still not warm after this long warming goes Ready anyway and says so in its log (a model "
        "slower than its bound must not lose every replica); never one whose last round failed more than "
        "maxErrorRatio."))] = 300
    max_error_ratio: Annotated[float, Field(ge=0, lt=1, description=(
        "A round failing more than this share of its requests is a failing round; 3 in a row (or one at "
        "the deadline) keep the pod un-Ready: its warm container exits with the reason, which the model's "
        "Degraded condition (WarmupFailing) and an Event name. Rounds with errors back off (1 s doubling, "
        "at most 30 s)."))] = 0.01


class Resources(ApiModel):
    cpu: bounds.cpu_quantity(
        "CPU per replica (request = limit, so the kubelet can pin it NUMA-local to the GPU). Size it "
        "for pre/post-processing and the batcher; dedicated GPU hosts often give 8 cores per GPU.") = "2"
    memory: bounds.memory_quantity(
        "Memory per replica (request = limit). Embedding tables kept on the CPU count here.") = "8Gi"


class FetchLimits(ApiModel):
    """Bounds of `rankops fetch-model` (the serving pods' init container, the gate's reference)."""
    deadline_seconds: Annotated[int, Field(ge=30, le=86_400, description=(
        "The most seconds one fetch of the artifact may take in all (listing, download, retries); past it "
        "the init container fails with a line saying so and restarts."))] = 1800
    stall_seconds: Annotated[int, Field(ge=5, le=3600, description=(
        "A read of a body that gets no byte for this long fails and is retried (within deadlineSeconds)."))] = 60
    first_byte_seconds: Annotated[int | None, Field(ge=1, le=3600, description=(
        "A request (a listing page, a download) whose answer has not begun this long after it was sent fails "
        "and is retried, 3 attempts in all: a hung store fails the init container after about 3 times this. "
        "Unset: 20, or stallSeconds when that is lower (object stores answer within a second; a body may "
        "pause longer on a congested path)."))] = None

    @model_validator(mode="after")
    def _stall_within_deadline(self) -> "FetchLimits":
        if self.stall_seconds > self.deadline_seconds:
            raise ValueError("fetch.stallSeconds must not exceed fetch.deadlineSeconds")
        if self.first_byte_seconds is not None and self.first_byte_seconds > self.deadline_seconds:
            raise ValueError("fetch.firstByteSeconds must not exceed fetch.deadlineSeconds")
        return self

    def args(self) -> list[str]:
        # --first-byte-s only when set: unset, the fetcher's own default applies and the pods'
        # template (so its hash) is what it was before the field existed.
        first_byte = ["--first-byte-s", str(self.first_byte_seconds)] if self.first_byte_seconds is not None else []
        return ["--deadline-s", str(self.deadline_seconds), "--stall-s", str(self.stall_seconds), *first_byte]


QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"


class Storage(ApiModel):
    """Node disk a Triton pod may use: each size is the emptyDir's sizeLimit and counts in the pod's
    ephemeral-storage request and limit, so the scheduler places it where the disk is free and the
    kubelet evicts it (instead of filling the node) when a download or Triton outgrows it."""
    model_volume_size: Annotated[str, bounds.storage_check(
        "storage.modelVolumeSize", bounds.MODEL_VOLUME_MIN, bounds.MODEL_VOLUME_MAX), Field(
        pattern=QUANTITY, max_length=32,
        json_schema_extra={"x-kubernetes-validations": bounds.storage_rules(
            "storage.modelVolumeSize", bounds.MODEL_VOLUME_MIN, bounds.MODEL_VOLUME_MAX)}, description=(
            "The model repository volume (what fetch-model downloads: the largest version's artifact, with "
            "room to spare): its sizeLimit, and the fetch-model init container's ephemeral-storage request "
            "and limit. A download that would pass it fails the init container."))] = "10Gi"
    tmp_size: Annotated[str, bounds.storage_check("storage.tmpSize", bounds.TMP_MIN, bounds.TMP_MAX), Field(
        pattern=QUANTITY, max_length=32,
        json_schema_extra={"x-kubernetes-validations": bounds.storage_rules(
            "storage.tmpSize", bounds.TMP_MIN, bounds.TMP_MAX)}, description=(
            "Triton's /tmp (TensorRT engines built at load are cached there): its sizeLimit, added to the "
            "Triton container's ephemeral-storage request and limit."))] = "2Gi"


class PolicyPeer(ApiModel):
    """Pods allowed to reach the model's Triton (matchLabels only). podSelector alone: pods of the
    model's namespace; namespaceSelector alone: every pod of those namespaces; both: those pods of
    those namespaces. `{}` selects all."""
    pod_selector: Annotated[bounds.LabelMap | None, Field(
        description="Labels the client pods carry (matchLabels).")] = None
    namespace_selector: Annotated[bounds.LabelMap | None, Field(description=(
            "Labels of the client pods' namespaces (matchLabels; kubernetes.io/metadata.name names one)."))] = None

    @model_validator(mode="after")
    def _selects_something(self) -> "PolicyPeer":
        if self.pod_selector is None and self.namespace_selector is None:
            raise ValueError("networkPolicy: a peer needs podSelector, namespaceSelector or both")
        return self


PEER_RULES = [{"rule": "has(self.podSelector) || has(self.namespaceSelector)",
               "message": "networkPolicy: a peer needs podSelector, namespaceSelector or both"}]
NETWORK_PEERS_MAX = 16


class NetworkPolicySpec(ApiModel):
    """An ingress NetworkPolicy on the model's Triton pods (where the cluster's network plugin
    enforces them): its clients on the inference ports only, the operator on the metrics port."""
    enabled: Annotated[bool, Field(description=(
        "Render the model's NetworkPolicy (<model>-triton). Triton pods then take connections only from "
        "`clients` on 8000/8001, from `metricsClients` and the operator's namespace on 8002, and from the "
        "model's own pods (gates, warm) on all three."))] = False
    clients: Annotated[list[Annotated[PolicyPeer, Field(json_schema_extra={"x-kubernetes-validations": PEER_RULES})]],
                       Field(max_length=NETWORK_PEERS_MAX, description=(
        "Pods that may send requests (HTTP 8000, gRPC 8001). Empty: every pod of the model's namespace."))] = []
    metrics_clients: Annotated[list[Annotated[PolicyPeer, Field(json_schema_extra={"x-kubernetes-validations": PEER_RULES})]],
                               Field(max_length=NETWORK_PEERS_MAX, description=(
        "Pods that may scrape Triton's metrics (8002) besides the operator, e.g. your Prometheus."))] = []


class NodeSpread(str, Enum):
    preferred = "preferred"
    required = "required"


# PriorityClass names with this prefix are Kubernetes' own (system-node-critical,
# system-cluster-critical): never a tenant's to take.
RESERVED_PRIORITY_PREFIX = "system-"


class Disruption(ApiModel):
    """How the model's replicas are kept apart, kept up and let go when nodes are drained or lost."""
    priority_class_name: Annotated[str | None, Field(
        pattern=bounds.DNS_SUBDOMAIN, max_length=bounds.DNS_SUBDOMAIN_MAX, description=(
            "PriorityClass of the Triton pods (an existing one; the cluster admin limits who may use which with "
            "ResourceQuota scopes). A higher priority lets the scheduler preempt lower-priority pods for a GPU "
            "when a replica is replaced. Names starting with `system-` are Kubernetes' own and refused."))] = None
    unreachable_toleration_seconds: Annotated[int, Field(ge=0, le=3600, description=(
        "How long a replica stays bound to a node that is NotReady or unreachable (NoExecute tolerations of "
        "node.kubernetes.io/not-ready and node.kubernetes.io/unreachable) before it is evicted and replaced "
        "elsewhere; counted from when the node lifecycle controller marks the node (its "
        "node-monitor-grace-period, 50 s by default, after the last heartbeat). Kubernetes' own default is "
        "300 s."))] = 30
    node_spread: Annotated[NodeSpread, Field(description=(
        "How replicas of a track are spread over nodes (kubernetes.io/hostname, max skew 1; zones are always "
        "preferred): `preferred` (the scheduler spreads them where it can and stacks them where GPUs are free "
        "only on one node, so a small or busy pool still schedules) or `required` (a replica is never placed "
        "on a node that already has more of the track's replicas than another eligible node; it stays Pending "
        "instead, e.g. when only the fuller node has a free GPU)."))] = NodeSpread.preferred
    pre_stop_delay_seconds: Annotated[int, Field(ge=0, le=120, description=(
        "A Triton pod that is deleted or evicted waits this long (a preStop hook) before Triton is told to "
        "stop, so that Services and load balancers have removed its endpoint and send it no new request. "
        "0: no hook."))] = 5
    exit_timeout_seconds: Annotated[int, Field(ge=1, le=3600, description=(
        "Triton's --exit-timeout-secs: after the stop signal, how long Triton waits for the requests in "
        "flight to finish before it exits anyway."))] = 15
    termination_grace_period_seconds: Annotated[int | None, Field(ge=1, le=7200, description=(
        "The pods' terminationGracePeriodSeconds: the most a pod takes to go, preStop delay included, after "
        "which it is killed. It must cover preStopDelaySeconds + exitTimeoutSeconds; unset, it is that sum "
        "plus 5 s."))] = None

    @field_validator("priority_class_name")
    @classmethod
    def _not_reserved(cls, value: str | None) -> str | None:
        if value and value.startswith(RESERVED_PRIORITY_PREFIX):
            raise ValueError(f"disruption.priorityClassName {value!r}: system- priority classes are reserved "
                             "for Kubernetes' own components")
        return value

    @model_validator(mode="after")
    def _grace_covers_exit(self) -> "Disruption":
        needed = self.pre_stop_delay_seconds + self.exit_timeout_seconds
        if self.termination_grace_period_seconds is not None and self.termination_grace_period_seconds < needed:
            raise ValueError(f"disruption.terminationGracePeriodSeconds {self.termination_grace_period_seconds} "
                             f"must cover preStopDelaySeconds {self.pre_stop_delay_seconds} + exitTimeoutSeconds "
                             f"{self.exit_timeout_seconds} = {needed} (or leave it unset)")
        return self

    def grace_period_seconds(self) -> int:
        # 5 s past Triton's own exit timeout: the warm container and the kill itself.
        return self.termination_grace_period_seconds or self.pre_stop_delay_seconds + self.exit_timeout_seconds + 5


DISRUPTION_RULES = [
    {"rule": "!has(self.terminationGracePeriodSeconds) || !has(self.preStopDelaySeconds) || "
             "!has(self.exitTimeoutSeconds) || "
             "self.terminationGracePeriodSeconds >= self.preStopDelaySeconds + self.exitTimeoutSeconds",
     "message": "disruption.terminationGracePeriodSeconds must cover preStopDelaySeconds + exitTimeoutSeconds",
     "fieldPath": ".terminationGracePeriodSeconds"},
    # On the object: an optional field's own rules do not survive the schema's null collapse.
    {"rule": f"!has(self.priorityClassName) || !self.priorityClassName.startsWith('{RESERVED_PRIORITY_PREFIX}')",
     "message": "disruption.priorityClassName: system- priority classes are reserved for Kubernetes' own components",
     "fieldPath": ".priorityClassName"},
]


class RankingModelSpec(ApiModel):
    server: Annotated[str | None, Field(pattern=bounds.DNS_LABEL, max_length=bounds.SERVER_NAME_MAX, description=(
        "SharedServer, in this namespace, whose pods serve this model beside its other members (docs/shared-server.md): "
        "the model gets no pods of its own, keeps its config.pbtxt, Service, SLO and status, and is loaded into "
        "the server's running pods. Set when the model is created and never changed."))] = None
    node_pool: Annotated[str | None, Field(pattern=bounds.DNS_SUBDOMAIN, max_length=bounds.DNS_SUBDOMAIN_MAX, description=(
        "GpuNodePool whose validated nodes serve this model. Without one, any node with "
        "nvidia.com/gpu capacity may be used."))] = None
    replicas: Annotated[int, Field(ge=0, le=1000, description="Serving replicas of the stable version.")] = 1
    gpus_per_replica: Annotated[int, Field(ge=1, le=16, description="nvidia.com/gpu per replica.")] = 1
    instances_per_gpu: Annotated[int, Field(ge=1, le=16, description="Triton instance_group count per GPU.")] = 1
    triton_image: Annotated[str, Field(
        pattern=bounds.IMAGE_REFERENCE, max_length=bounds.IMAGE_REFERENCE_MAX,
        description="Triton Inference Server image.")] = DEFAULT_TRITON_IMAGE
    fetcher_image: Annotated[str, Field(pattern=bounds.IMAGE_REFERENCE, max_length=bounds.IMAGE_REFERENCE_MAX, description=(
        "Image whose `rankops fetch-model` copies s3/gs/https artifacts into the model repository "
        "(any rankops image carries it; the default is the operator's, which has no torch)."))] = DEFAULT_FETCHER_IMAGE
    model_credentials_secret: Annotated[str | None, Field(
        pattern=bounds.DNS_SUBDOMAIN, max_length=bounds.DNS_SUBDOMAIN_MAX, description=(
            "Secret in the model's namespace whose keys become environment of the fetcher (e.g. "
            "AWS_ACCESS_KEY_ID). The operator checks it exists before serving a version that needs it."))] = None
    fetch: FetchLimits = Field(default_factory=FetchLimits, description=(
        "Time bounds of the artifact fetch (the Triton pods' fetch-model init container and the "
        "equivalence gate's reference)."), json_schema_extra={"x-kubernetes-validations": [{
            "rule": "!has(self.stallSeconds) || !has(self.deadlineSeconds) || self.stallSeconds <= self.deadlineSeconds",
            "message": "fetch.stallSeconds must not exceed fetch.deadlineSeconds"}]})
    version: Annotated[str, Field(pattern=VERSION_NAME, max_length=20, description=(
        "The version that should serve; must name an entry of versions. Changing it starts a gated rollout."))]
    versions: Annotated[list[ModelVersion], Field(min_length=1, max_length=32, description="Known versions.",
        json_schema_extra={"x-kubernetes-validations": [{
            "rule": "self.all(v, v.format == 'tensorrt_plan' || (!has(v.tensorrtVersion) && !has(v.builtWithTriton)))",
            "message": "tensorrtVersion and builtWithTriton describe a TensorRT engine: set them only on "
                       "versions with format tensorrt_plan"}]})]
    inputs: Annotated[list[TensorSpec], Field(min_length=1, max_length=32, description=(
        "Input tensors (user and candidate features as separate inputs)."))]
    outputs: Annotated[list[TensorSpec], Field(min_length=1, max_length=32, description="Output tensors.")]
    batching: Annotated[Union[Literal["auto"], Batching], Field(description=(
        "Dynamic batching: explicit values, or `auto` to derive them from slo + planning."),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]
    candidates: Annotated[Candidates | None, Field(description=(
        "Where the candidates of a request are (see docs: what batches). Without it, an input with a "
        "variable first dim (-1) carries the candidates inside each request, and Triton batches only "
        "requests with the same candidate count: rankops reports that as a problem."))] = None
    model_warmup: ModelWarmup = Field(default_factory=ModelWarmup, description=(
        "Triton's own model_warmup at load, so the first real requests do not pay for lazy initialisation."))
    response_cache: Annotated[bool, Field(description="Triton response cache for this model.")] = False
    slo: Annotated[Slo | None, Field(description="Latency budget and target load.")] = None
    planning: Annotated[Planning | None, Field(description="Inputs for batching: auto and the capacity plan.")] = None
    rollout: Rollout = Field(default_factory=Rollout, description=(
        "How a new spec.version is rolled out: warmup and equivalence gates, then a canary, then promotion; "
        "a failed step rolls back."))
    resources: Resources = Field(default_factory=Resources, description=(
        "CPU and memory per serving replica (GPUs come from gpusPerReplica)."))
    latency_isolation: Annotated[bool, Field(description=(
        "Render the Triton pods Guaranteed in every container (init containers too: requests equal "
        "limits, whole CPUs for Triton and the fetcher), so a kubelet with the static CPU manager and the "
        "topology manager gives Triton exclusive cores on its GPU's NUMA node; Triton's CPU thread pools "
        "are sized to resources.cpu. Needs a whole number of CPUs."))] = False
    warm_replicas: WarmReplicas = Field(default_factory=WarmReplicas, description=(
        "Warm every replica before it takes traffic: a `warm` container beside Triton in every pod."))
    pod_annotations: bounds.pod_annotations("Annotations added to Triton pods.")
    disruption: Disruption = Field(default_factory=Disruption, description=(
        "Drains, node failures and pod exits: the priority class, how long replicas stay on a lost node, "
        "how they spread over nodes, and how a Triton pod finishes its requests before it goes. The stable "
        "track's PodDisruptionBudget follows planning.failureTolerance (docs/disruptions.md)."),
        json_schema_extra={"x-kubernetes-validations": DISRUPTION_RULES})
    storage: Storage = Field(default_factory=Storage, description=(
        "Node disk of each Triton pod: the model volume and /tmp, requested, limited and size-capped."))
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec, description=(
        "An optional ingress NetworkPolicy: who may reach the model's Triton pods, on which ports."))
    autoscaling: Autoscaling = Field(default_factory=Autoscaling, description=(
        "Stable replicas that follow the load: decided by rankops from Triton's own counters against the "
        "per-replica capacity that holds the P99 budget, or left to your HorizontalPodAutoscaler / KEDA "
        "ScaledObject (mode external); docs/autoscaling.md."),
        json_schema_extra={"x-kubernetes-validations": AUTOSCALING_RULES})

    @field_validator("batching", mode="before")
    @classmethod
    def _batching_word(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"batching must be `auto` or an object with maxBatchSize, not {value!r}")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> "RankingModelSpec":
        names = [v.name for v in self.versions]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"versions: duplicate names {dup}")
        if self.version not in names:
            raise ValueError(f"version {self.version!r} must name an entry of versions (have: {names})")
        for i, t in enumerate(self.inputs):
            if -1 in t.dims and t.max_dims is None:
                raise ValueError(f"inputs[{i}] ({t.name}): dims {t.dims} has -1, so maxDims is required "
                                 f"(e.g. maxDims: {[500 if d == -1 else d for d in t.dims]})")
        tensor_names = [t.name for t in self.inputs + self.outputs]
        dup = sorted({n for n in tensor_names if tensor_names.count(n) > 1})
        if dup:
            raise ValueError(f"inputs/outputs: duplicate tensor names {dup}")
        for problem in self.tensor_size_problems():
            raise ValueError(problem)
        if isinstance(self.batching, Batching):
            too_big = [b for b in self.model_warmup.batch_sizes if b > self.batching.max_batch_size]
            if too_big:
                raise ValueError(f"modelWarmup.batchSizes {too_big} exceed batching.maxBatchSize "
                                 f"{self.batching.max_batch_size}")
        elif self.slo is None or self.planning is None or self.planning.latency_profile is None and \
                self.planning.latency_profile_config_map is None:
            raise ValueError("batching: auto needs slo and planning.latencyProfile (or "
                             "planning.latencyProfileConfigMap) to plan from")
        self._check_candidates()
        if self.latency_isolation and bounds.quantity(self.resources.cpu) % 1:
            raise ValueError(f"latencyIsolation needs whole CPUs: resources.cpu {self.resources.cpu!r} would leave "
                             "Triton in the shared CPU pool (the static CPU manager pins only integer requests)")
        ref = self.rollout.equivalence.reference
        if isinstance(ref, str) and ref != "stable" and ref not in names:
            raise ValueError(f"rollout.equivalence.reference {ref!r} must be `stable`, a versions[] name "
                             f"({names}) or {{torchscriptUri: ...}}")
        if self.rollout.equivalence.output and self.rollout.equivalence.output not in [o.name for o in self.outputs]:
            raise ValueError(f"rollout.equivalence.output {self.rollout.equivalence.output!r} is not an output")
        if self.rollout.switches_in_place:
            for i, v in enumerate(self.versions):
                scheme = v.model_uri.split("://", 1)[0].lower()
                if scheme in ("pvc", "file"):
                    raise ValueError(
                        f"rollout.strategy inPlace: versions[{i}] ({v.name}) is {scheme}://, mounted into the pod "
                        "template per version, so switching it means new pods; give it an s3:// or https:// "
                        "artifact the pods fetch, or use rollout.strategy pods")
        return self

    @model_validator(mode="after")
    def _autoscaling_capacity(self) -> "RankingModelSpec":
        scaling = self.autoscaling
        if scaling.by_rankops and scaling.capacity_per_replica_qps is None and not self.has_plan_inputs():
            raise ValueError("autoscaling.capacityPerReplicaQps is required with autoscaling.enabled (mode rankops) "
                             "unless the model has slo and planning.latencyProfile (or latencyProfileConfigMap), "
                             "whose plan gives the requests per second one replica sustains within the P99 budget")
        return self

    def has_plan_inputs(self) -> bool:
        """Whether the planner makes or evaluates a plan (its sustainable rate per GPU) for this spec."""
        return self.slo is not None and self.planning is not None and (
            self.planning.latency_profile is not None or self.planning.latency_profile_config_map is not None)

    def _check_candidates(self) -> None:
        if self.candidates is None:
            return
        varying = [f"inputs[{i}] ({t.name}) dims {t.dims}" for i, t in enumerate(self.inputs) if -1 in t.dims]
        if varying:
            fix = ("declare the per-candidate dims only (e.g. [32] for [-1, 32]): the batch dimension carries the "
                   "candidates" if self.candidates.layout is CandidateLayout.batch else
                   "fix the candidate dim at its maximum (e.g. [500, 32]) and pad requests to it")
            raise ValueError(f"candidates.layout {self.candidates.layout.value}: {varying[0]} has -1; {fix}")
        # batching: auto plans a maxBatchSize (counted in candidates) that holds the largest request
        if self.candidates.layout is CandidateLayout.batch and isinstance(self.batching, Batching):
            if self.candidates.max_per_request > self.batching.max_batch_size:
                raise ValueError(f"candidates.maxPerRequest {self.candidates.max_per_request} exceeds "
                                 f"batching.maxBatchSize {self.batching.max_batch_size}: with layout batch a "
                                 "request of N candidates is a batch of N, and Triton refuses one larger than "
                                 "max_batch_size; raise maxBatchSize (e.g. 4 x maxPerRequest) or lower maxPerRequest")

    def tensor_size_problems(self, max_batch_size: int | None = None,
                             batch_field: str = "batching.maxBatchSize") -> list[str]:
        """Tensors a request at the largest batch could not carry (explicit or planned batch size)."""
        if max_batch_size is None:
            max_batch_size = self.batching.max_batch_size if isinstance(self.batching, Batching) else 1
        where = [(f"inputs[{i}]", t) for i, t in enumerate(self.inputs)] + \
            [(f"outputs[{i}]", t) for i, t in enumerate(self.outputs)]
        found = (bounds.tensor_too_big(w, t.name, t.data_type.value, t.warmup_dims(), max_batch_size,
                                       batch_field) for w, t in where)
        return [p for p in found if p]

    def version_named(self, name: str) -> ModelVersion | None:
        return next((v for v in self.versions if v.name == name), None)


class GateResult(ApiModel):
    gate: Annotated[str, Field(description="warmup or equivalence.")]
    version: Annotated[str, Field(description="Version the gate judged.")]
    attempt: Annotated[str | None, Field(description=(
        "The rollout attempt the verdict belongs to (status.rollout.attempt); promotion counts only its own."))] = None
    outcome: Annotated[str, Field(description="pass, fail or error.")]
    reason: Annotated[str | None, Field(description="Why the gate decided as it did, in CamelCase, e.g. WarmP99WithinBound.")] = None
    summary: Annotated[str | None, Field(description="The numbers behind the outcome, in one line.")] = None
    metrics: Annotated[dict[str, Any] | None, Field(
        description="The gate's verdict metrics.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})] = None
    finished_at: Annotated[str | None, Field(description="When the gate's Job finished (RFC 3339).")] = None


class InPlacePhase(str, Enum):
    """status.rollout.inPlace.phase (rollout/inplace.py)."""
    loading = "Loading"
    gating = "Gating"
    promoting = "Promoting"
    unloading = "Unloading"
    switched = "Switched"
    rolling_back = "RollingBack"
    rolled_back = "RolledBack"
    falling_back = "FallingBack"
    fell_back = "FellBack"


class InPlaceSwitchStatus(ApiModel):
    """Where an in-place switch is (rollout/inplace.py's Record): what a restarted operator carries on from,
    with each pod's repository index."""
    version: Annotated[str, Field(description="The version being loaded in place.")]
    from_version: Annotated[str, Field(description="The version the pods served when the switch began.")]
    phase: Annotated[InPlacePhase, Field(description=(
        "Loading (one pod loads it beside the serving version), Gating (the gates run against that pod), "
        "Promoting (the other pods load it, one at a time), Unloading (the old version unloaded everywhere), "
        "Switched; or RollingBack/RolledBack (a gate failed, or aborted), FallingBack/FellBack (the pods "
        "strategy takes over: memory, interference, a load that failed or timed out)."))]
    since: Annotated[str, Field(description="When the phase began (RFC 3339).")]
    gate_pod: Annotated[str | None, Field(description="The pod the gates judge the version on.")] = None
    gate_pod_uid: Annotated[str | None, Field(description="Its uid: a verdict on another pod is no evidence.")] = None
    load_pod: Annotated[str | None, Field(description="The pod asked to load last.")] = None
    load_since: Annotated[str | None, Field(description="When that load was asked (RFC 3339).")] = None
    touched: Annotated[list[str], Field(max_length=1000, description=(
        "Every pod asked to load the new version (a rollback unloads it from each).")) ] = []
    message: Annotated[str | None, Field(description="What the switch is doing or why it stopped.")] = None
    failed_gate: Annotated[str | None, Field(description="The gate that failed, if one did.")] = None
    reason: Annotated[str | None, Field(description=(
        "Why it rolled back or fell back to pods, with the numbers (the memory arithmetic, the P99).")) ] = None
    served_by: Annotated[str | None, Field(max_length=1024, description=(
        "Which version the pods hold READY, as their repository indexes said at the last step, e.g. "
        "'2 on 1/3 pods, 1 on 3/3' (kubectl get rm: In-Place)."))] = None
    artifact: Annotated[str | None, Field(max_length=64, pattern=r"^[0-9a-f]+$", description=(
        "A shared server's member: digest of the incoming version's spec.versions entry (modelUri, sha256, "
        "format...) when the switch began. An edit of it mid-switch rolls the switch back: what was gated is "
        "what the pods load."))] = None
    swap: Annotated[bool | None, Field(description=(
        "A shared server's member whose new version does not fit beside the held one on the card: each pod in "
        "turn leaves the member's endpoints, has the held version unloaded and the new one loaded alone."))] = None


class RolloutStatus(ApiModel):
    # The record a rollout step works on (rollout.record.Step): changed field by field, each
    # assignment checked against its type. step() works on its own copy, never the status it read.
    model_config = ConfigDict(frozen=False, validate_assignment=True)

    version: Annotated[str, Field(description="The version being rolled out.")]
    from_version: Annotated[str | None, Field(description="The stable version when this rollout started.")] = None
    phase: Annotated[RolloutPhase, Field(description=(
        "Where the rollout is: an active phase (CanaryStarting, Warming, Verifying, Canary, Promoting, in that "
        "order), or how it ended (Promoted, RolledBack, Superseded, Canceled)."))]
    attempt: Annotated[str | None, Field(description=(
        "Id of this attempt, new for every start and retry; its gate Jobs carry it in name and labels."))] = None
    started_at: Annotated[str | None, Field(description="When this rollout attempt started (RFC 3339).")] = None
    phase_since: Annotated[str | None, Field(description="When the rollout entered its current phase (RFC 3339).")] = None
    canary_since: Annotated[str | None, Field(description="When the canary started taking traffic.")] = None
    step: Annotated[int | None, Field(ge=1, description=(
        "During Canary: the step being held, 1 for the first of rollout.canary.steps (or the single step)."))] = None
    step_since: Annotated[str | None, Field(description="When the current canary step's weight took effect.")] = None
    message: Annotated[str | None, Field(description="What the rollout is doing or why it stopped, for people.")] = None
    failed_gate: Annotated[str | None, Field(description="warmup, equivalence, canary, promotion or manual.")] = None
    retried: Annotated[str | None, Field(description=(
        "The rankops.io/retry value acted on last, kept from rollout to rollout: a value acts once."))] = None
    aborted: Annotated[str | None, Field(description=(
        "The rankops.io/abort value acted on last, kept from rollout to rollout: a value acts once."))] = None
    promoted: Annotated[str | None, Field(description=(
        "The rankops.io/promote value acted on last, kept from rollout to rollout: a value acts once."))] = None
    step_pods: Annotated[int | None, Field(ge=0, description=(
        "During Canary: the canary pods that served when the step's hold started; the hold goes on while "
        "as many serve (a stable that scales up asks for more without stopping it)."))] = None
    canary_down_since: Annotated[str | None, Field(description=(
        "During Canary: when the canary stopped serving at its step's weight (a pod lost, not Ready, not "
        "scheduled); the step's hold and its analysis window restart once it is back."))] = None
    hold_extended_since: Annotated[str | None, Field(description=(
        "During Canary: when the step's hold ended without a verdict and was extended "
        "(rollout.canary.analysis.maxExtensionSeconds)."))] = None
    awaiting_decision: Annotated[str | None, Field(description=(
        "During Canary with analysis.onNoVerdict hold: why the rollout waits for a person "
        "(annotation rankops.io/promote or rankops.io/abort)."))] = None
    analysis_problem: Annotated[str | None, Field(description=(
        "During Canary: why the canary analysis cannot judge now (pods whose metrics could not be read and "
        "why), said by Degraded (CanaryNotJudged) and its Warning Event while it lasts."))] = None
    unschedulable: Annotated[str | None, Field(description=(
        "Canary pods the scheduler cannot place, with its reason (e.g. Insufficient nvidia.com/gpu)."))] = None
    strategy: Annotated[RolloutStrategy | None, Field(description=(
        "The strategy this rollout uses: inPlace, or pods (asked, or the fallback when inPlace could not be "
        "used: inPlace.reason says why)."))] = None
    in_place: Annotated[InPlaceSwitchStatus | None, Field(description=(
        "rollout.strategy inPlace: the switch's record, kept when it fell back to pods."))] = None
    analysis_baseline: Annotated[dict[str, Any] | None, Field(
        description=("Canary analysis: each serving pod's Triton counters when the canary's traffic began (by "
                     "track and pod), the start of the window the canary is judged on; kept so a restarted "
                     "operator judges the same window."),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})] = None


class RankingModelStatus(ApiModel):
    observed_generation: Annotated[int | None, Field(description="The metadata.generation this status was computed from.")] = None
    phase: Annotated[ModelPhase | None, Field(description=(
        "The active rollout's phase while one is in flight, RolledBack while spec.version stays rolled back, "
        "Degraded while a generation cannot be applied, else Ready or Pending."))] = None
    stable_version: Annotated[str | None, Field(description="The version serving traffic.")] = None
    stable_pods_version: Annotated[str | None, Field(description=(
        "rollout.strategy inPlace: the version the stable pods were last started for. An in-place switch "
        "changes what the running pods serve and leaves it; any other change of stableVersion sets it, "
        "and the stable pods roll."))] = None
    canary_version: Annotated[str | None, Field(description="The version in canary, if any.")] = None
    canary_weight: Annotated[int | None, Field(description="Percent of traffic the canary gets now.")] = None
    replicas: Annotated[int | None, Field(description="Pods of the stable version's Deployment.")] = None
    ready_replicas: Annotated[int | None, Field(description="Ready pods of the stable version's Deployment.")] = None
    ready: Annotated[str | None, Field(description="Ready/desired replicas of the stable version, e.g. 2/2.")] = None
    rollout: Annotated[RolloutStatus | None, Field(description="The latest rollout: version, phase, attempt, timing.")] = None
    gates: Annotated[list[GateResult], Field(default_factory=list, description="Gate verdicts of the latest rollout.")]
    plan: PlanStatus | None = None
    autoscaling: Annotated[AutoscalingStatus | None, Field(description=(
        "spec.autoscaling: the load seen, the capacity per replica, the replicas decided and why."))] = None
    conditions: list[Condition] = Field(default_factory=list, description="Standard Kubernetes conditions (Ready, Degraded, ...), one per type.")


class RankingModel(ApiModel):
    __crd__ = {
        "plural": "rankingmodels",
        "singular": "rankingmodel",
        "kind": "RankingModel",
        "shortNames": ["rm"],
        "scope": "Namespaced",
        "categories": ["rankops", "all"],
        "printerColumns": [
            {"name": "Stable", "type": "string", "jsonPath": ".status.stableVersion"},
            {"name": "Canary", "type": "string", "jsonPath": ".status.canaryVersion"},
            {"name": "Weight", "type": "integer", "jsonPath": ".status.canaryWeight"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
            {"name": "In-Place", "type": "string", "jsonPath": ".status.rollout.inPlace.servedBy"},
            {"name": "Autoscaled", "type": "integer", "jsonPath": ".status.autoscaling.desiredReplicas"},
            {"name": "QPS", "type": "number", "jsonPath": ".status.autoscaling.observedQps", "priority": 1},
            {"name": "Scaling", "type": "string", "jsonPath": ".status.autoscaling.reason", "priority": 1},
            {"name": "Version", "type": "string", "jsonPath": ".spec.version", "priority": 1},
            {"name": "Pool", "type": "string", "jsonPath": ".spec.nodePool", "priority": 1},
            {"name": "Server", "type": "string", "jsonPath": ".spec.server", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        # Rules the API server checks at apply time (CEL); the pydantic validators say the same
        # for `rankops render` and for objects that slipped past an older schema.
        # Rules on `batching` (a word-or-object union, which a structural schema cannot type and
        # CEL in the CRD cannot see) run in a ValidatingAdmissionPolicy shipped beside the CRD.
        "admission": [
            {"expression": "!has(object.spec.batching) || (type(object.spec.batching) == string ? "
                           "object.spec.batching == 'auto' : (type(object.spec.batching) == map && "
                           "has(object.spec.batching.maxBatchSize) && type(object.spec.batching.maxBatchSize) == int "
                           "&& object.spec.batching.maxBatchSize >= 1 && object.spec.batching.maxBatchSize <= 4096))",
             "message": "spec.batching must be `auto` or an object with an integer maxBatchSize in 1..4096"},
            # Every rule guards the types it reads (the unions are preserve-unknown): a wrong type is
            # refused by the rule about it, never an evaluation error shown to the user.
            {"expression": "!has(object.spec.batching) || type(object.spec.batching) != map || "
                           "!has(object.spec.batching.preferredBatchSizes) || "
                           "(type(object.spec.batching.preferredBatchSizes) == list && "
                           "has(object.spec.batching.maxBatchSize) && type(object.spec.batching.maxBatchSize) == int && "
                           "object.spec.batching.preferredBatchSizes.all(b, type(b) == int && b >= 1 && "
                           "b <= object.spec.batching.maxBatchSize))",
             "message": "spec.batching.preferredBatchSizes must each be between 1 and spec.batching.maxBatchSize"},
            {"expression": "!has(object.spec.batching) || type(object.spec.batching) != map || "
                           "!has(object.spec.batching.maxQueueDelayMicroseconds) || "
                           "(type(object.spec.batching.maxQueueDelayMicroseconds) == int && "
                           "object.spec.batching.maxQueueDelayMicroseconds >= 0 && "
                           "object.spec.batching.maxQueueDelayMicroseconds <= 1000000)",
             "message": "spec.batching.maxQueueDelayMicroseconds must be an integer in 0..1000000"},
            {"expression": "!has(object.spec.candidates) || object.spec.candidates.layout != 'batch' || "
                           "!has(object.spec.candidates.maxPerRequest) || !has(object.spec.batching) || "
                           "type(object.spec.batching) != map || (has(object.spec.batching.maxBatchSize) && "
                           "type(object.spec.batching.maxBatchSize) == int && "
                           "object.spec.candidates.maxPerRequest <= object.spec.batching.maxBatchSize)",
             "message": "spec.candidates.layout batch: each request is a batch of its candidates, so an explicit "
                        "spec.batching.maxBatchSize must be >= spec.candidates.maxPerRequest (batching: auto plans one)"},
            # The unions are preserve-unknown in the CRD: bound what they may store here.
            {"expression": "!has(object.spec.batching) || type(object.spec.batching) != map || "
                           "(object.spec.batching.all(k, k in ['maxBatchSize', 'preferredBatchSizes', "
                           "'maxQueueDelayMicroseconds']) && (!has(object.spec.batching.preferredBatchSizes) || "
                           "type(object.spec.batching.preferredBatchSizes) != list || "
                           "size(object.spec.batching.preferredBatchSizes) <= 16))",
             "message": "spec.batching may only hold maxBatchSize, preferredBatchSizes (at most 16) and "
                        "maxQueueDelayMicroseconds"},
            {"expression": "!has(object.spec.rollout) || !has(object.spec.rollout.equivalence) || "
                           "!has(object.spec.rollout.equivalence.reference) || "
                           "(type(object.spec.rollout.equivalence.reference) == string ? "
                           "size(object.spec.rollout.equivalence.reference) <= 20 : "
                           "(type(object.spec.rollout.equivalence.reference) == map && "
                           "object.spec.rollout.equivalence.reference.all(k, k == 'torchscriptUri') && "
                           "has(object.spec.rollout.equivalence.reference.torchscriptUri) && "
                           "type(object.spec.rollout.equivalence.reference.torchscriptUri) == string && "
                           f"size(object.spec.rollout.equivalence.reference.torchscriptUri) <= {bounds.URI_MAX}))",
             "message": "spec.rollout.equivalence.reference must be `stable`, a version name, or "
                        f"{{torchscriptUri: ...}} with a URI of at most {bounds.URI_MAX} characters"},
            {"expression": "(object.spec.inputs + object.spec.outputs).all(t, " + bounds.tensor_bytes_cel(
                "t", "(has(object.spec.batching) && type(object.spec.batching) == map && "
                     "has(object.spec.batching.maxBatchSize) && type(object.spec.batching.maxBatchSize) == int "
                     "? object.spec.batching.maxBatchSize : 1)")
                + f" <= {bounds.TENSOR_MAX_BYTES}.0)",
             "message": "a tensor of spec.inputs/spec.outputs is over 2 GiB in a batch of spec.batching.maxBatchSize "
                        "(maxBatchSize x its dims/maxDims x its element size): a request that large cannot be "
                        "served; lower maxDims or maxBatchSize"},
        ],
        "validations": {
            "": [
                {"rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$')",
                 "message": "metadata.name must be a DNS label of at most 40 characters (child objects add "
                            "suffixes such as -canary-triton)"},
            ],
            "spec": [
                {"rule": "has(self.server) == has(oldSelf.server) && (!has(self.server) || self.server == oldSelf.server)",
                 "message": "spec.server is set when a RankingModel is created and never changed: to move a model "
                            "onto a SharedServer or off one, create a new RankingModel, move its clients to the new "
                            "Service, then delete this one", "fieldPath": ".server"},
                {"rule": "self.versions.exists(v, v.name == self.version)",
                 "message": "spec.version must name an entry of spec.versions", "fieldPath": ".version"},
                {"rule": "self.inputs.all(t, self.inputs.filter(u, u.name == t.name).size() == 1 && "
                         "!self.outputs.exists(o, o.name == t.name)) && "
                         "self.outputs.all(t, self.outputs.filter(u, u.name == t.name).size() == 1)",
                 "message": "tensor names must be unique across spec.inputs and spec.outputs"},
                {"rule": "!has(self.candidates) || !self.inputs.exists(t, t.dims.exists(d, d == -1))",
                 "message": "with spec.candidates no input dim may be -1: layout batch declares per-candidate dims "
                            "(e.g. [32]), layout padded the fixed padded count (e.g. [500, 32])",
                 "fieldPath": ".inputs"},
            ],
            "spec.candidates": [
                {"rule": "self.layout != 'batch' || has(self.maxPerRequest)",
                 "message": "candidates.layout batch needs maxPerRequest (the most candidates one request carries)",
                 "fieldPath": ".maxPerRequest"},
                {"rule": "!has(self.maxPerRequest) || self.minPerRequest <= self.maxPerRequest",
                 "message": "candidates.minPerRequest must not exceed maxPerRequest", "fieldPath": ".minPerRequest"},
            ],
            "spec.versions": [
                {"rule": "self.all(v, self.filter(w, w.name == v.name).size() == 1)",
                 "message": "spec.versions: each version name may appear only once"},
            ],
            "spec.inputs[]": [
                {"rule": "!self.dims.exists(d, d == -1) || has(self.maxDims)",
                 "message": "dims with -1 need maxDims (the upper bound of each dimension)",
                 "fieldPath": ".maxDims"},
                {"rule": "self.dims.all(d, d == -1 || d >= 1)",
                 "message": "each dimension of dims is -1 (variable) or at least 1", "fieldPath": ".dims"},
            ],
            "spec.outputs[]": [
                {"rule": "self.dims.all(d, d == -1 || d >= 1)",
                 "message": "each dimension of dims is -1 (variable) or at least 1", "fieldPath": ".dims"},
            ],
        },
    }

    api_version: Literal["rankops.io/v1alpha1"] = Field(default="rankops.io/v1alpha1", alias="apiVersion")
    kind: Literal["RankingModel"] = "RankingModel"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RankingModelSpec = Field(description=(
        "The model to serve on Triton: its versions, tensors, batching, SLO, the GPU pool and how new versions roll out."))
    status: RankingModelStatus | None = Field(default=None, description="Written by the operator only.")

    @field_validator("metadata")
    @classmethod
    def _name_fits(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        name = metadata.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name or ""):
            raise ValueError(f"metadata.name {name!r} must be a DNS label of at most 40 characters "
                             "(child objects add suffixes such as -canary-triton)")
        return metadata
