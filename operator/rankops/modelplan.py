"""A RankingModel's plan: everything the operator does for it on one reconcile, as one pure
function of the model, what the shell observed, and the cluster admin's settings.

    observe (controller/models.py, from the caches) -> plan() -> execute what differs -> record

A ModelPlan holds every object to apply (config, Deployments, Services, traffic objects, the
reference track, pull secrets), the gate Jobs to create once (a Job's pod template is immutable),
the deletions, the pod patches (canary traffic labels), the typed status and the Events.
`rankops render` prints the plan of a model as new (no observations), so what it prints is what
the operator applies. Why a generation is not applied, and why a model is Degraded, come from one
precedence list (model_status.DEGRADED_PRECEDENCE).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import ValidationError

from rankops import autoscale
from rankops.api.conditions import DEGRADED, get_condition
from rankops.api.errors import describe
from rankops.api.phases import DegradedReason
from rankops.api.planning import PlanStatus
from rankops.api.rankingmodel import GateResult, NodeSpread, RankingModel, RankingModelStatus, TrafficMode
from rankops.render import names
from rankops.render.desired import (RenderError, ResolvedShape, desired_objects, failure_tolerance,
                                    monitoring_objects, track_objects, with_owner)
from rankops.render.policy import TenantPolicy, pod_volume_problems, spec_problems
from rankops.render.pullsecrets import with_pull_secrets
from rankops.render.traffic import traffic_objects
from rankops.rollout import deadlines
from rankops.rollout import jobs as gate_jobs
from rankops import model_status
from rankops.rollout.machine import (ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION, Decision, Event,
                                    GateObservation, Observed, attempt_id, iso, new_attempt_id, reference_version_of,
                                    step)
from rankops.rollout.record import GATES
from rankops.rollout.disruption import LEAVING_COST, StablePod, plan_moves, shared_node
from rankops.rollout.readiness import PodObservation, counts_ready, ready_count

POLICY_REASON = DegradedReason.NOT_ALLOWED_ON_THIS_CLUSTER   # a field the cluster admin's policy refuses


@dataclass(frozen=True)
class Settings:
    """How the operator runs (`rankops run` flags), the same for every model."""
    policy: TenantPolicy = TenantPolicy()
    pull_secrets: tuple[str, ...] = ()
    service_monitor_labels: dict[str, str] | None = None   # None: no ServiceMonitor


@dataclass(frozen=True)
class PoolView:
    """The GpuNodePool the model names, as observed."""
    exists: bool = True
    requirements: Any = None                   # its spec.requirements when its spec is valid
    invalid: str | None = None                 # why its spec does not validate
    note: str | None = None                    # it has no validated ready node
    placement: tuple[str, str] | None = None   # (reason, message): no ready node runs the image
    move_from_failing: bool = True             # spec.failingNodeReplicas: move (or keep)
    reads_ready_nodes: bool = False            # placement needs its validated ready nodes, not given yet


def ready_node_labels(pool_name: str) -> dict[str, str]:
    """The labels of a pool's validated ready nodes."""
    from rankops.nodelabels import LABEL_POOL, LABEL_READY, label_value

    return {LABEL_POOL: label_value(pool_name), LABEL_READY: "true"}


