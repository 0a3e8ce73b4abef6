"""Reconcile one RankingModel: read the cluster, ask the pure core, apply, and report.

Everything that decides lives in rankops.render and rankops.rollout; this module only gathers
observations, applies what the core returns, deletes what it no longer wants, and builds the
status. It is level-based: the same inputs give the same writes, so running it twice is a no-op.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rankops.api.errors import describe
from rankops.api.rankingmodel import RankingModel, TrafficMode
from rankops.controller import canary_metrics, writes
from rankops.controller.kube import ApiError, ApiMissing, InvalidName, Kube
from rankops.controller.plans import PlanPending, Plans
from rankops.controller.unchanged import applied_digest
from rankops.render import names, planned
from rankops.render.desired import (RenderError, ResolvedShape, desired_objects, monitoring_objects, resolve_shape,
                                    track_objects, with_owner)
from rankops.render.policy import TenantPolicy, pod_volume_problems, spec_problems
from rankops.render.pullsecrets import with_pull_secrets
from rankops.render.traffic import traffic_objects
from rankops.rollout import jobs as gate_jobs
from rankops.rollout import status_decisions
from rankops.rollout import warming
from rankops.rollout.machine import (ACTIVE, CANARY, GATES, RETRY_ANNOTATION, Decision, Event, GateObservation,
                                     Observed, attempt_id, iso, passed_gates, step)
from rankops.rollout.readiness import PodObservation, counts_ready, observe_pod, ready_count, unschedulable_summary
from rankops.validator import image_fit
from rankops.validator.node import LABEL_POOL, LABEL_READY, label_value

log = logging.getLogger("rankops.models")
GATE_APP = "rankops-gate"
POLICY_REASON = "NotAllowedOnThisCluster"   # a field the cluster admin's policy refuses
SPEC_NOT_APPLIED = status_decisions.SPEC_NOT_APPLIED
FETCHED_SCHEMES = ("s3://", "gs://", "http://", "https://")  # artifacts the fetcher copies, with credentials


@dataclass
class Result:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    outcome: str | None = None
    gate_results: list[dict] = field(default_factory=list)


def _spec_document(body: dict[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata", {})
    return {"apiVersion": body.get("apiVersion", "rankops.io/v1alpha1"), "kind": "RankingModel",
            "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "generation") if meta.get(k) is not None},
            "spec": body.get("spec", {})}


def _degraded_only(body: dict, reason: str, message: str, events: list[Event], now: dt.datetime) -> Result:
    """A problem only the operator can see: say so, and leave whatever is serving untouched."""
    decided = status_decisions.degraded_only(body.get("status") or {}, body["metadata"].get("generation"),
                                             reason, message, iso(now))
    return Result(decided.status, [*events, *decided.events])


def _job_finished(job: dict) -> bool:
    return any(c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
               for c in (job.get("status") or {}).get("conditions") or [])


def _job_observation(kube: Kube, namespace: str, job: dict | None) -> GateObservation:
    from rankops.gates.verdict import parse_verdict

    if job is None:
        return GateObservation()
    conds = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    failed, complete = conds.get("Failed"), conds.get("Complete")
    if not failed and not complete:
        return GateObservation(job_exists=True)
    gate = job["metadata"]["labels"].get(names.LABEL_GATE, "unknown")
    # This Job's own pods (by uid), not those of an earlier Job that had the same name.
    pods = kube.list("Pod", namespace,
                     label_selector=f"batch.kubernetes.io/controller-uid={job['metadata'].get('uid')}")
    message = None
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if cs.get("name") == "gate" and terminated and terminated.get("message"):
                message = terminated["message"]
                break
        if message:
            break
    verdict = parse_verdict(message, gate=gate).to_dict() if message else None
    return GateObservation(job_exists=True, finished=True, succeeded=bool(complete),
                           failure_reason=(failed or {}).get("reason"), verdict=verdict)


def _deployment_view(dep: dict | None) -> tuple[int, int, int, str | None]:
    """(desired, ready, updated-and-ready, template version) of a Deployment."""
    if not dep:
        return 0, 0, 0, None
    spec, st = dep.get("spec", {}), dep.get("status") or {}
    desired = spec.get("replicas", 1)
    ready = st.get("readyReplicas", 0)
    current = st.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
    settled = current and st.get("updatedReplicas", 0) >= desired and st.get("replicas", 0) == desired
    version = spec.get("template", {}).get("metadata", {}).get("labels", {}).get(names.LABEL_VERSION)
    return desired, ready, (min(ready, desired) if settled else 0), version


def _gate_observations(kube: Kube, rm_meta: dict, rollout: dict, gates: list[dict]) -> dict[str, GateObservation]:
    """What the gate Jobs of this rollout attempt show; a Job that merely has the name is not read,
    and a gate whose passing verdict is recorded for this attempt is not read again."""
    name, namespace, version = rm_meta["name"], rm_meta["namespace"], rollout["version"]
    attempt = attempt_id(rollout)
    seen: dict[str, GateObservation] = {}
    for gate in (g for g in GATES if g not in passed_gates(gates, rollout)):
        job_name = names.gate_job_name(name, gate, version, attempt)
        job = kube.get("Job", namespace, job_name)
        if job is not None and not gate_jobs.is_gate_job_of(job, name, rm_meta.get("uid"), gate, version, attempt):
            seen[gate] = GateObservation(
                job_exists=True, finished=True, failure_reason="ForeignJob",
                detail=f"Job {job_name} is not the {gate} gate of version {version} attempt {attempt} of this "
                       f"RankingModel (its labels or owner say otherwise): its result was not read; delete "
                       f"that Job, then retry the version (annotation {RETRY_ANNOTATION})")
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
                  stable_dep: dict | None, now: dt.datetime) -> tuple[tuple[str, ...], str | None]:
    """(the pods kept un-Ready because the model fails its warm requests (rollout.warming decides),
    the stable pods the scheduler cannot place and why): the canary's pods are already listed; the
    others only while the stable has been un-Available a while (one request, not one per reconcile)."""
    pods = [pod for pod, _ in canary_pods]
    others = []
    if warming.reads_all_pods(stable_dep, now):
        others = [p for p in kube.list("Pod", namespace, labels={names.LABEL_MODEL: model})
                  if (p["metadata"].get("labels") or {}).get(names.LABEL_TRACK) != names.CANARY]
    stable = [p for p in others if (p["metadata"].get("labels") or {}).get(names.LABEL_TRACK) == names.STABLE]
    return warming.warm_failures(pods + others), unschedulable_summary(stable, "stable")


def _set_canary_traffic(kube: Kube, namespace: str, pods: list[tuple[dict, PodObservation]], version: str,
                        on: bool) -> None:
    """Put live, Ready canary pods of `version` behind the serving Service (or take them out) without
    restarting them."""
    for pod, seen in pods:
        want = "on" if on and counts_ready(seen, version) else "off"
        if pod["metadata"].get("labels", {}).get(names.LABEL_TRAFFIC) != want:
            kube.merge_patch("Pod", namespace, pod["metadata"]["name"],
                             {"metadata": {"labels": {names.LABEL_TRAFFIC: want}}})


_unchecked_secrets: list[bool] = []


def _credentials_missing(kube: Kube, rm: RankingModel) -> str | None:
    """Why the fetcher's credentials Secret cannot be used, when a version fetches with it."""
    secret, namespace = rm.spec.model_credentials_secret, rm.metadata["namespace"]
    if not secret or not any(v.model_uri.startswith(FETCHED_SCHEMES) for v in rm.spec.versions):
        return None
    try:
        if kube.exists("Secret", namespace, secret):
            return None
    except ApiError as exc:
        if exc.status != 403:
            raise
        if not _unchecked_secrets:   # said once per process: it is how the cluster admin set RBAC up
            _unchecked_secrets.append(True)
            log.info("the operator may not get Secrets (chart RBAC): not checking that "
                     "spec.modelCredentialsSecret exists")
        return None
    return (f"Secret {secret} (spec.modelCredentialsSecret) does not exist in namespace {namespace}: create it "
            f"(kubectl -n {namespace} create secret generic {secret} --from-literal=AWS_ACCESS_KEY_ID=... "
            "--from-literal=AWS_SECRET_ACCESS_KEY=...) or fix spec.modelCredentialsSecret; the serving version "
            "is left untouched")


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


