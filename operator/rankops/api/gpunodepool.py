"""GpuNodePool: a set of GPU nodes (a node selector) and what each node must satisfy.

The operator runs the node validator on the pool's nodes; each validator labels its node and the
pool's status aggregates the verdicts. The CRD schema (crds/) is generated from these models.
"""
from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator

from rankops.api.base import ApiModel, refuse_unquoted_version
from rankops.api.conditions import Condition
from rankops.images import VALIDATOR_IMAGE

DEFAULT_VALIDATOR_IMAGE = VALIDATOR_IMAGE

# Driver versions look like 535.104.05 or 570.26 (branch.minor[.patch]); CUDA versions like 12.2.
DRIVER_VERSION = r"^[0-9]{3,4}\.[0-9]{1,3}(\.[0-9]{1,3})?$"
CUDA_VERSION = r"^[0-9]{1,2}\.[0-9]{1,2}$"
# Kubernetes label syntax (apimachinery validation.IsQualifiedName / IsValidLabelValue).
_LABEL_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_LABEL_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY = rf"^({_LABEL_PREFIX}/)?{_LABEL_NAME}$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"


def _check_pattern(value: str | None, pattern: str, field: str, example: str) -> str | None:
    """Pydantic's own pattern error only quotes the regex; say what the field should look like."""
    if value is not None and not re.match(pattern, value):
        raise ValueError(f"{field} {value!r} is not a version like {example!r}; "
                         f"write it as digits separated by dots, quoted in YAML")
    return value


class OsFamily(str, Enum):
    """The OS family a node must run. `rhel` accepts Red Hat Enterprise Linux, Rocky Linux and AlmaLinux."""
    rhel = "rhel"


class OsRequirement(ApiModel):
    family: Annotated[OsFamily, Field(description=(
        "OS family: rhel (Red Hat Enterprise Linux and its rebuilds Rocky Linux and AlmaLinux)."))] = OsFamily.rhel
    major: Annotated[int, Field(ge=8, le=8, description="Major OS version; rankops validates RHEL 8.")] = 8


class LatencyTuning(str, Enum):
    """How much the latency checks (CPU power states, tuned, NUMA alignment, GPU persistence and
    clocks) weigh: `off` skips them, `warn` reports them without gating readiness, `require` makes a
    node that is not tuned not ready and keeps the pool's models on tuned, aligned nodes."""
    off = "off"
    warn = "warn"
    require = "require"