def pool_view(rm: RankingModel, pool: dict | None, ready_nodes: list[dict] | None = None) -> PoolView:
    """The GpuNodePool `rm` names (`pool`: as read, None when absent): whether it exists and is
    valid, its requirements, whether it has a validated ready node, and whether one of
    `ready_nodes` (its validated ready nodes; None: not read yet) can run the model's image."""
    from rankops.api.gpunodepool import GpuNodePool, GpuNodePoolStatus
    from rankops.triton import image_fit

    pool_name = rm.spec.node_pool
    if pool is None:
        return PoolView(exists=False)
    try:
        pool_spec = GpuNodePool.model_validate({"metadata": pool["metadata"], "spec": pool["spec"]}).spec
    except ValidationError as exc:
        return PoolView(invalid="; ".join(describe(exc)))
    requirements, move = pool_spec.requirements, pool_spec.failing_node_replicas == "move"
    # As the PoolController reads it: a field it cannot read counts as unwritten (no ready node).
    pool_status, _ = GpuNodePoolStatus.from_stored(pool.get("status") or {})
    if pool_status.ready == 0:
        failing = ", ".join(f"{f.check}: {f.count}" for f in pool_status.failing_by_check)
        return PoolView(requirements=requirements, move_from_failing=move, note=(
            f"GpuNodePool {pool_name} has no validated ready node ({pool_status.nodes} matched"
            + (f"; failing {failing}" if failing else "") + "); pods stay Pending until a node passes validation"))
    if ready_nodes is None:
        return PoolView(requirements=requirements, move_from_failing=move, reads_ready_nodes=True)
    return PoolView(requirements=requirements, move_from_failing=move,
                    placement=image_fit.pool_driver_problem(rm.spec.triton_image, pool_name, ready_nodes))


@dataclass(frozen=True)
class ModelObserved:
    """What the shell read for one reconcile (from its caches where it can). A model as new (what
    `rankops render` plans) has nothing here but the clock and the shape."""
    now: dt.datetime
    resolved: ResolvedShape | None = None          # the shape to serve (the planner's, for batching: auto)
    plan_status: PlanStatus | None = None          # status.plan that says why
    plan_failed: str | None = None                 # why no shape could be made
    credentials_secret_exists: bool | None = None  # None: not needed (credentials_secret_needed), or not readable
    pool: PoolView | None = None
    stable_dep: dict | None = None
    canary_dep: dict | None = None
    canary_pods: tuple[tuple[dict, PodObservation], ...] = ()
    gates: dict[str, GateObservation] = field(default_factory=dict)
    track_metrics: dict[str, dict[str, Any]] | None = None
    metrics_problems: tuple[str, ...] = ()
    metrics_unread: dict[str, tuple[str, ...]] = field(default_factory=dict)   # track -> its pods not read, why
    warm_failing: tuple[str, ...] = ()
    unschedulable: str | None = None
    jobs: tuple[tuple[str, bool], ...] = ()        # (name, finished) of this model's gate Jobs
    present: frozenset[tuple[str, str]] = frozenset()   # (kind, name) of the track children that exist
    stable_pods: tuple[StablePod, ...] = ()        # read while some are on leaving nodes (rollout/disruption)
    stable_nodes: tuple[tuple[str, int], ...] = ()   # (node, pods) of the stable track's scheduled pods
    autoscale_reading: dict[str, Any] | None = None     # spec.autoscaling: {pod: counters} read now (None: not read)
    autoscale_problems: tuple[str, ...] = ()       # serving pods whose counters could not be read
    external_scaler: str | None = None             # autoscaling mode external: e.g. HorizontalPodAutoscaler/<name>
    in_place: Any = None                           # InPlace: the pods' indexes, verdicts, stable P99 (rollout/inplace.Observed)
    server: "ServerView | None" = None             # spec.server: the SharedServer as its status shows this model


@dataclass(frozen=True)
class ModelPlan:
    status: RankingModelStatus
    events: tuple[Event, ...] = ()
    applies: tuple[dict[str, Any], ...] = ()       # applied (server-side), in order
    creates: tuple[dict[str, Any], ...] = ()       # created once if absent, never re-applied (gate Jobs)
    deletions: tuple[tuple[str, str], ...] = ()    # (kind, name), of what exists
    pod_patches: tuple[tuple[str, dict[str, Any]], ...] = ()  # (pod, metadata merge patch): no restart
    monitors: tuple[dict[str, Any], ...] = ()      # ServiceMonitors, applied where the CRD is served
    outcome: str | None = None                     # the rollout's end, when this reconcile ended it
    gate_results: tuple[GateResult, ...] = ()      # status.gates entries new in this reconcile
    in_place_actions: tuple[Any, ...] = ()         # InPlace: loads, unloads and gates the pods must see (rollout/inplace.py)
    not_applied: str | None = None                 # the reason nothing was applied for this generation
    # When to reconcile again with no event (rollout.deadlines): seconds, or None for no deadline;
    # `polls`: also at --interval, for what only a reading of the pods shows.
    requeue_after: float | None = None
    polls: bool = True

    def objects(self) -> list[dict[str, Any]]:
        """Everything the plan writes, as `rankops render` prints it."""
        return [*self.applies, *self.creates, *self.monitors]


