"""kopf handlers: thin wiring from watch events and timers to the reconcilers.

A RankingModel is reconciled from events: its own (listed at start-up, created, a new spec, an
annotation or status someone else wrote), and those of its children and of the pools and
latency-profile ConfigMaps it names, mapped to it, so drift is repaired and Ready is seen as it
happens. Reads of the model and its children come from those watches (controller/cache.py).
controller/clock.py reconciles a model `--interval` after its last reconcile while only time
moves it on (a rollout in flight, not Ready yet, a refused write to retry: gate deadlines and the
canary hold), and every model `--resync` after its last. Pools have kopf's create/update/resume
handlers (their finalizer clears the nodes' marks): a change of a node they select (labels,
verdict, GPU capacity) or of another pool reconciles them, and so does `--resync`; a settled pool
costs no request in between.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections import defaultdict

import kopf

from rankops import metrics
from rankops.api.crdgen import GROUP, VERSION
from rankops.controller import cache, models, pools, session, writes
from rankops.controller.context import OPERATOR
from rankops.controller.diffbase import DigestDiffBaseStorage, essence_digest
from rankops.controller.clock import Clock
from rankops.controller.kicks import Kicks
from rankops.controller.node_pods import NodePods
from rankops.controller.kube import ApiError, namespace_terminating
from rankops.controller.patching import merge_patch
from rankops.controller.peering import PAUSE
from rankops.controller.plans import Plans
from rankops.render import names
from rankops.rollout import status_decisions
from rankops.rollout.machine import ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION

log = logging.getLogger("rankops.handlers")
_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
_status_written: dict[str, str | None] = {}   # uid -> resourceVersion of this process's last status write
_reconciled_generation: dict[str, int | None] = {}   # uid -> the generation its last reconcile here saw


def _run(kind: str, reconcile, body, patch, logger) -> None:
    """Serialise reconciles of one object (timer and event handlers may overlap), then record."""
    meta = body["metadata"]
    uid = meta["uid"]
    started = time.monotonic()
    result_word = "error"
    with _locks[uid]:
        # The body asked with may predate the status this process wrote a moment ago: reconcile
        # the object as it is now (a model: as its watch shows it, once that has caught up with
        # this process's last status write), and write its status here, under the lock, so no
        # transition (and its Event) is computed twice or lost.
        fresh = _current(kind, meta)
        if fresh is None or fresh["metadata"]["uid"] != uid:
            return
        # A RankingModel being deleted has nothing left to reconcile: garbage collection removes
        # its children (a deleted pool still is: its marks are cleared under the same lock).
        if kind == "RankingModel" and fresh["metadata"].get("deletionTimestamp"):
            return
        body = fresh
        result, status_patch = None, None
        try:
            result = reconcile(body)
            if kind == "RankingModel":
                result = _first_status(uid, body.get("status") or {}, result)
            result_word = metrics.reconcile_result(result.status)
            status_patch = merge_patch(body.get("status") or {}, result.status)
            if status_patch:
                written = OPERATOR.kube.merge_patch(kind, meta.get("namespace"), meta["name"],
                                                    {"status": status_patch}, subresource="status")
                if written is None and kind == "RankingModel":   # 404: deleted, its DELETED event missed
                    MODELS.forget(kind, meta.get("namespace"), meta["name"])
                    forget_model(fresh["metadata"])
                    result_word = "skipped"
                    return
                _status_written[uid] = ((written or {}).get("metadata") or {}).get("resourceVersion")
                if written and kind == "RankingModel":
                    MODELS.observe(kind, written)
        except ApiError as exc:
            if namespace_terminating(exc):  # the namespace's deletion removes the object too
                result_word = "skipped"
                logger.debug(f"not reconciled: its namespace is being deleted ({exc.status} {exc.reason})")
                return
            raise kopf.TemporaryError(f"Kubernetes API said {exc.status} {exc.reason}: "
                                      f"{(exc.body or '')[:300]}", delay=10) from exc
        finally:
            metrics.observe_reconcile(kind, result_word, time.monotonic() - started)
            if kind == "RankingModel" and result_word != "skipped":
                _after_model_reconcile(body, result_word, result, status_patch)
    events = result.events
    if events and meta.get("namespace") and _namespace_going(meta["namespace"]):
        events = []   # refused while the namespace goes (kopf would retry each at ERROR); so is the object
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])
        logger.info(f"{event.reason}: {event.message}")
    if kind == "GpuNodePool":
        metrics.record_pool(body["metadata"]["name"], result.status)
    else:
        metrics.record_model(body, result.status, result.outcome, result.gate_results)


_first_status_waiting: set[str] = set()   # uids whose first status (Pending) was left to the next reconcile


def _first_status(uid: str, old: dict, result):
    """A new model's first status that would only say Pending is left to its next reconcile (one
    status write per new model, not two); that one says its first Ready, which has no flip."""
    if uid not in _reconciled_generation and status_decisions.first_status_can_wait(old, result.status):
        _first_status_waiting.add(uid)
        return models.Result(old)   # nothing written, nothing said
    if uid in _first_status_waiting:
        _first_status_waiting.discard(uid)
        ready = status_decisions.first_ready_event(old, result.status)
        if ready is not None:
            result.events.append(ready)
    return result


def _after_model_reconcile(body, result_word: str, result, status_patch) -> None:
    """Schedule the model's next reconcile by the clock, and say the reconciles that matter: the
    first in this process, one of a new generation, one that changed status."""
    meta = body["metadata"]
    uid, generation = meta["uid"], meta.get("generation")
    status = result.status if result is not None else None
    CLOCK.reconciled((meta["namespace"], meta["name"], uid),
                     status is None or status_decisions.needs_clock(status, generation))
    first, before = uid not in _reconciled_generation, _reconciled_generation.get(uid)
    _reconciled_generation[uid] = generation
    if first or before != generation or status_patch:
        why = "first here" if first else "new generation" if before != generation else "status changed"
        log.info(f"reconciled {meta['namespace']}/{meta['name']} generation {generation}: {result_word} ({why})")


# RankingModels as their watch and this process's status writes show them: a reconcile reads its
# model from here, not with a GET (at N=1000, 4.9 GETs per new model), when what is here is at
# least as new as the last status this process wrote; otherwise (not seen yet, or the watch lags
# behind that write) from the API.
MODELS = cache.Children(relist_s=OPERATOR.resync)


def _current(kind: str, meta) -> dict | None:
    if kind == "RankingModel":
        namespace = meta.get("namespace")
        MODELS.fill(OPERATOR.kube, kind, namespace)   # once, then each --resync: a DELETED a broken watch missed
        seen = MODELS.get(kind, namespace, meta["name"])
        if seen is not None and seen["metadata"].get("uid") == meta["uid"] \
                and cache.resource_version(seen) >= cache.resource_version(_status_written.get(meta["uid"])):
            return seen
    return OPERATOR.kube.get(kind, meta.get("namespace"), meta["name"])


# What _namespace_going last found, by namespace: (when, going). A namespace alive is asked again
# after NAMESPACE_ALIVE_S (at N=1000 new models it was a GET per model for its Ready Event);
# one going, after NAMESPACE_GOING_S (one of the same name may be created once it is gone). An
# Event posted into a namespace that began to go in between is refused, and kopf says so at WARNING.
_namespaces_seen: dict[str, tuple[float, bool]] = {}
NAMESPACE_ALIVE_S, NAMESPACE_GOING_S = 2.0, 30.0


def _namespace_going(name: str) -> bool:
    """The namespace is being deleted (or gone). Asked only when there are Events to post."""
    seen = _namespaces_seen.get(name)
    if seen and time.monotonic() - seen[0] < (NAMESPACE_GOING_S if seen[1] else NAMESPACE_ALIVE_S):
        return seen[1]
    try:
        found = OPERATOR.kube.get("Namespace", None, name)
    except ApiError:   # no right to read it (custom RBAC): post as before
        return False
    going = found is None or bool(found["metadata"].get("deletionTimestamp"))
    _namespaces_seen[name] = (time.monotonic(), going)
    return going


CHILDREN = cache.Children(relist_s=OPERATOR.resync)


NODE_PODS = NodePods()


def _reconcile_model(body):
    meta = body["metadata"]
    return models.reconcile(cache.CachedKube(OPERATOR.kube, CHILDREN), body,
                            leaving_nodes=NODE_PODS.leaving_nodes(meta["namespace"], meta["name"]),
                            stable_nodes=NODE_PODS.track_nodes(meta["namespace"], meta["name"], names.STABLE),
                            service_monitors=OPERATOR.service_monitors,
                            service_monitor_labels=OPERATOR.service_monitor_labels, policy=OPERATOR.tenant_policy,
                            pull_secrets=tuple(OPERATOR.image_pull_secrets),
                            metrics_networks=tuple(OPERATOR.pod_metrics_networks), plans=PLANS)


def _pool(body, patch, logger):
    _run("GpuNodePool", lambda b: pools.reconcile(OPERATOR.kube, b, OPERATOR), body, patch, logger)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    # Own prefixes for kopf's bookkeeping, set before any object is touched: changing them later
    # would make kopf think every object is new and re-run its creation handlers.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    # A digest, not a copy of the spec: a copy over 256 KiB of annotations made the object
    # undeletable (controller/diffbase.py).
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = OPERATOR.workers
    settings.watching.server_timeout = 300
    threading.Thread(target=_drift_checks, daemon=True, name="drift-checks").start()


@kopf.on.login()
async def login(**kwargs):
    # kopf's own session opens a connection per request at once, without bound (controller/session.py).
    return await session.bounded_session(OPERATOR.kopf_connections, **kwargs)


MONITOR_CHECK_S = 30.0
_kopf_context: list[contextvars.Context] = []   # a kopf handler's context, as the first one ran


def posting_context() -> contextvars.Context | None:
    """A context in which kopf.event() posts (kopf keeps its settings and Event queue in context
    variables, set for its handlers only): for reconciles a thread of rankops' own asks for."""
    return _kopf_context[0] if _kopf_context else None


