"""A shared Triton server's own settings (issue 42): what its pods are, whoever its members are.

Several RankingModels share one server's pods, each pod one card holding every member. A pod template cannot change with its members
(that would restart every member's pods when one joins), so everything the template holds comes
from here: the image, the pod's CPU, memory, cards and disk, the fetch credentials its stager
runs with, the flags Triton starts with, how it is drained. A member brings only what Triton
loads for it (its config.pbtxt and artifact), its Service and its clients; render/shared_server
refuses a member that needs from the pod what this spec does not give.

The same field names and types as RankingModelSpec where the meaning is the same, so a user
moving a model onto a server moves those fields as they are.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rankops.api import bounds
from rankops.api.autoscaling import Recommendation, ScaleDownWindow, ScaleUpWindow
from rankops.api.base import ApiModel
from rankops.api.conditions import Condition
from rankops.api.rankingmodel import (DEFAULT_FETCHER_IMAGE, DEFAULT_TRITON_IMAGE, DISRUPTION_RULES, Disruption,
                                      FetchLimits, GateResult, InPlaceSwitchStatus, Resources, Storage)


class ServerAutoscaling(ApiModel):
    """The server's pods that follow its members' load (docs/shared-server.md, Autoscaling)."""
    enabled: Annotated[bool, Field(description=(
        "Set the pods from the members' observed load (each pod's Triton counters, per member): the fewest cards "
        "on which every member's P99 holds beside the others at its load over targetUtilization, by the same "
        "rule that admits them, within [minReplicas, maxReplicas]. Off: the pods are the cards the members "
        "need together at their target loads."))] = False
    min_replicas: Annotated[int, Field(ge=1, le=1000, description=(
        "Fewest pods, whatever the load (each member's failureTolerance is in the rule already)."))] = 1
    target_utilization: Annotated[float, Field(gt=0, le=1, description=(
        "Each member's observed rate is sized as if it were this fraction of the load the pods must hold; the "
        "rest is headroom for the time a new pod takes to start and load every member."))] = 0.7
    scale_up_stabilization_seconds: ScaleUpWindow = 0
    scale_down_stabilization_seconds: ScaleDownWindow = 300


SERVER_AUTOSCALING_RULES = [
    {"rule": "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || "
             "self.autoscaling.minReplicas <= (has(self.maxReplicas) ? self.maxReplicas : 8)",
     "message": "autoscaling.minReplicas must not exceed maxReplicas", "fieldPath": ".autoscaling.minReplicas"},
]


class SharedServerSpec(ApiModel):
    node_pool: Annotated[str | None, Field(pattern=bounds.DNS_SUBDOMAIN, max_length=bounds.DNS_SUBDOMAIN_MAX, description=(
        "GpuNodePool whose validated nodes run the server; every member must name the same pool."))] = None
    max_replicas: Annotated[int, Field(ge=1, le=1000, description=(
        "Most pods the server may run. Each pod is one card holding every member; the pods are the cards "
        "the members need together at their target loads (rankops plan --one-server), and a member that would "
        "need more waits (Pending, ServerFull)."))] = 8
    gpu_memory_mib: Annotated[int, Field(ge=1024, le=1_048_576, alias="gpuMemoryMiB", description=(
        "Memory of one of the server's cards, in MiB: members are admitted while their measured or stated "
        "memory (spec.planning.memory), the runtime reserve and a margin fit on the cards."))]
    burst_proof: Annotated[bool, Field(description=(
        "Admit a member only if every member's P99 holds while all the others run every instance at once."))] = False
    triton_image: Annotated[str, Field(
        pattern=bounds.IMAGE_REFERENCE, max_length=bounds.IMAGE_REFERENCE_MAX, description=(
            "Triton Inference Server image; every member must name the same (a TensorRT plan runs on the "
            "release it was built with)."))] = DEFAULT_TRITON_IMAGE
    fetcher_image: Annotated[str, Field(pattern=bounds.IMAGE_REFERENCE, max_length=bounds.IMAGE_REFERENCE_MAX, description=(
        "Image of the pod's `stage` (rankops stage-members) and `route` containers."))] = DEFAULT_FETCHER_IMAGE
    model_credentials_secret: Annotated[str | None, Field(
        pattern=bounds.DNS_SUBDOMAIN, max_length=bounds.DNS_SUBDOMAIN_MAX, description=(
            "Secret whose keys become the stager's environment. A running pod cannot mount a Secret it was "
            "not started with, so the server fetches every member's artifacts with this one: a member "
            "naming another is refused."))] = None
    fetch: FetchLimits = Field(default_factory=FetchLimits, description="Time bounds of each artifact fetch.")
    resources: Resources = Field(default_factory=Resources, description=(
        "CPU and memory of each pod's Triton, for all its members (a member's own resources are not used)."))
    storage: Storage = Field(default_factory=Storage, description=(
        "Each pod's model volume (every member's artifacts) and /tmp."))
    response_cache: Annotated[bool, Field(description=(
        "Start Triton with a response cache; a member that asks for one needs it."))] = False
    failure_tolerance: Annotated[int, Field(ge=0, le=100, description=(
        "Pods the server may lose to a drain at once (its PodDisruptionBudget): every member goes with a pod."))] = 1
    disruption: Disruption = Field(default_factory=Disruption, description=(
        "Priority class, node spread, node-loss tolerance and the drain of each pod; Triton's exit timeout "
        "must cover every member's."), json_schema_extra={"x-kubernetes-validations": DISRUPTION_RULES})
    pod_annotations: bounds.pod_annotations("Annotations added to the server's pods.")
    autoscaling: ServerAutoscaling = Field(default_factory=ServerAutoscaling, description=(
        "Pods that follow the members' observed load (off: the cards their target loads need)."))

    @model_validator(mode="after")
    def _autoscaling_bounds(self) -> "SharedServerSpec":
        if self.autoscaling.min_replicas > self.max_replicas:
            raise ValueError(f"autoscaling.minReplicas {self.autoscaling.min_replicas} exceeds maxReplicas "
                             f"{self.max_replicas}: lower it or raise maxReplicas")
        return self


MEMBER_STATES = ("Serving", "Loading", "Failed", "Pending", "Refused")
# Bounds of the status: any tenant may name the server, and a status is one etcd object.
MAX_LISTED_MEMBERS, MEMBER_MESSAGE_MAX = 128, 1024


# A manual control's value that names a version: "<version>" or "<version>/<anything>" (longer ones act on nothing).
MANUAL_VALUE_MAX = 253


class MemberStatus(ApiModel):
    """One member of the server as its last reconcile found it (serverplan.MemberOutcome): what the
    member's own RankingModel status reads."""
    name: Annotated[str, Field(pattern=bounds.DNS_LABEL, max_length=63, description=(
        "The RankingModel, in the server's namespace."))]
    state: Annotated[Literal[MEMBER_STATES], Field(description=(
        "Serving on every ready pod; Loading (or no ready pod yet); Failed where a pod refused its load (the "
        "others serve on), or held and loaded nowhere while nothing will load it (over the room left, or its spec "
        "invalid); Pending while it does not fit beside the members that serve or no seat is left (never an "
        "eviction); Refused when it cannot share this server (its field and the fix in the message)."))]
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", description=(
        "Serving, Loading, NoReadyPod, MemberLoadFailed, ServerFull, InvalidSpec, NotShareable or CannotPack."))]
    message: Annotated[str, Field(max_length=MEMBER_MESSAGE_MAX, description=(
        "Human-readable details, with the arithmetic when it waits."))] = ""
    version: Annotated[str | None, Field(max_length=63, description=(
        "The version the server holds for it (kept until its new version is switched in)."))] = None
    port: Annotated[int | None, Field(ge=1, le=65535, description="Its port on the server's pods (its Service's "
                                                                  "target).")] = None
    config_digest: Annotated[str | None, Field(max_length=64, pattern=r"^[0-9a-f]+$", description=(
        "Digest of the config.pbtxt its serving pods loaded: what an edit is compared with, whatever the "
        "operator process remembers."))] = None
    served_sha256: Annotated[str | None, Field(alias="servedSha256", max_length=64, pattern=r"^[0-9a-f]{64}$",
                                               description=(
        "SHA-256 of the config its serving pods loaded and of the files it was staged with: a member frozen "
        "after a restart (its spec invalid) is loaded on a new pod from the server's ConfigMap only while "
        "both hash to this."))] = None
    switch: Annotated[InPlaceSwitchStatus | None, Field(description=(
        "Its last version switch inside the running pods (server_switch.py): a new spec.version is loaded "
        "beside the held one in one pod, gated there, then loaded pod by pod; the held one is unloaded last. "
        "A switch that cannot fit or fails leaves the held version serving."))] = None
    gates: Annotated[list[GateResult], Field(default_factory=list, max_length=4, description=(
        "The gates' verdicts on its last version switch, each on the switch's gate pod (what its own "
        "status.gates shows)."))]
    aborted: Annotated[str | None, Field(max_length=MANUAL_VALUE_MAX, description=(
        "The member's rankops.io/abort value acted on last (it rolled that version's switch back), kept from "
        "switch to switch: a value acts once."))] = None
    retried: Annotated[str | None, Field(max_length=MANUAL_VALUE_MAX, description=(
        "The member's rankops.io/retry value acted on last (it began a stopped switch again), kept from switch "
        "to switch: a value acts once."))] = None
    last_transition_time: Annotated[str | None, Field(description=(
        "When its state or reason last changed (RFC 3339)."))] = None