def parse(body: dict[str, Any]) -> tuple[RankingModel | None, str | None]:
    """The model (spec and identity), or why its spec is invalid."""
    meta = body.get("metadata", {})
    document = {"apiVersion": body.get("apiVersion", "rankops.io/v1alpha1"), "kind": "RankingModel",
                "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "generation") if meta.get(k) is not None},
                "spec": body.get("spec", {})}
    try:
        return RankingModel.model_validate(document), None
    except ValidationError as exc:
        return None, "; ".join(describe(exc)) + " (fix the spec; the serving version is left untouched)"


def refusal(rm: RankingModel, settings: Settings) -> tuple[str, str] | None:
    """(reason, message) when the spec cannot be applied on this cluster, before anything is read."""
    from rankops.triton import image_fit

    refused = spec_problems(rm.spec, settings.policy)
    if refused:
        return POLICY_REASON, "; ".join(refused) + " (the serving version is left untouched)"
    engines_off, _ = image_fit.engine_mismatches(rm.spec)
    if engines_off:   # Triton would refuse the engine: say so before any pod starts
        return DegradedReason.TENSORRT_VERSION_MISMATCH, "; ".join(engines_off) + " (the serving version is left untouched)"
    return None


def not_applied(status: RankingModelStatus, generation: int | None, reason: str, message: str, now: dt.datetime,
                events: tuple[Event, ...] = ()) -> ModelPlan:
    """A generation that cannot be applied: Degraded says why, and what serves is left as it was."""
    decided = model_status.degraded_only(status, generation, reason, message, iso(now))
    return ModelPlan(decided.status, (*events, *decided.events), not_applied=reason)   # polls: a write to retry


@dataclass(frozen=True)
class Admission:
    """The spec, parsed and checked once per reconcile: the model, or why this generation cannot be
    applied before anything is read (an invalid spec, a field the policy refuses, an engine the
    image cannot run)."""
    rm: RankingModel | None
    refused: tuple[str, str] | None = None    # (reason, message)


def admit(body: dict[str, Any], settings: Settings = Settings()) -> Admission:
    """Parse the spec and check it against the cluster's settings, once (the shell and plan() share it)."""
    rm, invalid = parse(body)
    if rm is None:
        return Admission(None, (DegradedReason.INVALID_SPEC, invalid or "invalid spec"))
    return Admission(rm, refusal(rm, settings))


@dataclass(frozen=True)
class BlockingRead:
    """A read that can block a generation: what it is called (the shell has one reader per name) and
    the (reason, message) it blocks with, from what was observed."""
    name: str
    blocks: Callable[[ModelObserved, RankingModel], tuple[str, str] | None]


# Artifacts the fetcher copies with the model's credentials; a path on the node needs none.
FETCHED_SCHEMES = ("s3://", "gs://", "http://", "https://")


def credentials_secret_needed(rm: RankingModel) -> str | None:
    """The credentials Secret whose existence gates this generation: the one spec.modelCredentialsSecret
    names, when a version fetches with it."""
    secret = rm.spec.model_credentials_secret
    return secret if secret and any(v.model_uri.startswith(FETCHED_SCHEMES) for v in rm.spec.versions) else None