def _drift_checks() -> None:
    """Children that are not watched, and whose deletion would otherwise wait for --resync: every
    MONITOR_CHECK_S a LIST finds the ones this process applied that are gone, and reconciles their
    owners. Validator DaemonSets (the chart grants them in its namespace only), and ServiceMonitors
    when they are applied (their CRD is optional)."""
    from rankops.controller.kube import ApiMissing

    while True:
        time.sleep(MONITOR_CHECK_S)
        if PAUSE.paused or OPERATOR.kube is None:   # a standby lists nothing: the replica that acts checks
            continue
        try:
            validators = OPERATOR.kube.list("DaemonSet", OPERATOR.namespace,
                                            label_selector="app.kubernetes.io/name=rankops-validator")
        except (ApiError, OSError) as exc:
            logging.getLogger(__name__).debug("validator DaemonSet drift check skipped: %s", exc)
        else:
            present = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in validators}
            for key in pools.validators_gone(present):
                POOL_KICKS.kick(key)
        if not OPERATOR.service_monitors:
            continue
        try:
            listed = OPERATOR.kube.list("ServiceMonitor", None, label_selector=names.LABEL_MODEL)
        except (ApiMissing, ApiError, OSError) as exc:
            logging.getLogger(__name__).debug("ServiceMonitor drift check skipped: %s", exc)
            continue
        present = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in listed}
        for key in models.monitors_gone(present):
            KICKS.kick(key, posting_context())   # this thread has no kopf context to post Events with