class NodeRequirements(ApiModel):
    os: Annotated[OsRequirement, Field(
        default_factory=OsRequirement, description="The OS every node must run.")]
    # WithJsonSchema: the CRD checks the pattern; pydantic's own check is the validator below,
    # whose message says what a version looks like instead of quoting the regex.
    min_driver_version: Annotated[str | None, WithJsonSchema({"type": "string", "pattern": DRIVER_VERSION}), Field(
        description='Lowest NVIDIA kernel driver version accepted, e.g. "535.104.05".')] = None
    cuda_version: Annotated[str | None, WithJsonSchema({"type": "string", "pattern": CUDA_VERSION}), Field(
        description=('CUDA version the models need, e.g. "12.2"; the node\'s driver must support '
                     "at least this version (NVIDIA's driver to CUDA table)."))] = None
    gpu_products: Annotated[list[Annotated[str, Field(min_length=1, max_length=63)]], Field(
        default_factory=list, max_length=32,
        description=('Accepted GPU products as the GPU feature discovery label spells them, e.g. '
                     '"Tesla-T4" or "NVIDIA-L4" (spaces become hyphens; case is ignored). '
                     "Empty accepts any GPU."))]
    min_gpu_memory_mib: Annotated[int | None, Field(
        alias="minGpuMemoryMiB", ge=1, le=1_048_576,
        description="Least memory each GPU must have, in MiB as NVML reports it (a T4 has 15360).")] = None
    selinux_container_use_devices: Annotated[bool, Field(description=(
        "When SELinux is enforcing, require the boolean container_use_devices to be on "
        "(containers cannot open /dev/nvidia* otherwise)."))] = True
    secure_boot_signed_modules: Annotated[bool, Field(description=(
        "When Secure Boot is on, require the loaded nvidia module to be signed."))] = True
    container_toolkit: Annotated[bool, Field(description=(
        "Require the NVIDIA container toolkit to be configured for the node's runtime "
        "(CRI-O, podman or containerd), or a CDI spec for the GPUs."))] = True
    latency_tuning: Annotated[LatencyTuning, Field(description=(
        "Tail-latency tuning of the nodes (CPU governor and C-states, tuned profile, "
        "vm.overcommit_memory, GPU persistence, clocks and sharing, kubelet CPU and topology "
        "managers): off, warn (report and label only) or require (an untuned node is not ready, and "
        "models are placed only on nodes labelled rankops.io/latency-tuned=true and "
        "rankops.io/topology-aligned=true)."))] = LatencyTuning.warn

    @field_validator("min_driver_version", "cuda_version", mode="before")
    @classmethod
    def _versions_are_quoted(cls, value: Any, info) -> Any:
        return refuse_unquoted_version(cls, value, info.field_name, "12.2")

    @field_validator("min_driver_version")
    @classmethod
    def _driver_version_shape(cls, value: str | None) -> str | None:
        return _check_pattern(value, DRIVER_VERSION, "minDriverVersion", "535.104.05")

    @field_validator("cuda_version")
    @classmethod
    def _cuda_version_shape(cls, value: str | None) -> str | None:
        return _check_pattern(value, CUDA_VERSION, "cudaVersion", "12.2")

    @field_validator("gpu_products")
    @classmethod
    def _products_are_label_values(cls, value: list[str]) -> list[str]:
        for product in value:
            if not re.match(LABEL_VALUE, product.replace(" ", "-")):
                raise ValueError(f"gpuProducts entry {product!r} is not a GPU product name like 'Tesla-T4' "
                                 "(letters, digits, '-', '_' and '.', at most 63 characters)")
        return value


class ValidatorSpec(ApiModel):
    image: Annotated[str, Field(min_length=1, description="Image of the node validator.")] = DEFAULT_VALIDATOR_IMAGE
    interval_seconds: Annotated[int, Field(ge=30, le=86_400, description=(
        "Seconds between re-checks of each node (at least 30)."))] = 300