# Shapes resolved (planned, for batching: auto), by the digest of the plan's inputs (render.planned),
# with the status.plan they report, or why no plan was made (the planner is deterministic: the same
# inputs fail the same way): a reconcile whose inputs did not change (most of them) does not plan
# again; after a restart, status.plan.inputsDigest says the same.
_shapes: OrderedDict[str, tuple[ResolvedShape, dict[str, Any] | None] | RenderError] = OrderedDict()
SHAPES_KEPT = 4096
_shapes_lock = threading.Lock()


def _keep(digest: str, kept: tuple[ResolvedShape, dict[str, Any] | None] | RenderError) -> None:
    with _shapes_lock:
        _shapes[digest] = kept
        while len(_shapes) > SHAPES_KEPT:
            _shapes.popitem(last=False)


def _plan(spec: Any, profile: dict[int, float] | None, digest: str) -> tuple[ResolvedShape, dict[str, Any] | None]:
    started = time.monotonic()
    try:
        resolved = resolve_shape(spec, profile)
    except RenderError as exc:
        _keep(digest, exc)
        raise
    except Exception as exc:   # a planner bug: said as PlanFailed, not retried on every reconcile
        _keep(digest, RenderError(f"the planner failed: {type(exc).__name__}: {exc}"))
        raise
    kept = (resolved, planned.with_digest(resolved.plan.to_status() if resolved.plan is not None else None, digest))
    _keep(digest, kept)
    # Said once per plan made (a reconcile that reuses one says nothing): how often and how long it plans.
    log.info(f"planned inputs {digest[:12]} in {time.monotonic() - started:.2f} s: maxBatchSize "
             f"{resolved.shape.max_batch_size}, {resolved.shape.instances_per_gpu} instance(s)/GPU, "
             f"{resolved.replicas} replica(s)")
    return kept