def _kicked(key) -> None:
    namespace, name, uid = key
    _run("RankingModel", _reconcile_model, {"metadata": {"namespace": namespace, "name": name, "uid": uid}}, None, log)


# A child's burst of events (its status moving pod by pod) within a quarter second is one reconcile.
# A standby replica (kopf peering, paused) kicks nothing, not even a retry timer's.
KICKS = Kicks(_kicked, workers=OPERATOR.workers, delay_s=0.25, paused=lambda: PAUSE.paused)
# Plans are made on a thread of their own; the model that asked is kicked when its plan is made.
PLANS = Plans(done=KICKS.kick)
# Reconciles no event asks for (gate deadlines, the canary hold, --resync); its thread has no
# kopf context of its own to post Events with.
CLOCK = Clock(lambda key: KICKS.kick(key, posting_context()), OPERATOR.interval, OPERATOR.resync)


def _owner_kick(obj, urgent: bool = False) -> None:
    """Reconcile the RankingModel that controls `obj` (by its ownerReference and model label)."""
    meta = obj["metadata"]
    model = (meta.get("labels") or {}).get(names.LABEL_MODEL)
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller") and o.get("kind") == "RankingModel"
                  and o.get("name") == model), None)
    if owner and meta.get("namespace"):
        KICKS.kick((meta["namespace"], owner["name"], owner["uid"]), urgent=urgent)


