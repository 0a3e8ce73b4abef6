"""The desired serving objects of a RankingModel, as a pure function of its spec and serving state.

The serving state (which version is stable, which is in canary and whether the canary takes
traffic) lives in the RankingModel's status; `rankops render` uses the state of a fresh object.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rankops.api.rankingmodel import Batching, ModelVersion, RankingModel, RankingModelSpec
from rankops.fetcher import stager
from rankops.render import names, serving
from rankops.render.policy import PolicyError, TenantPolicy
from rankops.render.tritonconfig import ServingShape, render_config_pbtxt, triton_version, version_free_config


class RenderError(ValueError):
    """The spec is valid on its own but cannot be served as asked (e.g. no plan meets the SLO)."""


@dataclass(frozen=True)
class ServingState:
    stable_version: str
    canary_version: str | None = None
    canary_traffic: bool = False   # gates passed: canary pods may join the serving Service
    canary_replicas: int = 0
    canary_weight: int = 0         # percent of traffic the canary gets while it takes traffic
    stable_lent: int = 0           # stable replicas whose GPUs the canary takes (canary.capacity: replace)
    stable_surge: int = 0          # stable replicas beyond the model's while some move off leaving nodes
    # rollout.strategy inPlace only: versions beyond stable_version the stable pods hold on their
    # volume (the one being switched to, or one being unloaded), in the order they are fetched.
    staged_versions: tuple[str, ...] = ()
    # rollout.strategy inPlace only: the version the stable pods were last started for
    # (status.stablePodsVersion; names.ANNOTATION_STARTED_FOR); None: stable_version.
    started_for: str | None = None


@dataclass(frozen=True)
class ResolvedShape:
    shape: ServingShape
    replicas: int
    plan: Any = None                 # rankops.planner.PlanResult when a plan was made or evaluated
    problems: tuple[str, ...] = field(default_factory=tuple)
    # Shapes that keep Triton from batching requests (reported as Degraded RequestsNotBatched).
    unbatched: tuple[str, ...] = field(default_factory=tuple)


def resolve_shape(spec: RankingModelSpec, profile: dict[int, float] | None = None) -> ResolvedShape:
    """Batching, instances and replicas: the spec's own values, or the planner's for `batching: auto`.

    Explicit values are honoured; when an SLO and a profile are given they are evaluated and any
    predicted miss is returned as a problem (the operator reports it as Degraded).
    """
    from rankops import planner  # planner pulls in numpy: import only when needed

    if isinstance(spec.batching, Batching):
        has_profile = profile or (spec.planning and spec.planning.latency_profile)
        if spec.slo is None or not has_profile:
            shape = ServingShape.explicit(spec.batching, spec.instances_per_gpu, _queue_policy(spec, None))
            return ResolvedShape(shape, spec.replicas, unbatched=tuple(unbatched_problems(spec, shape)))
        result = _with_queue_policy(spec, planner.evaluate(planner.inputs_from_spec(spec, profile=profile)))
        shape = ServingShape.explicit(spec.batching, spec.instances_per_gpu, result.queue_policy)
        return ResolvedShape(shape, spec.replicas, result, tuple(result.problems),
                             tuple(unbatched_problems(spec, shape)))
    try:
        result = planner.plan(planner.inputs_from_spec(spec, profile=profile))
    except planner.PlanError as exc:
        raise RenderError(f"batching: auto: {exc}") from exc
    too_big = spec.tensor_size_problems(result.max_batch_size, "the maxBatchSize planned for batching: auto")
    if too_big:
        raise RenderError("; ".join(too_big))
    result = _with_queue_policy(spec, result)
    shape = ServingShape(result.max_batch_size, tuple(result.preferred_batch_sizes),
                         result.max_queue_delay_microseconds, result.instances_per_gpu, result.queue_policy)
    return ResolvedShape(shape, result.replicas, result, tuple(result.problems),
                         tuple(unbatched_problems(spec, shape)))


def _queue_policy(spec: RankingModelSpec, plan: Any):
    """slo.overload's queue policy; a spec that cannot have one is refused as a plan is (PlanFailed:
    nothing is applied, what serves is left as it was)."""
    from rankops.planner.overload import OverloadError, queue_policy

    try:
        return queue_policy(spec, plan)
    except OverloadError as exc:
        raise RenderError(str(exc)) from exc


def _with_queue_policy(spec: RankingModelSpec, plan: Any):
    import dataclasses

    return dataclasses.replace(plan, queue_policy=_queue_policy(spec, plan))


def unbatched_problems(spec: RankingModelSpec, shape: ServingShape) -> list[str]:
    """Inputs whose variable dims keep Triton's dynamic batcher from joining requests.

    Triton batches only requests whose inputs have identical shapes beyond the batch dimension,
    so a candidate count that varies per request (dims [-1, ...]) leaves every batch at one
    request unless all requests happen to carry the same count.
    """
    if spec.candidates is not None or shape.max_batch_size <= 1:
        return []
    return [f"inputs {t.name} dims {t.dims} vary per request, and Triton batches only "
            f"requests of identical shapes, so requests with different candidate counts run one at a time; "
            f"declare candidates.layout: batch with {t.name} dims {t.dims[1:] or [1]} (one candidate per batch "
            f"item), or fix the dim at {t.max_dims or t.dims} and set candidates.layout: padded"
            for t in spec.inputs if -1 in t.dims][:1]


def canary_replicas_for(stable_replicas: int, weight_percent: int) -> int:
    """Canary pods so that canary/(stable+canary) comes nearest the weight, at least one."""
    if stable_replicas <= 0:
        return 1
    return max(1, round(stable_replicas * weight_percent / (100 - weight_percent)))


def effective_weight(stable_ready: int, canary_ready: int) -> int:
    total = stable_ready + canary_ready
    return round(100 * canary_ready / total) if total else 0


def track_objects(rm: RankingModel, track: str, version_name: str, replicas: int, traffic_on: bool,
                  shape: ServingShape, pool_requirements: Any = None, covered_by: int = 0,
                  policy: TenantPolicy = TenantPolicy(), min_available: int = 0,
                  staged: tuple[str, ...] | None = None, started_for: str | None = None) -> list[dict[str, Any]]:
    """`policy`: what the cluster admin lets the spec mount and run (`rankops run --allow-*`).
    `min_available`: Ready pods the track's PodDisruptionBudget keeps through evictions; 0 (canary,
    reference) never holds up a drain (a rollback or promotion deletes pods, which no budget stops).
    `staged`: None renders one version per pod template; a tuple makes the track switch versions in
    place, its pods holding `staged` beside `version_name` (what only the ConfigMap says)."""
    spec, name, namespace = rm.spec, rm.metadata["name"], rm.metadata.get("namespace", "default")
    version = spec.version_named(version_name)
    if version is None:
        raise RenderError(f"version {version_name!r} is not in spec.versions any more; add it back "
                          "to keep serving it")
    config_text = render_config_pbtxt(name, namespace, spec, version, shape)
    placement = serving.pool_placement(spec.node_pool, pool_requirements, spec.triton_image)
    versions_json = in_place_config = None
    if staged is not None:
        versions_json = in_place_versions_json(name, spec, version, staged)
        in_place_config = version_free_config(name, namespace, spec, version, shape)
    try:
        deployment = serving.deployment(name, namespace, spec, track, version, replicas, config_text, traffic_on,
                                        placement, covered_by, policy, in_place_config, started_for)
    except PolicyError as exc:
        raise RenderError(f"spec.versions[{spec.versions.index(version)}].modelUri: {exc}") from exc
    return [
        serving.config_map(name, namespace, track, version.name, config_text, versions_json),
        deployment,
        serving.track_service(name, namespace, track),
        serving.disruption_budget(name, namespace, track, min_available),
    ]


def in_place_versions_json(model: str, spec: RankingModelSpec, stable: ModelVersion, staged: tuple[str, ...]) -> str:
    """The stager's versions.json (fetcher/stager.py) for pods serving `stable` that also hold
    `staged`: the serving version first, so a pod's init container fetches it before anything else.
    A RenderError names what one Triton model cannot hold in place."""
    held = [stable]
    for name in staged:
        if name in (v.name for v in held):
            raise RenderError(f"staged version {name!r} is held already (the serving version, or staged twice)")
        version = spec.version_named(name)
        if version is None:
            raise RenderError(f"staged version {name!r} is not in spec.versions any more; add it back to "
                              "finish switching it in place")
        if (version.format, version.precision) != (stable.format, stable.precision):
            raise RenderError(f"staged version {name!r} is {version.format.value} {version.precision.value} and the "
                              f"serving version {stable.name!r} {stable.format.value} {stable.precision.value}: "
                              "one Triton model holds versions in place only with the same format and precision")
        held.append(version)
    for version in held:
        scheme = version.model_uri.split("://", 1)[0].lower()
        if scheme not in ("s3", "gs", "http", "https"):
            # The API refuses these for inPlace (RankingModelSpec._cross_field); never mounted in place.
            raise RenderError(f"spec.versions[{spec.versions.index(version)}].modelUri: rollout.strategy inPlace "
                              f"fetches every version into the running pods, and {scheme}:// is mounted, not fetched")
    dirs = [triton_version(v.name) for v in held]
    if len(set(dirs)) != len(dirs):
        raise RenderError(f"versions {[v.name for v in held]} held in place share a Triton version directory "
                          f"({dirs}): give the versions distinct numeric names")
    if len(held) > stager.MAX_VERSIONS:
        raise RenderError(f"{len(held)} versions held in place ({[v.name for v in held]}); a pod holds at most "
                          f"{stager.MAX_VERSIONS}")
    wanted = [stager.Wanted(v.name, triton_version(v.name), v.model_uri, v.sha256) for v in held]
    return json.dumps(stager.versions_document(model, wanted), sort_keys=True)


def desired_objects(rm: RankingModel, state: ServingState, resolved: ResolvedShape,
                    pool_requirements: Any = None, policy: TenantPolicy = TenantPolicy()) -> list[dict[str, Any]]:
    """`state.staged_versions` counts only with rollout.strategy inPlace (the stable track, whose
    pod template then stays the same whatever version it serves); the canary is always its own pods."""
    name, namespace = rm.metadata["name"], rm.metadata.get("namespace", "default")
    covering = state.canary_replicas if state.canary_version and state.canary_traffic else 0
    stable = resolved.replicas - state.stable_lent + state.stable_surge
    # From the model's replicas, not the Deployment's: replicas lent to a canary (at most the
    # tolerance) are already part of what may go, and a surge while replicas move adds to it.
    keep = serving.stable_min_available(resolved.replicas, failure_tolerance(rm.spec),
                                        resolved.replicas - state.stable_lent)
    in_place = rm.spec.rollout.switches_in_place
    objects = track_objects(rm, names.STABLE, state.stable_version, stable, True,
                            resolved.shape, pool_requirements, covering, policy, min_available=keep,
                            staged=state.staged_versions if in_place else None, started_for=state.started_for)
    if state.canary_version:
        objects += track_objects(rm, names.CANARY, state.canary_version, state.canary_replicas,
                                 False, resolved.shape, pool_requirements, policy=policy)
    objects.append(serving.serving_service(name, namespace))
    if rm.spec.network_policy.enabled:
        objects.append(serving.network_policy(name, namespace, rm.spec, policy.operator_namespace))
    return [with_owner(obj, rm) for obj in objects]


def failure_tolerance(spec: RankingModelSpec) -> int:
    """Replicas the model may lose: planning.failureTolerance, 1 without planning (as the planner)."""
    return spec.planning.failure_tolerance if spec.planning is not None else 1


def monitoring_objects(rm: RankingModel, extra_labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The optional ServiceMonitor scraping Triton's metrics port of the model's serving pods.

    Kept apart from `desired_objects`: the operator applies it only when asked to, and only where
    the cluster serves monitoring.coreos.com/v1 (monitoring must never block serving).
    """
    name, namespace = rm.metadata["name"], rm.metadata.get("namespace", "default")
    return [with_owner(serving.service_monitor(name, namespace, extra_labels), rm)]


def with_owner(obj: dict[str, Any], rm: RankingModel) -> dict[str, Any]:
    """Controller ownerReference to the RankingModel (omitted offline, where there is no uid)."""
    uid = rm.metadata.get("uid")
    if uid:
        obj["metadata"]["ownerReferences"] = [{
            "apiVersion": rm.api_version, "kind": rm.kind, "name": rm.metadata["name"], "uid": uid,
            "controller": True, "blockOwnerDeletion": True,
        }]
    return obj


def initial_state(rm: RankingModel) -> ServingState:
    return ServingState(stable_version=rm.spec.version)