class GpuNodePoolSpec(ApiModel):
    node_selector: Annotated[dict[str, str], Field(json_schema_extra={"minProperties": 1, "x-kubernetes-validations": [
        {"rule": "size(self) > 0", "message": "nodeSelector must not be empty: it would select every node"}]},
        description=(
        "Labels that select the pool's nodes, as in a pod's nodeSelector. The validator runs on "
        "exactly these nodes; an empty selector is refused because it would select every node."))]
    requirements: Annotated[NodeRequirements, Field(
        default_factory=NodeRequirements, description="What every node of the pool must satisfy.")]
    validator: Annotated[ValidatorSpec, Field(
        default_factory=ValidatorSpec, description="The validator DaemonSet: image and re-check interval.")]
    taint_failing_nodes: Annotated[bool, Field(description=(
        "Taint nodes that fail validation with rankops.io/gpu-unvalidated:NoSchedule so no new pods "
        "land there (running pods are not evicted); the taint is removed when the node passes."))] = False
    failing_node_replicas: Annotated[Literal["move", "keep"], Field(description=(
        "What happens to RankingModel replicas already running on a node that turns failing validation: "
        "`move` (a replacement is started on another ready node, and the old replica goes once it is Ready) "
        "or `keep` (they stay, and the model's status says they run on a failing node)."))] = "move"

    @field_validator("node_selector")
    @classmethod
    def _selector_is_labels(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError("nodeSelector is empty, which would select every node; give the labels of the "
                             "pool's GPU nodes, e.g. {node.kubernetes.io/instance-type: g4dn.xlarge}")
        for key, label in value.items():
            if len(key) > 316 or not re.match(LABEL_KEY, key):
                raise ValueError(f"nodeSelector key {key!r} is not a label key "
                                 "(optional DNS prefix and '/', then a name of at most 63 characters)")
            if not re.match(LABEL_VALUE, label):
                raise ValueError(f"nodeSelector value {label!r} for {key!r} is not a label value "
                                 "(at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric)")
        return value


class FailingCheck(ApiModel):
    check: Annotated[str, Field(description="Check id, e.g. nouveau or selinux.")]
    count: Annotated[int, Field(ge=0, description="Nodes failing this check.")]
    nodes: Annotated[list[str], Field(default_factory=list, description="Names of those nodes (at most 20 listed).")]


class GpuNodePoolStatus(ApiModel):
    observed_generation: Annotated[int | None, Field(description="The metadata.generation this status was computed from.")] = None
    nodes: Annotated[int, Field(ge=0, description=(
        "Nodes matched by the selector that this pool validates (ready + failing + pending)."))] = 0
    ready: Annotated[int, Field(ge=0, description="Nodes whose latest validation passed.")] = 0
    failing: Annotated[int, Field(ge=0, description=(
        "Nodes whose latest validation failed, or whose latest report is stale: older than three "
        "validator intervals (listed under the check `stale` in failingByCheck)."))] = 0
    pending: Annotated[int, Field(ge=0, description=(
        "Nodes without a current report (validator not run yet, or run against older requirements)."))] = 0
    excluded: Annotated[int, Field(ge=0, description=(
        "Nodes matched by the selector that this pool leaves alone: no nvidia.com/gpu capacity, or an "
        "older pool selects them too (see the NodesWithoutGpus and Overlapping conditions)."))] = 0
    failing_by_check: Annotated[list[FailingCheck], Field(
        default_factory=list, description="For each failing check: how many nodes and which.")]
    driver_versions: Annotated[str | None, Field(description=(
        "The NVIDIA driver versions of the ready nodes, oldest first, comma-separated."))] = None
    newest_triton: Annotated[str | None, Field(description=(
        "The newest Triton release (YY.MM) in rankops' table from NVIDIA's release notes that every ready "
        "node's driver runs (on data-center GPUs, through forward compatibility); a RankingModel whose "
        "tritonImage is newer lands only on the nodes whose driver runs it."))] = None
    latency_tuned: Annotated[int, Field(ge=0, description=(
        "Nodes with a current report whose latency checks all pass (label rankops.io/latency-tuned=true)."))] = 0
    topology_aligned: Annotated[int, Field(ge=0, description=(
        "Nodes with a current report whose kubelet pins Guaranteed pods' CPUs on their GPU's NUMA node "
        "(label rankops.io/topology-aligned=true)."))] = 0
    conditions: list[Condition] = Field(default_factory=list, description="Standard Kubernetes conditions (Ready, Degraded, ...), one per type.")


class GpuNodePool(ApiModel):
    __crd__ = {
        "plural": "gpunodepools",
        "singular": "gpunodepool",
        "kind": "GpuNodePool",
        "shortNames": ["gnp"],
        "scope": "Cluster",
        "categories": ["rankops"],
        "printerColumns": [
            {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.ready"},
            {"name": "Failing", "type": "integer", "jsonPath": ".status.failing"},
            {"name": "Drivers", "type": "string", "jsonPath": ".status.driverVersions"},
            {"name": "Newest-Triton", "type": "string", "jsonPath": ".status.newestTriton"},
            {"name": "Tuned", "type": "integer", "jsonPath": ".status.latencyTuned"},
            {"name": "Aligned", "type": "integer", "jsonPath": ".status.topologyAligned"},
            {"name": "Latency", "type": "string", "jsonPath": ".spec.requirements.latencyTuning", "priority": 1},
            {"name": "Pending", "type": "integer", "jsonPath": ".status.pending", "priority": 1},
            {"name": "Excluded", "type": "integer", "jsonPath": ".status.excluded", "priority": 1},
            {"name": "Taint", "type": "boolean", "jsonPath": ".spec.taintFailingNodes", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }

    api_version: Literal["rankops.io/v1alpha1"] = Field(default="rankops.io/v1alpha1", alias="apiVersion")
    kind: Literal["GpuNodePool"] = "GpuNodePool"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: GpuNodePoolSpec = Field(description=(
        "The GPU nodes of this pool (a node selector) and what each must meet before models schedule there."))
    status: GpuNodePoolStatus | None = Field(default=None, description="Written by the operator only.")

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))