class ServerAutoscalingStatus(ApiModel):
    """What the last reading of the server's pods decided (server_autoscale.step), and what the next
    decision needs across a restart (the windows' recommendations). The pods' counters themselves
    (up to 64 pods x 32 members) stay in the operator's memory: a restarted operator reads twice
    (10 s) before it decides again."""
    observed_qps: Annotated[dict[str, float], Field(default_factory=dict, description=(
        "Each held member's request rate between the last two readings, all pods together."))]
    desired_replicas: Annotated[int | None, Field(ge=0, description="The pods decided.")] = None
    reason: Annotated[str | None, Field(description=(
        "ScaledUp, ScaledDown, WithinTarget, ScaleDownStabilizing, ScaleUpStabilizing, AtMaxReplicas, "
        "AtMinReplicas, Shedding, Queueing, ScaleDownHeld, NoReading or CannotCount."))] = None
    message: Annotated[str | None, Field(max_length=1000, description=(
        "The numbers behind the decision, for people."))] = None
    last_scale_time: Annotated[str | None, Field(description="When the pods last changed (RFC 3339).")] = None
    read_at: Annotated[str | None, Field(description="When the pods were last read (RFC 3339).")] = None
    recommendations: Annotated[list[Recommendation], Field(default_factory=list, max_length=200, description=(
        "The pods recommended at each reading of the stabilization windows."))]