def _credentials_block(observed: ModelObserved, rm: RankingModel) -> tuple[str, str] | None:
    secret, namespace = credentials_secret_needed(rm), rm.metadata["namespace"]
    if not secret or observed.credentials_secret_exists is not False:
        return None
    return DegradedReason.CREDENTIALS_SECRET_NOT_FOUND, (
        f"Secret {secret} (spec.modelCredentialsSecret) does not exist in namespace {namespace}: create it "
        f"(kubectl -n {namespace} create secret generic {secret} --from-literal=AWS_ACCESS_KEY_ID=... "
        "--from-literal=AWS_SECRET_ACCESS_KEY=...) or fix spec.modelCredentialsSecret; the serving version "
        "is left untouched")


def _pool_block(observed: ModelObserved, rm: RankingModel) -> tuple[str, str] | None:
    pool, pool_name = observed.pool, rm.spec.node_pool
    if not pool_name or pool is None:
        return None
    if not pool.exists:
        return DegradedReason.NODE_POOL_NOT_FOUND, (f"GpuNodePool {pool_name} does not exist: create it "
                                                    f"(kubectl apply -f gpunodepool.yaml) or fix spec.nodePool")
    if pool.invalid:
        return DegradedReason.NODE_POOL_INVALID, (f"GpuNodePool {pool_name} has an invalid spec ({pool.invalid}): its "
                                                  "requirements cannot place the model; fix the pool (its author is the "
                                                  "cluster admin) or spec.nodePool")
    return None


def _shape_block(observed: ModelObserved, rm: RankingModel) -> tuple[str, str] | None:
    return (DegradedReason.PLAN_FAILED, observed.plan_failed) if observed.plan_failed else None


# The reads that can block a generation, in the one precedence order: the shell reads them in this
# order and stops at the first that blocks (nothing after it is read), and plan() says the first
# blocker found in the same order. Their reasons follow DEGRADED_PRECEDENCE (a test checks it).
BLOCKING_READS: tuple[BlockingRead, ...] = (
    BlockingRead("credentials", _credentials_block),   # the fetcher's Secret
    BlockingRead("pool", _pool_block),                 # the GpuNodePool the model names
    BlockingRead("shape", _shape_block),               # the planned shape (and its latency profile)
)


def blocker(observed: ModelObserved, rm: RankingModel) -> tuple[str, str] | None:
    """The first reason, in BLOCKING_READS' order, that this generation cannot be applied."""
    for read in BLOCKING_READS:
        found = read.blocks(observed, rm)
        if found:
            return found
    return None


# What a reconcile reads of the model itself besides its spec and status (the manual annotations):
# plan() sees only these, and the model's watch wakes it when one of them changes (runtime).
MODEL_ANNOTATIONS_READ = (PROMOTE_ANNOTATION, ABORT_ANNOTATION, RETRY_ANNOTATION)
# The children whose status a reconcile reads (a Deployment's counts, a Job's conditions): a status
# change of another cached kind (a budget's counts, a Service's) wakes no model (controller/cache).
CHILD_STATUS_READ = frozenset({"Deployment", "Job"})


@dataclass(frozen=True)
class Reads:
    """What a reconcile reads past the blocking reads and the two Deployments, and why each."""
    gates: bool = False            # the gate Jobs of the attempt in flight (a rollout is active)
    canary_pods: bool = False      # the canary's pods and their nodes (a canary Deployment exists)
    judging: bool = False          # the canary analysis reads both tracks' Triton counters
    scaling: bool = False          # spec.autoscaling: the load is due a reading
    other_pods: bool = False       # the non-canary pods (the stable un-Available a while: warm failures)
    external_scaler: bool = False  # autoscaling mode external: the HPA or ScaledObject that targets it
    stable_pods: bool = False      # the stable pods (some may be on a leaving node, or a surge to end)
    in_place: bool = False         # InPlace: the stable pods' repository indexes and P99 (rollout/inplace_phase)

    @property
    def pod_metrics(self) -> bool:
        return self.judging or self.scaling or self.in_place