def _resolve(rm: RankingModel, profile: dict[int, float] | None, recorded: dict[str, Any] | None = None,
             plans: Plans | None = None, who: Any = None) -> tuple[ResolvedShape, dict[str, Any] | None]:
    """The shape to serve and the status.plan that says why; `recorded`: the status.plan now.
    With `plans`, a plan still to make is made on its thread (PlanPending), and `who` reconciled
    again once it is."""
    digest = planned.inputs_digest(rm.spec, profile)
    if digest is None:   # nothing to plan (or planning refuses: resolve_shape says why)
        resolved = resolve_shape(rm.spec, profile)
        return resolved, resolved.plan.to_status() if resolved.plan is not None else None
    with _shapes_lock:
        kept = _shapes.get(digest)
        if kept is not None:
            _shapes.move_to_end(digest)
    if isinstance(kept, RenderError):
        raise RenderError(str(kept))
    if kept is not None:
        return kept
    resolved = planned.from_status(rm.spec, recorded, digest)
    if resolved is not None:
        _keep(digest, (resolved, dict(recorded)))
        return resolved, dict(recorded)
    if plans is None:
        return _plan(rm.spec, profile, digest)
    spec = rm.spec
    plans.ask(digest, lambda: _plan(spec, profile, digest), who)
    raise PlanPending(digest)