class SharedServerStatus(ApiModel):
    observed_generation: Annotated[int | None, Field(description=(
        "The metadata.generation this status was computed from."))] = None
    replicas: Annotated[int, Field(ge=0, description=(
        "Pods the server runs: the cards its members need together (none without a member)."))] = 0
    members: Annotated[list[MemberStatus], Field(default_factory=list, max_length=MAX_LISTED_MEMBERS, description=(
        f"The RankingModels that name the server, in arrival order (the first {MAX_LISTED_MEMBERS})."))]
    conditions: list[Condition] = Field(default_factory=list, description=(
        "Ready (every member serves) and Degraded (a member failed, waits or is refused)."))
    autoscaling: ServerAutoscalingStatus | None = Field(default=None, description=(
        "The pods that follow the members' load (spec.autoscaling.enabled)."))


class SharedServer(ApiModel):
    """One Triton Deployment that serves every RankingModel naming it (spec.server), each loaded
    into its running pods: docs/shared-server.md."""
    __crd__ = {
        "plural": "sharedservers",
        "singular": "sharedserver",
        "kind": "SharedServer",
        "shortNames": ["rss"],
        "scope": "Namespaced",
        "categories": ["rankops"],
        "printerColumns": [
            {"name": "Pods", "type": "integer", "jsonPath": ".status.replicas"},
            {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Ready')].status"},
            {"name": "Degraded", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Degraded')].reason"},
            {"name": "GPU-MiB", "type": "integer", "jsonPath": ".spec.gpuMemoryMiB", "priority": 1},
            {"name": "Pool", "type": "string", "jsonPath": ".spec.nodePool", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        "validations": {
            "": [
                {"rule": f"self.metadata.name.matches('^[a-z]([-a-z0-9]{{0,{bounds.SERVER_NAME_MAX - 2}}}[a-z0-9])?$')",
                 "message": f"metadata.name must be a DNS label of at most {bounds.SERVER_NAME_MAX} characters "
                            "starting with a letter (child objects add suffixes such as -shared)"},
            ],
            "spec": SERVER_AUTOSCALING_RULES,
        },
    }

    api_version: Literal["rankops.io/v1alpha1"] = Field(default="rankops.io/v1alpha1", alias="apiVersion")
    kind: Literal["SharedServer"] = "SharedServer"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SharedServerSpec = Field(description=(
        "The server's pods (image, CPU, memory, one card each, disk, fetch credentials, drain) and how its "
        "members are admitted (the card's memory, the most pods)."))
    status: SharedServerStatus | None = Field(default=None, description="Written by the operator only.")

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))