def reads(rm: RankingModel, status: RankingModelStatus, now: dt.datetime, stable_dep: dict | None,
          canary_dep: dict | None, replicas: int, leaving_nodes: bool) -> Reads:
    """What to read for `rm` once nothing blocks it (`replicas`: the planned shape's), from its
    status and its Deployments as the shell found them. Pure: the shell fulfils these and nothing else."""
    from rankops.rollout import warming
    from rankops.rollout.machine import ACTIVE, CANARY

    rollout = status.rollout
    active = rollout is not None and rollout.phase in ACTIVE
    wanted = (status.autoscaling.desired_replicas if status.autoscaling else None) or replicas   # autoscaled, or planned
    surging = bool(stable_dep) and (stable_dep.get("spec") or {}).get("replicas", 0) > wanted
    from rankops.rollout.inplace_phase import IN_PLACE

    return Reads(gates=active, canary_pods=bool(canary_dep), in_place=active and rollout.phase == IN_PLACE,
                 judging=active and rollout.phase == CANARY and rm.spec.rollout.canary.analysis.enabled,
                 scaling=autoscale.reading_due(rm.spec, status.autoscaling, now),
                 other_pods=warming.reads_all_pods(stable_dep, now),
                 external_scaler=rm.spec.autoscaling.external,
                 stable_pods=leaving_nodes or surging)


@dataclass(frozen=True)
class ServerView:
    """The SharedServer a member names, as read: whether it exists, and its status line for this
    model (api.sharedserver.MemberStatus; None: not listed yet)."""
    found: bool
    line: Any = None

    @classmethod
    def of(cls, server: dict | None, model: str) -> "ServerView":
        from rankops.api.sharedserver import MAX_LISTED_MEMBERS, MemberStatus, SharedServerStatus

        if server is None:
            return cls(False)
        status, _ = SharedServerStatus.from_stored(server.get("status") or {})
        line = next((m for m in status.members if m.name == model), None)
        if line is None and len(status.members) >= MAX_LISTED_MEMBERS:
            # Past what the status lists: every member the server holds is listed, so this one is not.
            line = MemberStatus(name=model, state="Pending", reason=DegradedReason.SERVER_FULL.value, message=(
                f"the server lists its first {MAX_LISTED_MEMBERS} members and holds none past them: "
                f"{model} is not served; it waits for members ahead of it to leave"))
        return cls(True, line)


def member_plan(body: dict[str, Any], rm: RankingModel, observed: ModelObserved, status: RankingModelStatus,
                events: tuple[Event, ...] = ()) -> ModelPlan:
    """A member of a SharedServer: the server renders and loads it (serverplan.plan_server); its own
    plan writes nothing but its status, read off the server's (model_status.member_status). The
    server's status changes wake it; nothing here polls."""
    server = observed.server or ServerView(False)
    decided = model_status.member_status(status, rm.spec, rm.spec.server, server.line, server.found,
                                         body["metadata"].get("generation"), iso(observed.now))
    return ModelPlan(decided.status, (*events, *decided.events), polls=False)


