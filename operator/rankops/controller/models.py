"""Reconcile one RankingModel: observe (from the caches), plan (rankops.modelplan, pure),
execute what the plan says, and return what to record.

Nothing here decides: the plan says what to apply, create, delete and patch, the status and the
Events; this module reads what the plan needs, in the precedence list's order (a generation that
cannot be applied needs nothing more read), and writes it. It is level-based: the same inputs
give the same writes, so running it twice is a no-op.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from rankops import autoscale, model_status, modelplan
from rankops.api.phases import DegradedReason
from rankops.api.rankingmodel import GateResult, RankingModel, RankingModelStatus, RolloutStatus
from rankops.controller import inplace_shell, pod_metrics, writes
from rankops.controller.kube import ApiError, ApiMissing, InvalidName, Kube
from rankops.controller.model_memory import MONITOR_REAPPLY_S, ModelMemory
from rankops.controller.plans import PlanPending, Plans
from rankops.controller.unchanged import applied_digest
from rankops.render import names, serving
from rankops.render.desired import RenderError, with_owner
from rankops.render.policy import TenantPolicy
from rankops.rollout import disruption
from rankops.rollout import gate_reading
from rankops.rollout import jobs as gate_jobs
from rankops.rollout import warming
from rankops.rollout.machine import GATES, Event, GateObservation, attempt_id, passed_gates
from rankops.rollout.readiness import PodObservation, observe_pod, unschedulable_summary

log = logging.getLogger("rankops.models")
POLICY_REASON = modelplan.POLICY_REASON
SPEC_NOT_APPLIED = model_status.SPEC_NOT_APPLIED


@dataclass
class Result:
    status: RankingModelStatus
    events: list[Event] = field(default_factory=list)
    outcome: str | None = None
    gate_results: list[GateResult] = field(default_factory=list)
    write: bool = True    # False: the status is left as stored (nothing decided yet)
    requeue_after: float | None = None   # the plan's next deadline (seconds), when it has one
    polls: bool = True                   # also again at --interval (modelplan.ModelPlan.polls)


def _job_observation(kube: Kube, namespace: str, job: dict | None) -> GateObservation:
    """What a gate Job shows (rollout.gate_reading decides); its pods are listed only once it finished."""
    if not gate_reading.finished(job):
        return gate_reading.observation(job)
    # This Job's own pods (by uid), not those of an earlier Job that had the same name.
    pods = kube.list("Pod", namespace,
                     label_selector=f"batch.kubernetes.io/controller-uid={job['metadata'].get('uid')}")
    return gate_reading.observation(job, pods)


def _gate_observations(kube: Kube, rm_meta: dict, rollout: RolloutStatus,
                       gates: list[GateResult]) -> dict[str, GateObservation]:
    """What the gate Jobs of this rollout attempt show; a Job that merely has the name is not read,
    and a gate whose passing verdict is recorded for this attempt is not read again."""
    name, namespace, version = rm_meta["name"], rm_meta["namespace"], rollout.version
    attempt = attempt_id(rollout)
    seen: dict[str, GateObservation] = {}
    for gate in (g for g in GATES if g not in passed_gates(gates, rollout)):
        job = kube.get("Job", namespace, names.gate_job_name(name, gate, version, attempt))
        if job is not None and not gate_jobs.is_gate_job_of(job, name, rm_meta.get("uid"), gate, version, attempt):
            seen[gate] = gate_reading.foreign(job["metadata"]["name"], gate, version, attempt)
        else:
            seen[gate] = _job_observation(kube, namespace, job)
    return seen


def _canary_pods(kube: Kube, namespace: str, model: str) -> list[tuple[dict, PodObservation]]:
    """The canary pods, each with what its node shows (gathered here; rollout.readiness decides)."""
    pods = kube.list("Pod", namespace, label_selector=f"{names.LABEL_MODEL}={model},{names.LABEL_TRACK}={names.CANARY}")
    bound = {(p.get("spec") or {}).get("nodeName") for p in pods} - {None, ""}
    nodes = {node: kube.get("Node", None, node) for node in sorted(bound)}
    return [(p, observe_pod(p, nodes.get((p.get("spec") or {}).get("nodeName")))) for p in pods]


def _pod_problems(kube: Kube, namespace: str, model: str, canary_pods: list[tuple[dict, PodObservation]],
                  read_others: bool) -> tuple[tuple[str, ...], str | None]:
    """(the pods kept un-Ready because the model fails its warm requests (rollout.warming decides),
    the stable pods the scheduler cannot place and why): the canary's pods are already listed; the
    others only while modelplan.reads says so (the stable un-Available a while: one request, not one
    per reconcile)."""
    pods = [pod for pod, _ in canary_pods]
    others = []
    if read_others:
        others = [p for p in kube.list("Pod", namespace, labels={names.LABEL_MODEL: model})
                  if (p["metadata"].get("labels") or {}).get(names.LABEL_TRACK) != names.CANARY]
    stable = [p for p in others if (p["metadata"].get("labels") or {}).get(names.LABEL_TRACK) == names.STABLE]
    return warming.warm_failures(pods + others), unschedulable_summary(stable, "stable")


def _credentials_secret_exists(kube: Kube, rm: RankingModel, memory: ModelMemory) -> bool | None:
    """Whether the fetcher's credentials Secret exists, when modelplan says a version fetches with it;
    None when it need not be read, or may not be (said once per process: it is how the cluster admin
    set RBAC up)."""
    secret, namespace = modelplan.credentials_secret_needed(rm), rm.metadata["namespace"]
    if not secret:
        return None
    try:
        return kube.exists("Secret", namespace, secret)
    except ApiError as exc:
        if exc.status != 403:
            raise
        if not memory.secrets_unchecked:
            memory.secrets_unchecked = True
            log.info("the operator may not get Secrets (chart RBAC): not checking that "
                     "spec.modelCredentialsSecret exists")
        return None


def _read_profile(kube: Kube, rm: RankingModel) -> dict[int, float] | None:
    ref = rm.spec.planning.latency_profile_config_map if rm.spec.planning else None
    if ref is None:
        return None
    from rankops.planner.profile import parse_profile_text

    cm = kube.get("ConfigMap", rm.metadata["namespace"], ref.name)
    text = ((cm or {}).get("data") or {}).get(ref.key)
    if text is None:
        raise RenderError(f"planning.latencyProfileConfigMap: ConfigMap {ref.name} key {ref.key} not found; "
                          "create it or give planning.latencyProfile inline")
    try:
        return dict(parse_profile_text(text, source=f"ConfigMap {ref.name}/{ref.key}").points)
    except ValueError as exc:
        raise RenderError(f"planning.latencyProfileConfigMap: {exc}") from exc


def reconcile(kube: Kube, body: dict[str, Any], now: dt.datetime | None = None, *,
              service_monitors: bool = False, service_monitor_labels: dict[str, str] | None = None,
              policy: TenantPolicy = TenantPolicy(), pull_secrets: tuple[str, ...] = (),
              metrics_networks: tuple[str, ...] = (), plans: Plans | None = None,
              leaving_nodes: frozenset[str] = frozenset(), stable_nodes: tuple[tuple[str, int], ...] = (),
              memory: ModelMemory | None = None,
              server_of: Callable[[str, str], dict | None] | None = None) -> Result:
    """`service_monitors`: also apply the model's ServiceMonitor (`rankops run --service-monitors`),
    labelled with `service_monitor_labels` besides the usual ones. `policy`: the host directories
    and images the cluster admin lets a RankingModel use (`rankops run --allow-*`).
    `metrics_networks`: the pod IPs whose Triton metrics the canary analysis reads (empty: all).
    `plans`: the plan pool (None: the memory's); one with a planner thread makes a plan this model
    lacks there, this reconcile then changes nothing, and the model is reconciled again once it is.
    `leaving_nodes`: nodes the model has pods on that look like they are leaving; `stable_nodes`:
    (node, pods) of its stable track (both from node_pods, the pod watch).
    `memory`: what the ModelController remembers across reconciles (None: nothing, as a new process).
    `server_of`: (namespace, name) -> the SharedServer as its watch shows it (None: read from the API).

    Read -> plan -> execute: the spec is admitted once (parsed and checked), `observe` reads what
    modelplan says to read, plan() decides once, `execute` writes; the caller records the result."""
    memory = memory if memory is not None else ModelMemory()
    now = now or dt.datetime.now(dt.timezone.utc)
    events: list[Event] = []
    status, unknown = model_status.known_status(body.get("status") or {})
    if unknown:   # said once: the status written next leaves them out (the merge patch removes them)
        events.append(Event("Warning", "StatusFieldsUnknown", model_status.unknown_fields_message(unknown)))
    settings = modelplan.Settings(policy, tuple(pull_secrets),
                                  (service_monitor_labels or {}) if service_monitors else None)
    admission = modelplan.admit(body, settings)
    if admission.refused:   # nothing to read: the plan says why
        return _result(modelplan.plan(body, modelplan.ModelObserved(now=now), settings, tuple(events), status,
                                      admission))
    rm = admission.rm
    if rm.spec.server:   # a member: the SharedServer serves it, its status is the server's word (nothing applied here)
        found = (server_of or (lambda ns, name: kube.get("SharedServer", ns, name)))(rm.metadata["namespace"],
                                                                                    rm.spec.server)
        observed = modelplan.ModelObserved(now=now, server=modelplan.ServerView.of(found, rm.metadata["name"]))
        return _result(modelplan.plan(body, observed, settings, tuple(events), status, admission))
    try:
        observed = observe(kube, rm, status, now, metrics_networks, plans or memory.plans, leaving_nodes, memory,
                           stable_nodes)
    except PlanPending:
        return Result(status, events, write=False)   # nothing changes until the plan is made; then this model is kicked
    planned_now = modelplan.plan(body, observed, settings, tuple(events), status, admission)
    if planned_now.not_applied:
        return _result(planned_now)
    try:
        execute(kube, rm, planned_now, memory)
    except writes.ChildRefused as exc:   # the plan's own Events count only once it is applied
        return _result(modelplan.not_applied(status, rm.metadata.get("generation"), DegradedReason.CHILD_REFUSED, str(exc),
                                             now, tuple(events)))
    except InvalidName as exc:   # never expected: the API models refuse such names first
        return _result(modelplan.not_applied(status, rm.metadata.get("generation"), DegradedReason.INVALID_SPEC,
                                             f"{exc}; the serving version is left untouched", now, tuple(events)))
    return _result(planned_now)


def _result(done: modelplan.ModelPlan) -> Result:
    return Result(done.status, list(done.events), done.outcome, list(done.gate_results),
                  requeue_after=done.requeue_after, polls=done.polls)


@dataclass(frozen=True)
class _Reading:
    """What a blocking read needs (one reconcile's)."""
    kube: Kube
    rm: RankingModel
    status: RankingModelStatus
    plans: Plans
    memory: ModelMemory


def _read_credentials(r: _Reading) -> dict[str, Any]:
    return {"credentials_secret_exists": _credentials_secret_exists(r.kube, r.rm, r.memory)}


def _read_pool(r: _Reading) -> dict[str, Any]:
    return {"pool": _pool_view(r.kube, r.rm) if r.rm.spec.node_pool else None}


def _read_shape(r: _Reading) -> dict[str, Any]:
    meta = r.rm.metadata
    try:
        resolved, plan_status = r.plans.resolve(r.rm.spec, _read_profile(r.kube, r.rm), r.status.plan,
                                                (meta["namespace"], meta["name"], meta.get("uid")))
    except RenderError as exc:
        return {"plan_failed": str(exc)}
    return {"resolved": resolved, "plan_status": plan_status}


# One reader per modelplan.BLOCKING_READS entry, by name (a test checks they match).
BLOCKING_READERS = {"credentials": _read_credentials, "pool": _read_pool, "shape": _read_shape}


def observe(kube: Kube, rm: RankingModel, status: RankingModelStatus, now: dt.datetime,
            metrics_networks: tuple[str, ...] = (), plans: Plans | None = None,
            leaving_nodes: frozenset[str] = frozenset(), memory: ModelMemory | None = None,
            stable_nodes: tuple[tuple[str, int], ...] = ()) -> modelplan.ModelObserved:
    """What the plan of `rm` needs from the cluster: the blocking reads in modelplan.BLOCKING_READS'
    order, stopping at the first that blocks (the plan says it); then what modelplan.reads says.
    PlanPending: the shape is being planned on the planner's thread."""
    memory = memory if memory is not None else ModelMemory()
    reading = _Reading(kube, rm, status, plans or memory.plans, memory)
    observed = modelplan.ModelObserved(now=now)
    for read in modelplan.BLOCKING_READS:
        observed = dataclasses.replace(observed, **BLOCKING_READERS[read.name](reading))
        if read.blocks(observed, rm):
            return observed
    name, namespace, uid = rm.metadata["name"], rm.metadata["namespace"], rm.metadata.get("uid")
    stable_dep = kube.get("Deployment", namespace, names.deployment_name(name, names.STABLE))
    canary_dep = kube.get("Deployment", namespace, names.deployment_name(name, names.CANARY))
    wants = modelplan.reads(rm, status, now, stable_dep, canary_dep, observed.resolved.replicas, bool(leaving_nodes))
    rollout = status.rollout
    gates_seen = _gate_observations(kube, rm.metadata, rollout, status.gates) if wants.gates else {}
    canary_pods = _canary_pods(kube, namespace, name) if wants.canary_pods else []
    # The serving pods' Triton numbers (one read for both uses): while the canary serves, both
    # tracks' for the canary analysis; for spec.autoscaling, the load, at most every MIN_READING_S.
    snapshot = pod_metrics.read(kube, memory.metrics, (namespace, name, uid), namespace, name,
                                {names.STABLE: stable_dep, names.CANARY: canary_dep}, metrics_networks) \
        if wants.pod_metrics else None
    track_metrics, metrics_problems, metrics_unread = None, (), {}
    if wants.judging and snapshot is not None:
        track_metrics = snapshot.counters() if snapshot.readings["canary"] else None
        metrics_problems = snapshot.problems
        metrics_unread = {track: snapshot.not_read(track) for track in snapshot.unread if snapshot.not_read(track)}
    load, load_problems = autoscale.load_reading(snapshot, status.autoscaling) \
        if wants.scaling and snapshot else (None, ())
    in_place = inplace_shell.observe(kube, memory, rm, status, stable_dep, snapshot, metrics_networks, now) \
        if wants.in_place else None
    warm_failing, unschedulable = _pod_problems(kube, namespace, name, canary_pods, wants.other_pods)
    scaler = external_scaler(kube, namespace, names.deployment_name(name, names.STABLE)) \
        if wants.external_scaler else None
    jobs = tuple((job["metadata"]["name"], gate_reading.finished(job)) for job in kube.list(
        "Job", namespace, labels={names.LABEL_MODEL: name, "app.kubernetes.io/name": names.GATE_APP}))
    # A Job under a gate's name that is not this model's (no labels) exists all the same: not created.
    foreign = tuple((names.gate_job_name(name, gate, rollout.version, attempt_id(rollout)), True)
                    for gate, seen in gates_seen.items() if seen.failure_reason == "ForeignJob")
    tracks = [child for track in (names.CANARY, names.REFERENCE)
              for child in model_status.track_children(name, track)]
    present = frozenset(child for child in tracks if kube.get(child[0], namespace, child[1]) is not None)
    stable_pods = _stable_pods(kube, namespace, name, leaving_nodes, observed.pool) if wants.stable_pods else ()
    return dataclasses.replace(
        observed, stable_dep=stable_dep, canary_dep=canary_dep, stable_pods=stable_pods, stable_nodes=stable_nodes,
        canary_pods=tuple(canary_pods), gates=gates_seen, track_metrics=track_metrics,
        metrics_problems=metrics_problems, metrics_unread=metrics_unread, warm_failing=warm_failing,
        unschedulable=unschedulable, jobs=jobs + foreign, present=present, autoscale_reading=load,
        autoscale_problems=load_problems, external_scaler=scaler, in_place=in_place)


def external_scaler(kube: Kube, namespace: str, deployment: str) -> str | None:
    """autoscaling mode external: what autoscale.scaler_of finds among the namespace's
    HorizontalPodAutoscalers (one list, for such models only); None when the operator may not list them."""
    try:
        found = kube.list("HorizontalPodAutoscaler", namespace)
    except (ApiMissing, ApiError):
        return None
    return autoscale.scaler_of(found, deployment)


def _stable_pods(kube: Kube, namespace: str, model: str, leaving_nodes: frozenset[str],
                 pool: modelplan.PoolView | None) -> tuple[Any, ...]:
    """The stable track's pods, each with whether its node is leaving (the pool says whether
    replicas move off failing nodes); only the leaving nodes are read."""
    pods = kube.list("Pod", namespace, label_selector=f"{names.LABEL_MODEL}={model},{names.LABEL_TRACK}={names.STABLE}")
    nodes = {node: kube.get("Node", None, node) for node in sorted(leaving_nodes)}
    return tuple(disruption.pods_of(pods, nodes, pool.move_from_failing if pool else True))


def _pool_view(kube: Kube, rm: RankingModel) -> modelplan.PoolView:
    """The GpuNodePool the model names, as modelplan.pool_view sees it; its validated ready nodes
    are listed only when that asks for them."""
    pool = kube.get("GpuNodePool", None, rm.spec.node_pool)
    view = modelplan.pool_view(rm, pool)
    if view.reads_ready_nodes:
        view = modelplan.pool_view(rm, pool, kube.list("Node", labels=modelplan.ready_node_labels(rm.spec.node_pool)))
    return view


def execute(kube: Kube, rm: RankingModel, done: modelplan.ModelPlan, memory: ModelMemory | None = None) -> None:
    """Write what the plan says: patch pods (canary traffic labels, deletion costs), apply (what
    differs; a new set of children dry-run first, see writes), create the gate Jobs it creates,
    delete, and the optional ServiceMonitor last."""
    memory = memory if memory is not None else ModelMemory()
    namespace = rm.metadata["namespace"]
    # Pods first: a pod to let go has its deletion cost lowered before the Deployment scales down.
    for pod, patch in done.pod_patches:
        kube.merge_patch("Pod", namespace, pod, patch)
    if rm.spec.autoscaling.external:   # leaving spec.replicas out must not reset it (writes.hand_over_replicas)
        memory.writes.hand_over_replicas(kube, namespace, names.deployment_name(rm.metadata["name"], names.STABLE),
                                  list(done.applies))
    memory.writes.apply_all(kube, rm.metadata, [*done.applies, *done.creates])
    # Once the children are accepted (a refused set leaves nothing behind); a pod that starts before
    # the key is there waits for it (CreateContainerConfigError, retried by the kubelet).
    ensure_api_key(kube, rm, memory)
    if rm.spec.rollout.switches_in_place:
        inplace_shell.nudge_stagers(kube, rm, done.applies)
    rollout = done.status.rollout
    inplace_shell.execute(memory, rm, rollout.in_place if rollout else None, done.in_place_actions,
                          rollout.attempt if rollout else None)
    for kind, child in done.deletions:
        kube.delete(kind, namespace, child)
    uid = rm.metadata.get("uid", "")
    if rm.spec.network_policy.enabled:
        memory.network_policies.add(uid)
    elif uid in memory.network_policies:   # turned off: the one this process applied goes
        kube.delete("NetworkPolicy", namespace, names.network_policy_name(rm.metadata["name"]))
        memory.network_policies.discard(uid)
    if done.monitors:
        _apply_monitoring(kube, rm, done.monitors, memory)


def ensure_api_key(kube: Kube, rm: RankingModel, memory: ModelMemory) -> None:
    """The model's restricted-API key Secret (render.serving.api_key_secret): created once, with a
    random key, owned by the model; never rewritten (pods running hold the key they started with).
    Once per model and process, one create: a 409 says it is there already (its data is never read
    back), and a new model costs one request, not a read and a create."""
    uid, namespace, model = rm.metadata.get("uid", ""), rm.metadata["namespace"], rm.metadata["name"]
    if uid in memory.api_keys:
        return
    try:
        kube.create(with_owner(serving.api_key_secret(model, namespace, secrets.token_hex(32)), rm))
    except ApiError as exc:
        if exc.status != 409:   # there already (this process's earlier life, another replica): it holds a key
            raise
    memory.api_keys.add(uid)


def _apply_monitoring(kube: Kube, rm: RankingModel, monitors: tuple[dict[str, Any], ...], memory: ModelMemory) -> None:
    """Apply the ServiceMonitor last, and never fail the reconcile for it: monitoring is optional.
    Without the Prometheus Operator's CRD it is skipped (tried again each reconcile, so installing
    the CRD later is enough)."""
    for obj in monitors:
        key, digest = (obj["metadata"]["namespace"], obj["metadata"]["name"]), applied_digest(obj)
        done = memory.monitors_applied.get(key)
        if done and done[0] == digest and memory.clock() - done[1] < MONITOR_REAPPLY_S:
            continue   # applied as it is now, lately: not a request per reconcile (it is not watched)
        try:
            kube.apply(obj)
        except ApiMissing:
            memory.note("missing", logging.INFO, "ServiceMonitors are on, but this cluster does not serve "
                  "monitoring.coreos.com/v1 servicemonitors (no Prometheus Operator CRDs): not creating them")
        except ApiError as exc:
            memory.note(f"http-{exc.status}", logging.WARNING,
                  f"could not apply ServiceMonitor {obj['metadata']['namespace']}/{obj['metadata']['name']}: "
                  f"{exc.status} {exc.reason} (serving is unaffected; a 403 means the operator lacks "
                  "servicemonitors rights: set the chart value monitoring.tritonServiceMonitors=true)")
        else:
            memory.monitoring_notes.clear()
            memory.monitors_applied[key] = (digest, memory.clock(), rm.metadata["name"], rm.metadata.get("uid") or "")