def _all_ready(deployment: dict) -> bool:
    """A Deployment whose pods are all Ready and up to date: what its model's Ready waits on. Its
    reconcile goes before the models still to build (it is cheap: nothing to apply), so at N=1000
    a model says Ready with its pods, not after the whole burst; the other child events wait their
    turn, where a burst of them becomes one reconcile."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    wanted = spec.get("replicas", 1)
    return status.get("observedGeneration", 0) >= (deployment["metadata"].get("generation") or 0) \
        and status.get("readyReplicas", 0) >= wanted and status.get("updatedReplicas", 0) >= wanted


# The event handlers are async: they only note what they see and queue kicks, never wait on the
# API. A sync handler runs on kopf's executor, behind the reconciles there (create handlers and
# ticks, up to seconds each): at N=1000 a Deployment that became Ready was seen minutes later.
def _child_event(kind: str):
    async def on_child(event, **_):
        obj = event["object"]
        CHILDREN.observe(kind, obj, deleted=event.get("type") == "DELETED")
        if event.get("type") is not None:   # None: kopf's initial listing; the resume handlers cover it
            _owner_kick(obj, urgent=kind == "Deployment" and event.get("type") != "DELETED" and _all_ready(obj))
    on_child.__name__ = on_child.__qualname__ = f"{kind.lower()}_event"   # kopf's handler id, in its log
    return on_child


_MODEL_LABEL = {names.LABEL_MODEL: kopf.PRESENT}
kopf.on.event("apps", "v1", "deployments", labels=_MODEL_LABEL)(_child_event("Deployment"))
kopf.on.event("", "v1", "services", labels=_MODEL_LABEL)(_child_event("Service"))
kopf.on.event("batch", "v1", "jobs", labels=_MODEL_LABEL)(_child_event("Job"))
kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=_MODEL_LABEL)(_child_event("PodDisruptionBudget"))
_configmap_child = _child_event("ConfigMap")


@kopf.on.event("", "v1", "pods", labels=_MODEL_LABEL)
async def model_pod_event(event, **_):
    """Where each model's pods run, so a node that starts leaving wakes the models on it."""
    NODE_PODS.pod_event(event["object"], deleted=event.get("type") == "DELETED")


# The models that name an input (a pool, a latency-profile ConfigMap), so its change reconciles them.
@kopf.index(GROUP, VERSION, "rankingmodels")
def models_by_input(namespace, name, uid, spec, **_):
    keys = {}
    if spec.get("nodePool"):
        keys[("GpuNodePool", spec["nodePool"])] = (namespace, name, uid)
    profile = (spec.get("planning") or {}).get("latencyProfileConfigMap") or {}
    if profile.get("name"):
        keys[("ConfigMap", namespace, profile["name"])] = (namespace, name, uid)
    return keys


@kopf.on.event("", "v1", "configmaps")
async def configmap_event(event, models_by_input: kopf.Index, **_):
    obj = event["object"]
    meta = obj["metadata"]
    if names.LABEL_MODEL in (meta.get("labels") or {}):
        await _configmap_child(event)
    if event.get("type") is not None:
        for key in models_by_input.get(("ConfigMap", meta.get("namespace"), meta["name"]), ()):
            KICKS.kick(key)


MANUAL_ANNOTATIONS = (PROMOTE_ANNOTATION, ABORT_ANNOTATION, RETRY_ANNOTATION)
_inputs_seen: dict[str, str] = {}   # uid -> digest of what a model's reconcile reads of it, at its last event


_manual_seen: dict[str, tuple] = {}  # uid -> the promote/abort values last checked


def meaningless_manual_values(annotations: dict[str, str], versions: list[str]) -> list[str]:
    """A Warning's text for each promote/abort annotation whose value names no version: `yes`,
    `true`, `now` or `all` would otherwise do nothing, silently (the machine acts on VERSION or
    VERSION/ANYTHING, the second to ask again)."""
    problems = []
    for annotation in (PROMOTE_ANNOTATION, ABORT_ANNOTATION):
        value = annotations.get(annotation)
        if value is not None and value.split("/", 1)[0] not in versions:
            problems.append(f"{annotation}={value!r} names no version of spec.versions, so it does nothing: set it "
                            f"to the version being rolled out (one of {', '.join(versions) or 'none'}), or "
                            "VERSION/ANY-WORD to ask again")
    return problems