def plan(body: dict[str, Any], observed: ModelObserved, settings: Settings = Settings(),
         events: tuple[Event, ...] = (), status: RankingModelStatus | None = None,
         admission: Admission | None = None) -> ModelPlan:
    """The plan of one RankingModel (`body`: its metadata and spec) from what was observed.
    `status`: its status as read (the shell's, through model_status.known_status); None: the
    body's, which must validate as it is (a model as new has none). `events`: what the shell
    already has to say (e.g. StatusFieldsUnknown). `admission`: admit(body, settings), when the
    shell has it already (None: admitted here)."""
    now, meta = observed.now, body["metadata"]
    gen = meta.get("generation")
    if status is None:
        status = RankingModelStatus.model_validate(body.get("status") or {})
    admission = admission if admission is not None else admit(body, settings)
    rm = admission.rm
    if rm is not None and rm.spec.server and not admission.refused:
        return member_plan(body, rm, observed, status, events)
    blocked = admission.refused or blocker(observed, rm)
    if blocked:
        return not_applied(status, gen, *blocked, now, events)
    resolved = observed.resolved
    assert resolved is not None, "the shell resolves the shape before planning"
    notes = _image_notes(rm)
    scaling = _autoscaling(rm, status, observed, resolved)   # the replicas follow the load (rankops.autoscale)
    if scaling is not None:
        resolved = dataclasses.replace(resolved, replicas=scaling.replicas)
    crowded = shared_node(observed.stable_nodes, resolved.replicas, failure_tolerance(rm.spec),
                          rm.spec.disruption.node_spread is NodeSpread.required)
    if crowded:   # serving, but one node's loss takes more than the tolerance: said, not Degraded
        notes += (crowded,)
        # Said once: the note lives in an AsExpected Degraded's message (another reason's hides it,
        # and the Event waits until that one clears).
        was = get_condition(status.conditions, DEGRADED)
        if (was is None or was.reason == DegradedReason.AS_EXPECTED) and crowded not in (was.message if was else ""):
            events += (Event("Warning", "ReplicasShareANode", crowded),)

    s_desired, _, s_settled, s_version = deployment_view(observed.stable_dep)
    c_desired = deployment_view(observed.canary_dep)[0]
    decision = step(rm.spec, status, Observed(
        now=now, canary_pods=tuple(seen for _, seen in observed.canary_pods), canary_desired=c_desired,
        stable_updated_ready=s_settled, stable_desired=s_desired, stable_template_version=s_version,
        gates=observed.gates, annotations=_annotations_read(meta), track_metrics=observed.track_metrics,
        metrics_problems=observed.metrics_problems, metrics_unread=observed.metrics_unread,
        replicas=resolved.replicas, canary_warm_failing=_canary_warm_failing(observed),
        in_place_fit=_in_place_fit(rm, status, resolved, s_version), in_place=observed.in_place))
    pool = observed.pool or PoolView()
    # Replicas on leaving nodes: a surge elsewhere first, then the old ones go (rollout/disruption).
    moves = plan_moves(resolved.replicas, observed.stable_pods)
    if moves.surge:
        decision = dataclasses.replace(decision, serving=dataclasses.replace(decision.serving, stable_surge=moves.surge))
    try:
        applies, creates = _children(rm, decision, resolved, pool.requirements, settings, observed)
        if scaling is not None and scaling.external:   # the user's autoscaler owns the stable's replicas
            applies = autoscale.without_replicas(applies, names.deployment_name(meta["name"], names.STABLE))
    except RenderError as exc:
        return not_applied(status, gen, DegradedReason.RENDER_FAILED, str(exc), now, events)

    canary = decision.serving.canary_version
    c_ready = ready_count((seen for _, seen in observed.canary_pods), canary) if canary else 0
    decided = model_status.decide(rm.spec, status, decision, model_status.Facts(
        now=iso(now), generation=gen,
        stable=model_status.StableView(observed.stable_dep is not None, *deployment_view(observed.stable_dep)),
        canary_ready=c_ready, replicas=resolved.replicas, plan=observed.plan_status,
        problems=tuple(resolved.problems), unbatched=tuple(resolved.unbatched), pool_note=pool.note,
        placement=pool.placement, notes=notes, warm_failing=observed.warm_failing,
        unschedulable=observed.unschedulable, moving=moves.message))
    name = meta["name"]
    deletions = model_status.deletions(name, decision, observed.present, observed.jobs)
    monitors = tuple(monitoring_objects(rm, settings.service_monitor_labels)) \
        if settings.service_monitor_labels is not None else ()
    final = decided.status if scaling is None else decided.status.model_copy(update={"autoscaling": scaling.status})
    requeue = deadlines.after_reconcile(rm.spec, status, final, gen, now)
    return ModelPlan(
        status=final, requeue_after=requeue.after_s, polls=requeue.polls,
        events=(*events, *decision.events, *decided.events, *(Event(*e) for e in (scaling.events if scaling else ()))),
        applies=tuple(applies),
        creates=tuple(creates), deletions=tuple(deletions),
        pod_patches=tuple(_canary_traffic(rm, decision, observed)) + tuple(
            (pod, {"metadata": {"annotations": {names.ANNOTATION_DELETION_COST: LEAVING_COST}}}) for pod in moves.let_go),
        monitors=monitors, outcome=decision.outcome,
        gate_results=tuple(g for g in decision.gates if g not in status.gates),
        in_place_actions=decision.in_place_actions)