def reconcile(kube: Kube, body: dict[str, Any], now: dt.datetime | None = None, *,
              service_monitors: bool = False, service_monitor_labels: dict[str, str] | None = None,
              policy: TenantPolicy = TenantPolicy(), pull_secrets: tuple[str, ...] = (),
              metrics_networks: tuple[str, ...] = (), plans: Plans | None = None) -> Result:
    """`service_monitors`: also apply the model's ServiceMonitor (`rankops run --service-monitors`),
    labelled with `service_monitor_labels` besides the usual ones. `policy`: the host directories
    and images the cluster admin lets a RankingModel use (`rankops run --allow-*`).
    `metrics_networks`: the pod IPs whose Triton metrics the canary analysis reads (empty: all).
    `plans`: make a plan this model lacks on the planner's thread; this reconcile then changes
    nothing, and the model is reconciled again when the plan is made (None: plan here)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    meta = body["metadata"]
    name, namespace, gen = meta["name"], meta["namespace"], meta.get("generation")
    events: list[Event] = []
    status, unknown = status_decisions.known_status(body.get("status") or {})
    if unknown:   # said once: the status written next leaves them out (the merge patch removes them)
        events.append(Event("Warning", "StatusFieldsUnknown", status_decisions.unknown_fields_message(unknown)))
        body = {**body, "status": status}

    try:
        rm = RankingModel.model_validate(_spec_document(body))
    except ValidationError as exc:
        return _degraded_only(body, "InvalidSpec", "; ".join(describe(exc)) +
                              " (fix the spec; the serving version is left untouched)", events, now)
    refused = spec_problems(rm.spec, policy)
    if refused:
        return _degraded_only(body, POLICY_REASON, "; ".join(refused) +
                              " (the serving version is left untouched)", events, now)

    engines_off, notes = image_fit.engine_mismatches(rm.spec)
    if engines_off:   # Triton would refuse the engine: say so before any pod starts
        return _degraded_only(body, "TensorRTVersionMismatch", "; ".join(engines_off) +
                              " (the serving version is left untouched)", events, now)

    missing = _credentials_missing(kube, rm)
    if missing:
        return _degraded_only(body, "CredentialsSecretNotFound", missing, events, now)

    pool_requirements, pool_note, placement = None, None, None
    if rm.spec.node_pool:
        pool = kube.get("GpuNodePool", None, rm.spec.node_pool)
        if pool is None:
            return _degraded_only(body, "NodePoolNotFound",
                                  f"GpuNodePool {rm.spec.node_pool} does not exist: create it "
                                  f"(kubectl apply -f gpunodepool.yaml) or fix spec.nodePool", events, now)
        from rankops.api.gpunodepool import GpuNodePool
        try:
            pool_requirements = GpuNodePool.model_validate(
                {"metadata": pool["metadata"], "spec": pool["spec"]}).spec.requirements
        except ValidationError:
            pool_requirements = None
        pool_status = pool.get("status") or {}
        if pool_status.get("ready", 0) == 0:
            failing = ", ".join(f"{f['check']}: {f['count']}" for f in pool_status.get("failingByCheck") or [])
            pool_note = (f"GpuNodePool {rm.spec.node_pool} has no validated ready node "
                         f"({pool_status.get('nodes', 0)} matched" + (f"; failing {failing}" if failing else "") +
                         "); pods stay Pending until a node passes validation")
        else:
            ready_nodes = kube.list("Node", labels={LABEL_POOL: label_value(rm.spec.node_pool), LABEL_READY: "true"})
            placement = image_fit.pool_driver_problem(rm.spec.triton_image, rm.spec.node_pool, ready_nodes)
        unknown = image_fit.unknown_note(rm.spec.triton_image)
        notes += [unknown] if unknown else []

    try:
        resolved, plan_status = _resolve(rm, _read_profile(kube, rm), status.get("plan"), plans,
                                         (namespace, name, meta.get("uid")))
    except PlanPending:
        return Result(status, events)   # nothing changes until the plan is made; then this model is kicked
    except RenderError as exc:
        return _degraded_only(body, "PlanFailed", str(exc), events, now)

    stable_dep = kube.get("Deployment", namespace, names.deployment_name(name, names.STABLE))
    canary_dep = kube.get("Deployment", namespace, names.deployment_name(name, names.CANARY))
    s_desired, s_ready, s_settled, s_version = _deployment_view(stable_dep)
    c_desired = _deployment_view(canary_dep)[0]

    rollout = status.get("rollout")
    gates_seen = _gate_observations(kube, meta, rollout, status.get("gates") or []) \
        if rollout and rollout.get("phase") in ACTIVE else {}
    canary_pods = _canary_pods(kube, namespace, name) if canary_dep else []
    # While the canary serves: both tracks' Triton numbers, for the canary analysis.
    track_metrics, metrics_problems = canary_metrics.read(kube, namespace, name, metrics_networks) \
        if (rollout or {}).get("phase") == CANARY and rm.spec.rollout.canary.analysis.enabled else (None, ())

    decision = step(rm.spec, status, Observed(
        now=now, canary_pods=tuple(seen for _, seen in canary_pods), canary_desired=c_desired,
        stable_updated_ready=s_settled, stable_desired=s_desired, stable_template_version=s_version,
        gates=gates_seen, annotations=meta.get("annotations") or {}, track_metrics=track_metrics,
        metrics_problems=metrics_problems, replicas=resolved.replicas,
        canary_warm_failing=warming.warm_failures(pod for pod, _ in canary_pods)))
    unapplied_events = list(events)   # the decision's own events only count once it is applied
    events += decision.events
    canary = decision.serving.canary_version
    c_ready = ready_count((seen for _, seen in canary_pods), canary) if canary else 0
    warm_failing, unschedulable = _pod_problems(kube, namespace, name, canary_pods, stable_dep, now)

    try:
        _apply_decision(kube, rm, decision, resolved, pool_requirements,
                        (service_monitor_labels or {}) if service_monitors else None, canary_pods,
                        policy=policy, pull_secrets=pull_secrets)
    except RenderError as exc:
        return _degraded_only(body, "RenderFailed", str(exc), unapplied_events, now)
    except writes.ChildRefused as exc:
        return _degraded_only(body, "ChildRefused", str(exc), unapplied_events, now)
    except InvalidName as exc:   # never expected: the API models refuse such names first
        return _degraded_only(body, "InvalidSpec", f"{exc}; the serving version is left untouched",
                              unapplied_events, now)

    return Result(_status(rm, status, decision, resolved, plan_status, stable_dep, c_ready, pool_note, gen, events,
                          now, placement, notes, warm_failing, unschedulable),
                  events, decision.outcome,
                  [g for g in decision.gates if g not in (status.get("gates") or [])])


def _apply_decision(kube: Kube, rm: RankingModel, decision: Decision, resolved: ResolvedShape,
                    pool_requirements: Any, service_monitor_labels: dict[str, str] | None = None,
                    canary_pods: list[tuple[dict, PodObservation]] = (),
                    policy: TenantPolicy = TenantPolicy(), pull_secrets: tuple[str, ...] = ()) -> None:
    """`service_monitor_labels`: None leaves ServiceMonitors alone; a dict (may be empty) applies one."""
    name, namespace = rm.metadata["name"], rm.metadata["namespace"]
    serving = decision.serving
    wanted = desired_objects(rm, serving, resolved, pool_requirements, policy)
    if decision.reference_version:
        wanted += [with_owner(o, rm) for o in track_objects(
            rm, gate_jobs.REFERENCE_TRACK, decision.reference_version, 1, False, resolved.shape, pool_requirements,
            policy=policy)]
    wanted += [with_owner(o, rm) for o in traffic_objects(rm, serving)]
    for gate in decision.gate_jobs:
        job = gate_jobs.gate_job(rm, gate, decision.rollout["version"], attempt_id(decision.rollout),
                                 decision.stable_version, reference_served=bool(decision.reference_version))
        # A Job's pod template is immutable: create it once, never re-apply it.
        if kube.get("Job", namespace, job["metadata"]["name"]) is None:
            wanted.append(with_owner(job, rm))
    foreign = pod_volume_problems(wanted, policy)   # never expected: rendering refuses them first
    if foreign:
        raise RenderError("; ".join(foreign))
    writes.apply_all(kube, rm.metadata, with_pull_secrets(wanted, pull_secrets))

    # Remove what the decision no longer wants, of what exists (read from the watch cache: no request).
    present = [(kind, child) for kind, child in status_decisions.unwanted_children(name, decision)
               if kube.get(kind, namespace, child) is not None]
    jobs = [(job["metadata"]["name"], _job_finished(job))
            for job in kube.list("Job", namespace, labels={names.LABEL_MODEL: name, "app.kubernetes.io/name": GATE_APP})]
    for kind, child in status_decisions.deletions(name, decision, present, jobs):
        kube.delete(kind, namespace, child)
    if serving.canary_version and rm.spec.rollout.canary.traffic is TrafficMode.replicas:
        _set_canary_traffic(kube, namespace, list(canary_pods), serving.canary_version, serving.canary_traffic)
    if service_monitor_labels is not None:
        _apply_monitoring(kube, rm, service_monitor_labels)


# What _apply_monitoring has logged, so a missing CRD or right is one line per process, not one
# per reconcile; a success clears it, so the same problem coming back is logged again.
_monitoring_notes: set[str] = set()
# ServiceMonitors applied, by (namespace, name): the digest of what was applied, when, and the model
# (name, uid) it is for. They are applied again when it changes, after MONITOR_REAPPLY_S, or when
# `monitors_gone` finds one deleted; not on every reconcile.
_monitors_applied: dict[tuple[str, str], tuple[str, float, str, str]] = {}
MONITOR_REAPPLY_S = 600.0


def monitors_gone(present: set[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(namespace, model, uid) of the models whose applied ServiceMonitor is no longer listed
    (`present`: the rankops ServiceMonitors the API server lists); forgotten, so their next
    reconcile applies it again. ServiceMonitors are not watched (their CRD is optional)."""
    gone = [key for key in list(_monitors_applied) if key not in present]
    return [(key[0], *_monitors_applied.pop(key)[2:]) for key in gone]