def _warn_meaningless_manual(obj) -> None:
    """Posted once per new value, not on every event."""
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    values = tuple(annotations.get(k) for k in (PROMOTE_ANNOTATION, ABORT_ANNOTATION))
    if _manual_seen.get(meta["uid"]) == values:
        return
    _manual_seen[meta["uid"]] = values
    versions = [v.get("name", "") for v in (obj.get("spec") or {}).get("versions") or [] if isinstance(v, dict)]
    for message in meaningless_manual_values(annotations, versions):
        kopf.event(obj, type="Warning", reason="AnnotationIgnored", message=message[:1000])


def _model_inputs(obj) -> str:
    annotations = obj["metadata"].get("annotations") or {}
    return essence_digest([obj["metadata"].get("generation"), obj.get("status"),
                           {k: annotations.get(k) for k in MANUAL_ANNOTATIONS}])


# A model is reconciled from its own events, as its children are: when kopf lists it (at start-up:
# every model, as kopf's resume did), when it is created, and when what a reconcile reads of it
# changes: its spec (a new generation), a promote/abort/retry annotation, a status someone else
# wrote. The operator's own status writes and metadata edits wake nothing. No kopf change handler:
# those wrote two annotations and a finalizer into every new model (and, under load, ran the
# creation handler again on an older body, after their consistency wait); events come in order.
@kopf.on.event(GROUP, VERSION, "rankingmodels")
async def rankingmodel_event(event, **_):
    if not _kopf_context:
        _kopf_context.append(contextvars.copy_context())
    obj = event["object"]
    meta = obj["metadata"]
    MODELS.observe("RankingModel", obj, deleted=event.get("type") == "DELETED")
    if event.get("type") == "DELETED":
        forget_model(meta)
        _manual_seen.pop(meta["uid"], None)
        return
    if meta["uid"] not in _inputs_seen:   # a namespace of this name may have been deleted and made again
        _namespaces_seen.pop(meta["namespace"], None)
    _warn_meaningless_manual(obj)
    seen, before = _model_inputs(obj), _inputs_seen.get(meta["uid"])
    _inputs_seen[meta["uid"]] = seen
    if before != seen and meta.get("resourceVersion") != _status_written.get(meta["uid"]):
        KICKS.kick((meta["namespace"], meta["name"], meta["uid"]))


def _forget_the_cluster() -> None:
    """This replica is paused (kopf peering): its watches stop while a peer acts, so what it holds
    goes stale. When it resumes, kopf lists every model again and each is reconciled as at
    start-up (nothing is remembered as seen), from the API and fresh listings."""
    _inputs_seen.clear()
    MODELS.clear()
    CHILDREN.forget_listings()
    NODE_PODS.clear()
    _namespaces_seen.clear()


PAUSE.on_pause.append(_forget_the_cluster)


def forget_model(meta) -> None:
    """A deleted model: drop its series (they would feed alerts until a restart) and what this
    process remembers of it."""
    uid = meta["uid"]
    metrics.forget_model(meta["namespace"], meta["name"])
    writes.forget(uid)
    CLOCK.forget((meta["namespace"], meta["name"], uid))
    for memory in (_inputs_seen, _status_written, _reconciled_generation):
        memory.pop(uid, None)
    _first_status_waiting.discard(uid)


_pool_generations: dict[str, int | None] = {}   # pool name -> the generation its last event had


@kopf.on.event(GROUP, VERSION, "gpunodepools")
async def gpunodepool_event(event, models_by_input: kopf.Index, pool_selectors: kopf.Index, **_):
    meta = event["object"]["metadata"]
    name, deleted = meta["name"], event.get("type") == "DELETED"
    before = _pool_generations.pop(name, None) if deleted else _pool_generations.get(name, -1)
    if not deleted:
        _pool_generations[name] = meta.get("generation")
    if event.get("type") is None:
        return
    for key in models_by_input.get(("GpuNodePool", name), ()):   # its ready nodes decide where their pods go
        KICKS.kick(key)
    if deleted or before != meta.get("generation"):   # added, gone or a new selector: the others' overlaps
        for other, entries in pool_selectors.items():
            for uid, _selector in entries:
                if other != name:
                    POOL_KICKS.kick((other, uid))