def _in_place_fit(rm: RankingModel, status: RankingModelStatus, resolved: ResolvedShape,
                  serving: str | None) -> Any:
    """rollout.strategy inPlace: spec.version beside the version serving, by the plan's memory
    arithmetic (planner/two_versions); None when not asked, or no plan was made."""
    from rankops.rollout.inplace_phase import versions_side_by_side

    stable = status.stable_version or serving
    if not rm.spec.rollout.switches_in_place or resolved.plan is None or stable in (None, rm.spec.version):
        return None
    return versions_side_by_side(rm.spec, resolved.plan, stable, rm.spec.version)


def _annotations_read(meta: dict[str, Any]) -> dict[str, str]:
    annotations = meta.get("annotations") or {}
    return {k: annotations[k] for k in MODEL_ANNOTATIONS_READ if k in annotations}


def _autoscaling(rm: RankingModel, status: RankingModelStatus, observed: ModelObserved,
                 resolved: ResolvedShape) -> autoscale.Scaling | None:
    return autoscale.step(
        rm.spec, status.autoscaling, observed.autoscale_reading, resolved.replicas, failure_tolerance(rm.spec),
        observed.now, plan=resolved.plan, plan_status=observed.plan_status,
        deployment_replicas=deployment_view(observed.stable_dep)[0] if observed.stable_dep else None,
        external_name=observed.external_scaler, problems=observed.autoscale_problems)


def deployment_view(dep: dict | None) -> tuple[int, int, int, str | None]:
    """(desired, ready, updated-and-ready, template version) of a Deployment."""
    if not dep:
        return 0, 0, 0, None
    spec, st = dep.get("spec", {}), dep.get("status") or {}
    desired = spec.get("replicas", 1)
    ready = st.get("readyReplicas", 0)
    current = st.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
    settled = current and st.get("updatedReplicas", 0) >= desired and st.get("replicas", 0) == desired
    # An in-place model's template names no version (a switch must not restart its pods): its own label does.
    version = spec.get("template", {}).get("metadata", {}).get("labels", {}).get(names.LABEL_VERSION) \
        or (dep["metadata"].get("labels") or {}).get(names.LABEL_VERSION)
    return desired, ready, (min(ready, desired) if settled else 0), version


def _image_notes(rm: RankingModel) -> tuple[str, ...]:
    """What rankops could not check about the Triton image (said in Degraded's message when
    nothing is wrong)."""
    from rankops.triton import image_fit

    _, notes = image_fit.engine_mismatches(rm.spec)
    unknown = image_fit.unknown_note(rm.spec.triton_image) if rm.spec.node_pool else None
    return tuple(notes) + ((unknown,) if unknown else ())


def _canary_warm_failing(observed: ModelObserved) -> tuple[str, ...]:
    from rankops.rollout import warming

    return warming.warm_failures(pod for pod, _ in observed.canary_pods)