def _apply_monitoring(kube: Kube, rm: RankingModel, labels: dict[str, str]) -> None:
    """Apply the ServiceMonitor last, and never fail the reconcile for it: monitoring is optional.
    Without the Prometheus Operator's CRD it is skipped (tried again each reconcile, so installing
    the CRD later is enough)."""
    for obj in monitoring_objects(rm, labels):
        key, digest = (obj["metadata"]["namespace"], obj["metadata"]["name"]), applied_digest(obj)
        done = _monitors_applied.get(key)
        if done and done[0] == digest and time.monotonic() - done[1] < MONITOR_REAPPLY_S:
            continue   # applied as it is now, lately: not a request per reconcile (it is not watched)
        try:
            kube.apply(obj)
        except ApiMissing:
            _note("missing", logging.INFO, "ServiceMonitors are on, but this cluster does not serve "
                  "monitoring.coreos.com/v1 servicemonitors (no Prometheus Operator CRDs): not creating them")
        except ApiError as exc:
            _note(f"http-{exc.status}", logging.WARNING,
                  f"could not apply ServiceMonitor {obj['metadata']['namespace']}/{obj['metadata']['name']}: "
                  f"{exc.status} {exc.reason} (serving is unaffected; a 403 means the operator lacks "
                  "servicemonitors rights: set the chart value monitoring.tritonServiceMonitors=true)")
        else:
            _monitoring_notes.clear()
            _monitors_applied[key] = (digest, time.monotonic(), rm.metadata["name"], rm.metadata.get("uid") or "")