@kopf.on.resume(GROUP, VERSION, "gpunodepools")
@kopf.on.create(GROUP, VERSION, "gpunodepools")
@kopf.on.update(GROUP, VERSION, "gpunodepools", field="spec")
def gpunodepool_changed(body, patch, logger, **_):
    _pool(body, patch, logger)


@kopf.timer(GROUP, VERSION, "gpunodepools", interval=OPERATOR.resync, initial_delay=OPERATOR.resync, sharp=False)
def gpunodepool_resync(body, patch, logger, **_):
    _pool(body, patch, logger)


def _pool_kicked(key) -> None:
    name, uid = key
    _run("GpuNodePool", lambda b: pools.reconcile(OPERATOR.kube, b, OPERATOR), {"metadata": {"name": name, "uid": uid}},
         None, log)


# Validators report node by node: a pool's burst of node events within a second is one reconcile.
POOL_KICKS = Kicks(_pool_kicked, workers=2, delay_s=1.0, paused=lambda: PAUSE.paused)


@kopf.index(GROUP, VERSION, "gpunodepools")
def pool_selectors(name, uid, spec, **_):
    return {name: (uid, dict(spec.get("nodeSelector") or {}))}


_nodes_seen: dict[str, str] = {}   # node name -> what the pools read of it (pools.node_inputs)


@kopf.on.event("", "v1", "nodes")
async def node_event(event, pool_selectors: kopf.Index, **_):
    """A node's labels, verdict or GPU capacity changed (or it came or went): reconcile the pools
    it is in. A heartbeat, or a re-validation with the same verdict, wakes none."""
    node = event["object"]
    name, deleted = node["metadata"]["name"], event.get("type") == "DELETED"
    # Cordoned, failing validation or in a driver upgrade, or no longer: its models move their replicas.
    for namespace, model in NODE_PODS.node_event(node, deleted) or ():
        found = MODELS.get("RankingModel", namespace, model)
        if found:
            KICKS.kick((namespace, model, found["metadata"]["uid"]), posting_context(), urgent=True)
    seen = pools.node_inputs(node)
    before = _nodes_seen.pop(name, None) if deleted else _nodes_seen.get(name)
    if not deleted:
        _nodes_seen[name] = seen
    if event.get("type") is None or (not deleted and before == seen):   # None: kopf's listing
        return
    selectors = {pool: selector for pool, entries in pool_selectors.items() for _uid, selector in entries}
    uids = {pool: uid for pool, entries in pool_selectors.items() for uid, _selector in entries}
    for pool in pools.pools_of_node(node, selectors):
        POOL_KICKS.kick((pool, uids[pool]))


def _release_pool(body) -> pools.Release:
    # Under the pool's lock: a reconcile in flight ends first, and later ones see the
    # deletionTimestamp and re-create no validator.
    with _locks[body["metadata"]["uid"]]:
        return pools.release(OPERATOR.kube, body["metadata"]["name"], OPERATOR.namespace)


# Not optional: the validators' labels, annotation and taint on the pool's nodes must be cleared
# before the pool goes (kopf's finalizer holds it; its timer alone would release it as soon as the
# timer stops, before a retry). The timeout bounds how long a failing API can hold the deletion.
# async: waiting for the validator pods to stop runs in a thread of its own, not kopf's workers.
@kopf.on.delete(GROUP, VERSION, "gpunodepools", timeout=600)
async def gpunodepool_deleted(body, logger, **_):
    name = body["metadata"]["name"]
    metrics.forget_pool(name)
    try:
        released = await asyncio.to_thread(_release_pool, body)
    except ApiError as exc:
        message = f"Kubernetes API said {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
        if exc.status == 403:  # retrying will not grant it: let the pool go, say what is left behind
            raise kopf.PermanentError(f"nodes keep the pool's rankops.io labels and taint: {message}") from exc
        raise kopf.TemporaryError(message, delay=10) from exc
    if not released.validators_stopped:
        logger.warning(f"validator pods of {name} still there after {pools.VALIDATOR_STOP_WAIT_S:.0f} s; "
                       f"cleared the nodes' marks anyway")
    if released.shared_with:
        logger.warning(f"pool {released.shared_with} has the same rankops.io/pool label value: "
                       f"its nodes keep their marks")
    if released.cleared:
        logger.info(f"cleared validation marks from {', '.join(sorted(released.cleared))}")