def _children(rm: RankingModel, decision: Decision, resolved: ResolvedShape, pool_requirements: Any,
              settings: Settings, observed: ModelObserved) -> tuple[list[dict], list[dict]]:
    """(the objects to apply, the gate Jobs to create if absent), pull secrets on every pod."""
    serving, policy = decision.serving, settings.policy
    wanted = desired_objects(rm, serving, resolved, pool_requirements, policy)
    if decision.reference_version:
        wanted += [with_owner(o, rm) for o in track_objects(
            rm, names.REFERENCE, decision.reference_version, 1, False, resolved.shape, pool_requirements,
            policy=policy)]
    wanted += [with_owner(o, rm) for o in traffic_objects(rm, serving)]
    existing = {job for job, _ in observed.jobs}
    creates = []
    for gate in decision.gate_jobs:
        job = _gate_job(rm, gate, decision.rollout.version, attempt_id(decision.rollout),
                        decision.stable_version, bool(decision.reference_version), policy)
        if job["metadata"]["name"] not in existing:
            creates.append(job)
    foreign = pod_volume_problems(wanted + creates, policy)   # never expected: rendering refuses them first
    if foreign:
        raise RenderError("; ".join(foreign))
    return (with_pull_secrets(wanted, list(settings.pull_secrets)),
            with_pull_secrets(creates, list(settings.pull_secrets)))


def _gate_job(rm: RankingModel, gate: str, version: str, attempt: str, stable_version: str,
              reference_served: bool, policy: TenantPolicy) -> dict[str, Any]:
    return with_owner(gate_jobs.gate_job(rm, gate, version, attempt, stable_version,
                                         reference_served=reference_served, policy=policy), rm)


def rollout_gate_jobs(body: dict[str, Any], settings: Settings = Settings()) -> list[dict[str, Any]]:
    """The gate Jobs (warmup, then equivalence) a rollout to the model's spec.version creates, as
    `rankops render --gate-jobs` prints them: the ones `plan` creates in the rollout's phases, for an
    attempt id fixed by the version (a real rollout's comes from its start time), from a stable
    version that is not the equivalence reference (a versions[] reference is served on its own
    track). Pull secrets on their pods; RenderError for a volume the policy refuses."""
    rm, invalid = parse(body)
    if rm is None:
        raise RenderError(invalid or "invalid spec")
    version = rm.spec.version
    attempt = new_attempt_id(version, "rankops-render", None)
    reference_served = reference_version_of(rm.spec, "") is not None
    jobs = [_gate_job(rm, gate, version, attempt, "", reference_served, settings.policy) for gate in GATES]
    foreign = pod_volume_problems(jobs, settings.policy)
    if foreign:
        raise RenderError("; ".join(foreign))
    return with_pull_secrets(jobs, list(settings.pull_secrets))


def _canary_traffic(rm: RankingModel, decision: Decision, observed: ModelObserved) -> list[tuple[str, dict[str, Any]]]:
    """Live, Ready canary pods of the canary version behind the serving Service (or out of it),
    labelled without a restart: `replicas` traffic splits by Ready pods."""
    serving = decision.serving
    if not serving.canary_version or rm.spec.rollout.canary.traffic is not TrafficMode.replicas:
        return []
    patches = []
    for pod, seen in observed.canary_pods:
        want = "on" if serving.canary_traffic and counts_ready(seen, serving.canary_version) else "off"
        if (pod["metadata"].get("labels") or {}).get(names.LABEL_TRAFFIC) != want:
            patches.append((pod["metadata"]["name"], {"metadata": {"labels": {names.LABEL_TRAFFIC: want}}}))
    return patches


def as_new(body: dict[str, Any], settings: Settings = Settings(), pool_requirements: Any = None,
           now: dt.datetime | None = None) -> ModelPlan:
    """The plan of a model as new (nothing observed but its shape): what `rankops render` prints."""
    from rankops.render.desired import resolve_shape

    rm, _ = parse(body)
    observed_now = now or dt.datetime.now(dt.timezone.utc)
    if rm is None:
        return plan(body, ModelObserved(now=observed_now), settings)
    try:
        resolved, plan_failed = resolve_shape(rm.spec), None
    except RenderError as exc:
        resolved, plan_failed = None, str(exc)
    return plan(body, ModelObserved(now=observed_now, resolved=resolved, plan_failed=plan_failed,
                                    pool=PoolView(requirements=pool_requirements)), settings)