def _note(key: str, level: int, message: str) -> None:
    if key not in _monitoring_notes:
        _monitoring_notes.add(key)
        log.log(level, message)


def _status(rm: RankingModel, old: dict, decision: Decision, resolved: ResolvedShape,
            plan_status: dict[str, Any] | None, stable_dep: dict | None,
            canary_ready: int, pool_note: str | None, gen: int | None, events: list[Event], now: dt.datetime,
            placement: tuple[str, str] | None = None, notes: list[str] = (),
            warm_failing: tuple[str, ...] = (), unschedulable: str | None = None) -> dict[str, Any]:
    """`placement`: (reason, message) when no ready node can run the image (image_fit);
    `notes`: what rankops could not check, said in Degraded's message when nothing is wrong."""
    desired, ready, settled, version = _deployment_view(stable_dep)
    decided = status_decisions.decide(rm.spec, old, decision, status_decisions.Facts(
        now=iso(now), generation=gen,
        stable=status_decisions.StableView(stable_dep is not None, desired, ready, settled, version),
        canary_ready=canary_ready, replicas=resolved.replicas,
        plan=plan_status,
        problems=tuple(resolved.problems), unbatched=tuple(resolved.unbatched), pool_note=pool_note,
        placement=placement, notes=tuple(notes), warm_failing=warm_failing, unschedulable=unschedulable))
    events += decided.events
    return decided.status
