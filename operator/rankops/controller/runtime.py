"""The operator's runtime, as two objects: a ModelController and a PoolController, built once by
`rankops run` (`build`) and handed to kopf's handlers in kopf's memo (controller/handlers.py
holds only the decorators, each delegating to one method here). Each owns what it remembers per
object; the ModelController also owns the watch caches, the work queue (controller/workqueue.py),
the requeue clock (controller/clock.py) and the plan pool (controller/plans.py). Nothing here
starts a thread or reads a setting until it is built and started (`start`), so importing it,
or building one in a test against a fake API, costs nothing.

A RankingModel is reconciled from events: its own (listed at start-up, created, a new spec, an
annotation or status someone else wrote), and those of its children and of the pools and
latency-profile ConfigMaps it names, mapped to it, so drift is repaired and Ready is seen as it
happens. Reads of the model and its children come from those watches (controller/cache.py).
The clock reconciles a model when its plan's next deadline is due (ModelPlan.requeue_after: the
rollout's phase timeouts, the canary hold's end), `--interval` after its last reconcile while it
polls what only its pods show (not Ready yet, a refused write to retry, Triton counters), and
every model `--resync` after its last; a failing reconcile backs off per object (the queue).
Pools run the same way on the PoolController: their own events, and those of the nodes they
select and of the other pools, on its own queue and clock, with reads from its own watch cache;
its finalizer (pools.POOL_FINALIZER) holds a deleted pool until its validators are stopped and
its nodes' marks cleared. A settled object costs no request in between.
"""
from __future__ import annotations

import contextvars
import functools
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable

import kopf

from rankops import metrics
from rankops.api.crdgen import GROUP
from rankops.controller import cache, fastjson, inplace_shell, models, pools, servers, watches
from rankops.controller.clock import Clock
from rankops.controller.context import OperatorContext
from rankops.controller.diffbase import NoDiffBaseStorage, essence_digest
from rankops.controller.workqueue import RETRY_CAP_S, WorkQueue
from rankops.controller.kube import ApiError, namespace_terminating
from rankops.controller.node_pods import NodePods
from rankops.controller.patching import merge_patch
from rankops.controller.peering import PauseState
from rankops.controller.plans import Plans
from rankops.controller.pod_metrics import PodMetrics
from rankops.nodelabels import VALIDATOR_APP
from rankops.render import names
from rankops import model_status, modelplan, server_switch
from rankops.rollout.machine import ABORT_ANNOTATION, PROMOTE_ANNOTATION

log = logging.getLogger("rankops.handlers")

# What _namespace_going last found is kept, by namespace: (when, going). A namespace alive is asked
# again after NAMESPACE_ALIVE_S (at N=1000 new models it was a GET per model for its Ready Event);
# one going, after NAMESPACE_GOING_S (one of the same name may be created once it is gone). An
# Event posted into a namespace that began to go in between is refused, and kopf says so at WARNING.
NAMESPACE_ALIVE_S, NAMESPACE_GOING_S = 2.0, 30.0
MONITOR_CHECK_S = 30.0


def configure_kopf(settings: kopf.OperatorSettings, workers: int) -> None:
    """kopf's settings, at its start-up. Own prefixes for kopf's bookkeeping, set before any
    object is touched: changing them later would make kopf think every object is new and re-run
    its creation handlers."""
    fastjson.speed_up_kopf_watches()
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    # No change handlers, so no diff base: kopf would deep-copy every watched body per event (controller/diffbase.py).
    settings.persistence.diffbase_storage = NoDiffBaseStorage()
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = workers
    settings.watching.server_timeout = 300


class _Reconciles:
    """What both controllers do around a reconcile: one at a time per object (queue and kopf
    handlers may overlap), the status written once under that lock, the Events posted after."""

    kind = ""

    def __init__(self, settings: OperatorContext, pause: PauseState):
        self.settings, self.pause = settings, pause
        self.locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self.status_written: dict[str, str | None] = {}   # uid -> resourceVersion of this process's last status write
        # Objects of its kind (a pool controller: and Nodes) as their watch and this process's writes show them.
        self.watched = cache.WatchCache(relist_s=settings.resync)
        self.kopf_context: contextvars.Context | None = None   # a kopf handler's context, as the first one ran

    def run(self, reconcile: Callable[[dict], Any], body: dict, logger: logging.Logger | logging.LoggerAdapter) -> None:
        """Serialise reconciles of one object (timer and event handlers may overlap), then record."""
        meta = body["metadata"]
        uid = meta["uid"]
        started = time.monotonic()
        result_word = "error"
        with self.locks[uid]:
            # The body asked with may predate the status this process wrote a moment ago: reconcile
            # the object as it is now (a model: as its watch shows it, once that has caught up with
            # this process's last status write), and write its status here, under the lock, so no
            # transition (and its Event) is computed twice or lost.
            fresh = self.current(meta)
            if fresh is None or fresh["metadata"]["uid"] != uid:
                return
            if self._nothing_to_do(fresh):
                return
            body = fresh
            result, status_patch = None, None
            try:
                result = self._before_status(uid, body, reconcile(body))
                wire = result.status.to_wire()   # the typed status, as the API server stores it
                result_word = metrics.reconcile_result(wire)
                status_patch = merge_patch(body.get("status") or {}, wire) if result.write else None
                if status_patch:
                    written = self.settings.kube.merge_patch(self.kind, meta.get("namespace"), meta["name"],
                                                             {"status": status_patch}, subresource="status")
                    if written is None and self._gone(fresh["metadata"]):
                        result_word = "skipped"
                        return
                    self.status_written[uid] = ((written or {}).get("metadata") or {}).get("resourceVersion")
                    if written:
                        self._written(written)
            except ApiError as exc:
                if namespace_terminating(exc):  # the namespace's deletion removes the object too
                    result_word = "skipped"
                    logger.debug(f"not reconciled: its namespace is being deleted ({exc.status} {exc.reason})")
                    return
                # The queue tries again after its backoff, and says so (failed); the delay is its.
                raise kopf.TemporaryError(f"Kubernetes API said {exc.status} {exc.reason}: "
                                          f"{(exc.body or '')[:300]}") from exc
            finally:
                metrics.observe_reconcile(self.kind, result_word, time.monotonic() - started)
                if result_word != "skipped":
                    self._after(body, result_word, result, status_patch)
        events = result.events
        if events and meta.get("namespace") and self.namespace_going(meta["namespace"]):
            events = []   # refused while the namespace goes (kopf would retry each at ERROR); so is the object
        for event in events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])
            logger.info(f"{event.reason}: {event.message}")
        self._record(body, result, wire)

    def queue_and_clock(self, workers: int, delay_s: float) -> None:
        """Its work queue (a kick waits `delay_s` for more of the same burst; a standby replica,
        kopf peering paused, kicks nothing, not even a retry timer's) and its clock (--interval,
        --resync, a plan's deadline); both start with start()."""
        self.queue = WorkQueue(self.kicked, workers=workers, delay_s=delay_s, paused=lambda: self.pause.paused,
                               start=False, context=self.posting_context, failed=self.failed)
        self.clock = Clock(self.queue.kick, self.settings.interval, self.settings.resync, start=False)
        self.pause.on_pause.append(self.forget_the_cluster)

    def start(self) -> None:
        self.queue.start()
        self.clock.start()

    def kicked(self, key) -> None:
        raise NotImplementedError

    def forget_the_cluster(self) -> None:
        pass

    def failed(self, key, exc: Exception, retry_in: float) -> None:
        """The queue's reconcile of `key` failed: a Warning Event on the object says the error and
        when it is tried again (the queue backs off per object: controller/workqueue.py)."""
        body = self.watched_body(key)
        if body is None:
            return
        meta = body["metadata"]
        if meta.get("namespace") and self.namespace_going(meta["namespace"]):
            return
        kopf.event(body, type="Warning", reason="ReconcileFailed",
                   message=failure_message(exc, retry_in)[:1000])

    def watched_body(self, key) -> dict | None:
        """The object of a queue key, as its watch shows it (None: not seen)."""
        return None

    def keep_kopf_context(self) -> None:
        """In each of kopf's handlers: the first one's context is kept, for the reconciles and
        Events of the queue's and the clock's threads (kopf keeps its settings and Event queue in
        context variables, set for its handlers only; kopf.event() raises LookupError elsewhere)."""
        if self.kopf_context is None:
            self.kopf_context = contextvars.copy_context()

    def posting_context(self) -> contextvars.Context | None:
        """The kept kopf context (None until a handler ran): the queue runs each reconcile in a copy."""
        return self.kopf_context

    def own_event(self, event: dict) -> dict | None:
        """What both controllers do first with an event of their own kind: nothing while paused (its
        kick would be dropped; kopf lists every object again on resuming), else keep kopf's context
        (the clock's and the queue's threads post Events in it) and note the object in `watched`.
        Returns the object, or None when paused."""
        if self.pause.paused:
            return None
        self.keep_kopf_context()
        obj = event["object"]
        self.watched.observe(self.kind, obj, deleted=event.get("type") == "DELETED")
        return obj

    def current(self, meta: dict) -> dict | None:
        """The object as its watch shows it (`self.watched`), when that is at least as new as the
        status this process last wrote; otherwise (not seen yet, or the watch lags behind that
        write) from the API. At N=1000 new models a GET per reconcile was 4.9 GETs per model."""
        namespace = meta.get("namespace")
        self.watched.fill(self.settings.kube, self.kind, namespace)   # once, then each --resync: a DELETED a broken watch missed
        seen = self.watched.get(self.kind, namespace, meta["name"])
        if seen is not None and seen["metadata"].get("uid") == meta["uid"] \
                and cache.resource_version(seen) >= cache.resource_version(self.status_written.get(meta["uid"])):
            return seen
        return self.settings.kube.get(self.kind, namespace, meta["name"])

    def namespace_going(self, name: str) -> bool:
        return False

    def _nothing_to_do(self, body: dict) -> bool:
        return False

    def _before_status(self, uid: str, body: dict, result):
        return result

    def _gone(self, meta: dict) -> bool:
        """The status write found no object (404): True when that ends the reconcile."""
        return False

    def _written(self, written: dict) -> None:
        pass

    def _after(self, body: dict, result_word: str, result, status_patch) -> None:
        pass

    def _record(self, body: dict, result, wire: dict) -> None:
        pass


def failure_message(exc: Exception, retry_in: float) -> str:
    """A ReconcileFailed Event's text: the error, and when the next try is."""
    return f"reconcile failed: {exc}; tried again in {retry_in:.0f} s (backing off per object, up to " \
           f"{RETRY_CAP_S:.0f} s between tries while it fails)"


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


def model_inputs(obj: dict) -> str:
    """Digest of what a model's reconcile reads of the model itself, bar its spec's content: its
    generation, its status, and the annotations modelplan declares it reads (the same list plan()
    is given, so a new one cannot miss its wake-ups)."""
    annotations = obj["metadata"].get("annotations") or {}
    return essence_digest([obj["metadata"].get("generation"), obj.get("status"),
                           {k: annotations.get(k) for k in modelplan.MODEL_ANNOTATIONS_READ}])


def all_ready(deployment: dict) -> bool:
    """A Deployment whose pods are all Ready and up to date (modelplan.deployment_view, the one
    definition): what its model's Ready waits on. Its reconcile goes before the models still to
    build (it is cheap: nothing to apply), so at N=1000 a model says Ready with its pods, not after
    the whole burst; the other child events wait their turn, where a burst of them becomes one
    reconcile."""
    desired, _, settled_ready, _ = modelplan.deployment_view(deployment)
    return settled_ready >= desired


class ModelController(_Reconciles):
    """RankingModels, reconciled on the operator's own watch caches and work queue."""

    kind = "RankingModel"

    def __init__(self, settings: OperatorContext, pause: PauseState | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        super().__init__(settings, pause if pause is not None else PauseState())
        self.monotonic = monotonic
        self.children = cache.WatchCache(relist_s=settings.resync)
        self.node_pods = NodePods()
        # Children applied and refused, shapes planned, monitors; the serving pods' metrics, read
        # on threads of their own (the model is kicked when they are in).
        # Plans are made on a thread of their own; the model that asked is kicked when its plan is made.
        self.memory = models.ModelMemory(metrics=PodMetrics(kick=self._metrics_in,
                                                            max_age_s=max(60.0, 2 * settings.interval)),
                                         plans=Plans(done=self._plan_made))
        self.reconciled_generation: dict[str, int | None] = {}   # uid -> the generation its last reconcile here saw
        self.first_status_waiting: set[str] = set()   # uids whose first status (Pending) was left to the next reconcile
        self.namespaces_seen: dict[str, tuple[float, bool]] = {}   # namespace -> (when, going)
        self.inputs_seen: dict[str, str] = {}   # uid -> digest of what a model's reconcile reads of it, at its last event
        self.manual_seen: dict[str, tuple] = {}   # uid -> the promote/abort values last checked
        # A child's burst of events (its status moving pod by pod) within a quarter second is one
        # reconcile. The clock: reconciles no event asks for (gate deadlines, the canary hold, --resync).
        self.queue_and_clock(settings.workers, delay_s=0.25)
        self.plans = self.memory.plans
        self.servers: ServerController | None = None     # build() sets it: members wake their server

    # --- one reconcile

    def _nothing_to_do(self, body: dict) -> bool:
        # A RankingModel being deleted has nothing left to reconcile: garbage collection removes
        # its children (a deleted pool is released instead: PoolController.release).
        return bool(body["metadata"].get("deletionTimestamp"))

    def _before_status(self, uid: str, body: dict, result):
        return self.first_status(uid, body.get("status") or {}, result)

    def _gone(self, meta: dict) -> bool:   # 404: deleted, its DELETED event missed
        self.watched.forget(self.kind, meta.get("namespace"), meta["name"])
        self.forget_model(meta)
        return True

    def _written(self, written: dict) -> None:
        self.watched.observe(self.kind, written)

    def _record(self, body: dict, result, wire: dict) -> None:
        metrics.record_model(body, wire, result.outcome, [gate.to_wire() for gate in result.gate_results])

    def first_status(self, uid: str, stored: dict, result):
        """A new model's first status that would only say Pending is left to its next reconcile (one
        status write per new model, not two); that one says its first Ready, which has no flip.
        `stored`: the status as the API server has it (read here only on those two reconciles)."""
        waiting = uid in self.first_status_waiting
        if uid in self.reconciled_generation and not waiting:
            return result
        old = model_status.known_status(stored)[0]
        if not waiting and model_status.first_status_can_wait(old, result.status):
            self.first_status_waiting.add(uid)
            return models.Result(old, write=False, requeue_after=result.requeue_after,
                                 polls=result.polls)   # nothing written, nothing said
        if waiting:
            self.first_status_waiting.discard(uid)
            ready = model_status.first_ready_event(old, result.status)
            if ready is not None:
                result.events.append(ready)
        return result

    def _after(self, body: dict, result_word: str, result, status_patch) -> None:
        """Schedule the model's next reconcile by the clock, and say the reconciles that matter: the
        first in this process, one of a new generation, one that changed status."""
        meta = body["metadata"]
        uid, generation = meta["uid"], meta.get("generation")
        # When the plan says (its deadlines), at --interval while it polls pods, else at --resync.
        self.clock.reconciled((meta["namespace"], meta["name"], uid), result is None or result.polls,
                              result.requeue_after if result is not None else None)
        first, before = uid not in self.reconciled_generation, self.reconciled_generation.get(uid)
        self.reconciled_generation[uid] = generation
        if first or before != generation or status_patch:
            why = "first here" if first else "new generation" if before != generation else "status changed"
            log.info(f"reconciled {meta['namespace']}/{meta['name']} generation {generation}: {result_word} ({why})")

    def namespace_going(self, name: str) -> bool:
        """The namespace is being deleted (or gone). Asked only when there are Events to post."""
        seen = self.namespaces_seen.get(name)
        if seen and self.monotonic() - seen[0] < (NAMESPACE_GOING_S if seen[1] else NAMESPACE_ALIVE_S):
            return seen[1]
        try:
            found = self.settings.kube.get("Namespace", None, name)
        except ApiError:   # no right to read it (custom RBAC): post as before
            return False
        going = found is None or bool(found["metadata"].get("deletionTimestamp"))
        self.namespaces_seen[name] = (self.monotonic(), going)
        return going

    def reconcile_model(self, body: dict):
        meta = body["metadata"]
        settings = self.settings
        return models.reconcile(cache.CachedKube(settings.kube, self.children), body,
                                leaving_nodes=self.node_pods.leaving_nodes(meta["namespace"], meta["name"]),
                                stable_nodes=self.node_pods.track_nodes(meta["namespace"], meta["name"], names.STABLE),
                                service_monitors=settings.service_monitors,
                                service_monitor_labels=settings.service_monitor_labels,
                                policy=settings.tenant_policy, pull_secrets=tuple(settings.image_pull_secrets),
                                metrics_networks=tuple(settings.pod_metrics_networks), plans=self.plans,
                                memory=self.memory,
                                server_of=self.servers.server_body if self.servers is not None else None)

    def watched_body(self, key) -> dict | None:
        namespace, name, uid = key
        found = self.watched.get(self.kind, namespace, name)
        return found if found is not None and found["metadata"].get("uid") == uid else None

    def _metrics_in(self, key) -> None:
        self.queue.kick(key)

    def _plan_made(self, key) -> None:
        self.queue.kick(key)

    def kicked(self, key) -> None:
        """The queue's work: reconcile the model (namespace, name, uid)."""
        namespace, name, uid = key
        self.run(self.reconcile_model, {"metadata": {"namespace": namespace, "name": name, "uid": uid}}, log)

    # --- events, as kopf's handlers pass them on

    def owner_kick(self, obj: dict, urgent: bool = False) -> None:
        """Reconcile the RankingModel that controls `obj` (by its ownerReference and model label)."""
        meta = obj["metadata"]
        model = (meta.get("labels") or {}).get(names.LABEL_MODEL)
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")
                      and o.get("kind") == "RankingModel" and o.get("name") == model), None)
        if owner and meta.get("namespace"):
            self.queue.kick((meta["namespace"], owner["name"], owner["uid"]), urgent=urgent)
        elif self.servers is not None:     # a SharedServer's member Service
            self.servers.owned_event(obj)

    def child_event(self, kind: str, event: dict) -> None:
        """A child's event, from its watch stream (controller/watches.py; a ConfigMap's: from kopf)."""
        obj = event["object"]
        changed = self.children.observe(kind, obj, deleted=event.get("type") == "DELETED")
        # None: a listing (the resume handlers cover it); unchanged: a status no
        # reconcile reads, or the echo of this process's own write once its answer was recorded. An
        # echo that comes first (the stream is faster than the reconcile that wrote) wakes no one
        # either: that reconcile records the same object.
        if event.get("type") is not None and changed and (event["type"] == "DELETED" or not cache.own_echo(obj)):
            self.owner_kick(obj, urgent=kind == "Deployment" and event.get("type") != "DELETED" and all_ready(obj))

    def pod_event(self, event: dict) -> None:
        """Where each model's pods run, so a node that starts leaving wakes the models on it."""
        self.node_pods.pod_event(event["object"], deleted=event.get("type") == "DELETED")

    def configmap_event(self, event: dict, models_by_input) -> None:
        self.keep_kopf_context()
        obj = event["object"]
        meta = obj["metadata"]
        if names.LABEL_MODEL in (meta.get("labels") or {}):
            self.child_event("ConfigMap", event)
        elif names.LABEL_SERVER in (meta.get("labels") or {}) and event.get("type") is not None \
                and self.servers is not None:
            self.servers.owned_event(obj)
        if event.get("type") is not None:
            for key in models_by_input.get(("ConfigMap", meta.get("namespace"), meta["name"]), ()):
                self.queue.kick(key)

    def input_event(self, kind: str, name: str, models_by_input) -> None:
        """An input the models name changed (a pool: its ready nodes decide where their pods go)."""
        for key in models_by_input.get((kind, name), ()):
            self.queue.kick(key)

    def node_event(self, node: dict, deleted: bool) -> None:
        """Cordoned, failing validation or in a driver upgrade, or no longer: its models move their replicas."""
        self.keep_kopf_context()
        for namespace, model in self.node_pods.node_event(node, deleted) or ():
            found = self.watched.get(self.kind, namespace, model)
            if found:
                self.queue.kick((namespace, model, found["metadata"]["uid"]), urgent=True)

    def model_event(self, event: dict) -> None:
        """A model is reconciled from its own events, as its children are: when kopf lists it (at
        start-up: every model, as kopf's resume did), when it is created, and when what a reconcile
        reads of it changes: its spec (a new generation), a promote/abort/retry annotation, a status
        someone else wrote. The operator's own status writes and metadata edits wake nothing."""
        obj = self.own_event(event)
        if obj is None:
            return
        meta = obj["metadata"]
        if self.servers is not None and ((obj.get("spec") or {}).get("server") or self.servers.was_member(meta["uid"])):
            self.servers.member_event(obj, event.get("type"))
        if event.get("type") == "DELETED":
            self.forget_model(meta)
            self.manual_seen.pop(meta["uid"], None)
            return
        if meta["uid"] not in self.inputs_seen:   # a namespace of this name may have been deleted and made again
            self.namespaces_seen.pop(meta["namespace"], None)
        self.warn_meaningless_manual(obj)
        seen, before = model_inputs(obj), self.inputs_seen.get(meta["uid"])
        self.inputs_seen[meta["uid"]] = seen
        if before != seen and meta.get("resourceVersion") != self.status_written.get(meta["uid"]):
            self.queue.kick((meta["namespace"], meta["name"], meta["uid"]))

    def warn_meaningless_manual(self, obj: dict) -> None:
        """Posted once per new value, not on every event."""
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        values = tuple(annotations.get(k) for k in (PROMOTE_ANNOTATION, ABORT_ANNOTATION))
        if self.manual_seen.get(meta["uid"]) == values:
            return
        self.manual_seen[meta["uid"]] = values
        versions = [v.get("name", "") for v in (obj.get("spec") or {}).get("versions") or [] if isinstance(v, dict)]
        for message in meaningless_manual_values(annotations, versions):
            kopf.event(obj, type="Warning", reason="AnnotationIgnored", message=message[:1000])

    # --- forgetting

    def forget_the_cluster(self) -> None:
        """This replica is paused (kopf peering): its watches stop while a peer acts, so what it holds
        goes stale. When it resumes, kopf lists every model again and each is reconciled as at
        start-up (nothing is remembered as seen), from the API and fresh listings."""
        self.inputs_seen.clear()
        self.watched.clear()
        self.children.forget_listings()
        self.node_pods.clear()
        self.namespaces_seen.clear()

    def forget_model(self, meta: dict) -> None:
        """A deleted model: drop its series (they would feed alerts until a restart) and what this
        process remembers of it."""
        uid = meta["uid"]
        metrics.forget_model(meta["namespace"], meta["name"])
        self.memory.writes.forget(uid)
        self.clock.forget((meta["namespace"], meta["name"], uid))
        self.memory.metrics.forget((meta["namespace"], meta["name"], uid))
        inplace_shell.forget(self.memory, uid)
        self.memory.in_place_keys.pop(uid, None)
        for memory in (self.inputs_seen, self.status_written, self.reconciled_generation):
            memory.pop(uid, None)
        self.first_status_waiting.discard(uid)

    def check_monitors(self) -> None:
        """ServiceMonitors are not watched (their CRD is optional): those this process applied that a
        LIST no longer finds have their models reconciled."""
        from rankops.controller.kube import ApiMissing

        if not self.settings.service_monitors:
            return
        try:
            listed = self.settings.kube.list("ServiceMonitor", None, label_selector=names.LABEL_MODEL)
        except (ApiMissing, ApiError, OSError) as exc:
            log.debug("ServiceMonitor drift check skipped: %s", exc)
            return
        present = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in listed}
        for key in self.memory.monitors_gone(present):
            self.queue.kick(key)


class PoolController(_Reconciles):
    """GpuNodePools, on the same reconcile model as RankingModels: their own watch events (listed at
    start-up, created, a new spec, deletion asked, a status someone else wrote), those of their
    nodes and of the other pools, mapped to them, on a queue of their own; reads of pools and nodes
    from those watches; `--resync` by the clock. Deletion is held by a finalizer of the
    controller's own (pools.POOL_FINALIZER) until the validators are stopped and the nodes' marks
    cleared."""

    kind = "GpuNodePool"

    def __init__(self, settings: OperatorContext, models_: ModelController, pause: PauseState | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        super().__init__(settings, pause if pause is not None else models_.pause)
        self.monotonic = monotonic
        self.models = models_
        self.validators = pools.Validators()
        self.generations: dict[str, int | None] = {}   # pool name -> the generation its last event had
        self.inputs_seen: dict[str, str] = {}          # uid -> what a reconcile reads of the pool itself (pool_inputs)
        self.release_tried: dict[str, float] = {}      # uid -> when this process first tried to release it
        self.nodes_seen: dict[str, str] = {}           # node name -> what the pools read of it (pools.node_inputs)
        # Validators report node by node: a pool's burst of node events within a second is one
        # reconcile. Four workers: a deleted pool's release waits up to a minute for its validators.
        self.queue_and_clock(4, delay_s=1.0)

    # --- one reconcile

    def reads(self) -> cache.ClusterWatch:
        return cache.ClusterWatch(self.settings.kube, self.watched, ("GpuNodePool", "Node"))

    def _written(self, written: dict) -> None:
        self.watched.observe(self.kind, written)

    def _after(self, body: dict, result_word: str, result, status_patch) -> None:
        meta = body["metadata"]
        # Only events move a pool on, and --resync; sooner when one of its nodes' reports turns stale.
        self.clock.reconciled((meta["name"], meta["uid"]), False,
                              getattr(result, "requeue_after_s", None))

    def _record(self, body: dict, result, wire: dict) -> None:
        metrics.record_pool(body["metadata"]["name"], wire)

    def watched_body(self, key) -> dict | None:
        name, uid = key
        found = self.watched.get(self.kind, None, name)
        return found if found is not None and found["metadata"].get("uid") == uid else None

    def reconcile_pool(self, body: dict) -> pools.Result:
        return pools.reconcile(self.reads(), body, self.settings, self.validators)

    def kicked(self, key) -> None:
        """The queue's work: a pool being deleted is released; a live one holds the finalizer
        before anything marks its nodes, then is reconciled."""
        name, uid = key
        meta = {"name": name, "uid": uid}
        with self.locks[uid]:
            body = self.current(meta)
            if body is None or body["metadata"]["uid"] != uid:
                return
            if body["metadata"].get("deletionTimestamp"):
                self.release(body)
                return
            if not self.hold_deletion(body):
                return   # gone meanwhile: no validator for it
        self.run(self.reconcile_pool, {"metadata": meta}, log)

    def hold_deletion(self, body: dict) -> bool:
        """The pool carries the finalizer (False: it is gone)."""
        meta = body["metadata"]
        finalizers = meta.get("finalizers") or []
        if pools.POOL_FINALIZER in finalizers:
            return True
        # The resourceVersion makes it conditional: a finalizer another writer set meanwhile is kept (409, retried).
        written = self.settings.kube.merge_patch(self.kind, None, meta["name"], {"metadata": {
            "finalizers": [*finalizers, pools.POOL_FINALIZER], "resourceVersion": meta.get("resourceVersion")}})
        self.wrote(meta["uid"], written)
        return written is not None

    def wrote(self, uid: str, written: dict | None) -> None:
        """A write of this process: its watch event wakes nothing, and the next read waits for it."""
        if written:
            self.status_written[uid] = written["metadata"].get("resourceVersion")
            self.watched.observe(self.kind, written)

    def release(self, body: dict) -> None:
        """Stop the validators, clear the marks, then let the pool go. Run under the pool's lock:
        a reconcile in flight ends first, and later ones see the deletionTimestamp."""
        meta = body["metadata"]
        name = meta["name"]
        if pools.POOL_FINALIZER not in (meta.get("finalizers") or []):
            return
        metrics.forget_pool(name)
        first_try = self.release_tried.setdefault(meta["uid"], self.monotonic())
        try:
            released = pools.release(self.settings.kube, name, self.settings.namespace)
        except ApiError as exc:
            message = f"Kubernetes API said {exc.status} {exc.reason}: {(exc.body or b'')[:300]!r}"
            # From the first try here, not from the deletion: a pool deleted while the operator was
            # down gets the whole timeout too.
            held = self.monotonic() - first_try
            if exc.status != 403 and held < pools.RELEASE_TIMEOUT_S:
                raise   # the queue tries again after its backoff
            # 403 (RBAC without node patch): retrying will not grant it. Or the API has refused for
            # too long: the pool goes, and says what is left behind.
            why = "refused" if exc.status == 403 else f"failing for {held:.0f} s"
            self.post(body, "Warning", "NodeMarksLeft", f"nodes keep the pool's rankops.io labels and taint "
                      f"(clearing them is {why}): {message}")
        else:
            if not released.validators_stopped:
                self.post(body, "Warning", "ValidatorsStillRunning",
                          f"validator pods of {name} still there after {pools.VALIDATOR_STOP_WAIT_S:.0f} s; "
                          f"cleared the nodes' marks anyway")
            if released.shared_with:
                self.post(body, "Warning", "NodeMarksShared",
                          f"pool {released.shared_with} has the same rankops.io/pool label value: "
                          f"its nodes keep their marks")
            if released.cleared:
                log.info(f"cleared validation marks from {', '.join(sorted(released.cleared))}")
        finalizers = [f for f in meta.get("finalizers") or [] if f not in (pools.POOL_FINALIZER, pools.KOPF_FINALIZER)]
        written = self.settings.kube.merge_patch(self.kind, None, name, {"metadata": {
            "finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}})
        if written and written["metadata"].get("deletionTimestamp") and written["metadata"].get("finalizers"):
            self.watched.observe(self.kind, written)   # another finalizer holds it still: not released again
        else:
            self.watched.forget(self.kind, None, name)
        self.forget_pool(meta)

    def post(self, body: dict, type_: str, reason: str, message: str) -> None:
        log.warning(f"{body['metadata']['name']}: {reason}: {message}")
        if self.kopf_context is not None:   # a copy: a context runs in one thread at a time
            self.kopf_context.copy().run(kopf.event, body, type=type_, reason=reason, message=message[:1000])

    # --- events, as kopf's handlers pass them on

    def pool_event(self, event: dict, models_by_input, pool_selectors) -> None:
        obj = self.own_event(event)
        if obj is None:
            return
        meta = obj["metadata"]
        name, uid, deleted = meta["name"], meta["uid"], event.get("type") == "DELETED"
        before = self.generations.pop(name, None) if deleted else self.generations.get(name, -1)
        if deleted:
            self.forget_pool(meta)
        else:
            self.generations[name] = meta.get("generation")
            seen, was = pools.pool_inputs(obj), self.inputs_seen.get(uid)
            self.inputs_seen[uid] = seen
            # A listing after a broken watch may show this process's last write over changes it missed.
            listing = event.get("type") is None
            if was != seen and (listing or meta.get("resourceVersion") != self.status_written.get(uid)):
                self.queue.kick((name, uid))
        if event.get("type") is None:   # kopf's listing: every pool is reconciled anyway
            return
        self.models.input_event("GpuNodePool", name, models_by_input)
        if self.models.servers is not None:
            self.models.servers.pool_changed(name)
        if deleted or before != meta.get("generation"):   # added, gone or a new selector: the others' overlaps
            for other, entries in pool_selectors.items():
                for other_uid, _selector in entries:
                    if other != name:
                        self.queue.kick((other, other_uid))

    def node_event(self, event: dict, pool_selectors) -> None:
        """A node's labels, verdict or GPU capacity changed (or it came or went): reconcile the pools
        it is in or was in. A heartbeat, or a re-validation with the same verdict, wakes none."""
        if self.pause.paused:
            return
        self.keep_kopf_context()
        node = event["object"]
        name, deleted = node["metadata"]["name"], event.get("type") == "DELETED"
        was = self.watched.get("Node", None, name)   # the pools it was in count it until they are told
        self.watched.observe("Node", node, deleted=deleted)
        seen = pools.node_inputs(node)
        before = self.nodes_seen.pop(name, None) if deleted else self.nodes_seen.get(name)
        if not deleted:
            self.nodes_seen[name] = seen
        if (not deleted and before == seen) or (event.get("type") is None and before is None):
            return   # unchanged, or kopf's first listing (every pool is reconciled then anyway)
        selectors = {pool: selector for pool, entries in pool_selectors.items() for _uid, selector in entries}
        uids = {pool: uid for pool, entries in pool_selectors.items() for uid, _selector in entries}
        for pool in sorted({*pools.pools_of_node(node, selectors), *(pools.pools_of_node(was, selectors) if was else ())}):
            self.queue.kick((pool, uids[pool]))

    # --- forgetting

    def forget_pool(self, meta: dict) -> None:
        uid = meta["uid"]
        metrics.forget_pool(meta["name"])
        self.clock.forget((meta["name"], uid))
        for memory in (self.inputs_seen, self.status_written, self.release_tried):
            memory.pop(uid, None)

    def forget_the_cluster(self) -> None:
        """Paused (kopf peering): what the watches showed goes stale; on resuming kopf lists again."""
        self.inputs_seen.clear()
        self.nodes_seen.clear()
        self.watched.clear()

    def check_validators(self) -> None:
        """Validator DaemonSets are not watched (the chart grants them in its namespace only): those
        this process applied that a LIST no longer finds have their pools reconciled."""
        try:
            validators = self.settings.kube.list("DaemonSet", self.settings.namespace,
                                                 label_selector=f"app.kubernetes.io/name={VALIDATOR_APP}")
        except (ApiError, OSError) as exc:
            log.debug("validator DaemonSet drift check skipped: %s", exc)
            return
        present = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in validators}
        for key in self.validators.gone(present):
            self.queue.kick(key)


class ServerController(_Reconciles):
    """SharedServers (issue 42), on the same reconcile model: their own events (listed at start-up,
    created, a new spec, a status someone else wrote), their members' (a RankingModel naming one:
    created, a new spec, deleted) and their pods' (Ready, an address, going), on a queue of their
    own; a load answered wakes its server (ServerPods.on_done). Members come from the models'
    watch, pods from its own. While a member loads it is looked at every serverplan.POLL_S; a failed
    load when its backoff ends; otherwise at --resync. After each status write the members whose
    line changed are reconciled: their status is read off it."""

    kind = "SharedServer"

    def __init__(self, settings: OperatorContext, models_: ModelController, pause: PauseState | None = None,
                 load_config: Callable[[str], dict] | None = None):
        super().__init__(settings, pause if pause is not None else models_.pause)
        self.models = models_
        self.pods = cache.WatchCache(relist_s=settings.resync)
        self.memory = servers.ServerMemory(**({"load_config": load_config} if load_config else {}),
                                           kick=self._kick_uid)
        self.inputs_seen: dict[str, str] = {}     # uid -> generation, deletion and status at its last event
        self.uids: dict[tuple[str, str], str] = {}   # (namespace, name) -> uid, of the servers seen
        # member uid -> what its server planned from: its generation, server and manual controls (member_event)
        self.member_inputs: dict[str, tuple[Any, ...]] = {}
        self.queue_and_clock(4, delay_s=0.25)

    # --- reads for others

    def server_body(self, namespace: str, name: str) -> dict | None:
        """A SharedServer as its watch shows it (its namespace listed once): what a member's reconcile reads."""
        if self.settings.kube is not None:
            self.watched.fill(self.settings.kube, self.kind, namespace)
        return self.watched.get(self.kind, namespace, name)

    # --- one reconcile

    def _nothing_to_do(self, body: dict) -> bool:
        return bool(body["metadata"].get("deletionTimestamp"))   # its children go by their ownerReferences

    def _written(self, written: dict) -> None:
        self.watched.observe(self.kind, written)

    def _after(self, body: dict, result_word: str, result, status_patch) -> None:
        meta = body["metadata"]
        self.clock.reconciled((meta["namespace"], meta["name"], meta["uid"]), bool(result and result.polls),
                              result.requeue_after if result is not None else None)
        for member in (result.changed_members if result is not None else ()):
            self._kick_member(meta["namespace"], member)

    def watched_body(self, key) -> dict | None:
        namespace, name, uid = key
        found = self.watched.get(self.kind, namespace, name)
        return found if found is not None and found["metadata"].get("uid") == uid else None

    def reconcile_server(self, body: dict) -> servers.Result:
        meta = body["metadata"]
        namespace = meta["namespace"]
        kube = self.settings.kube
        self.models.watched.fill(kube, "RankingModel", namespace)
        self.pods.fill(kube, "Pod", namespace, label_selector=names.LABEL_SERVER)
        return servers.reconcile(kube, body, self.models.watched.select("RankingModel", namespace, {}),
                                 self.pods.select("Pod", namespace, {names.LABEL_SERVER: meta["name"]}),
                                 self.memory, self.settings.tenant_policy)

    def kicked(self, key) -> None:
        namespace, name, uid = key
        self.run(self.reconcile_server, {"metadata": {"namespace": namespace, "name": name, "uid": uid}}, log)

    def _kick_uid(self, uid: str) -> None:
        for (namespace, name), seen_uid in list(self.uids.items()):
            if seen_uid == uid:
                self.queue.kick((namespace, name, uid))

    def _kick_server(self, namespace: str, name: str) -> None:
        uid = self.uids.get((namespace, name))
        if uid is not None:
            self.queue.kick((namespace, name, uid))

    def _kick_member(self, namespace: str, model: str) -> None:
        found = self.models.watched.get("RankingModel", namespace, model)
        if found is not None:
            self.models.queue.kick((namespace, model, found["metadata"]["uid"]))

    # --- events, as kopf's handlers pass them on

    def server_event(self, event: dict) -> None:
        obj = self.own_event(event)
        if obj is None:
            return
        meta = obj["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if event.get("type") == "DELETED":
            self.uids.pop((namespace, name), None)
            self.forget_server(meta)
            for model in servers.members_of(self.models.watched.select("RankingModel", namespace, {}), namespace, name):
                self._kick_member(namespace, model["metadata"]["name"])     # their server is gone: they say so
            return
        self.uids[(namespace, name)] = uid
        seen = essence_digest([meta.get("generation"), meta.get("deletionTimestamp"), obj.get("status")])
        before, self.inputs_seen[uid] = self.inputs_seen.get(uid), seen
        listing = event.get("type") is None
        if before != seen and (listing or meta.get("resourceVersion") != self.status_written.get(uid)):
            self.queue.kick((namespace, name, uid))
        if before is None:     # new here: its members read it
            for model in servers.members_of(self.models.watched.select("RankingModel", namespace, {}), namespace, name):
                self._kick_member(namespace, model["metadata"]["name"])

    def member_event(self, model: dict, event_type: str | None) -> None:
        """A RankingModel naming a server was created, given a new spec or deleted, or its manual controls
        changed (server_switch.MANUAL_ANNOTATIONS): its server plans again (its status writes and other
        annotations wake nothing: the server reads neither). One that named another server before (or
        none now) wakes that one too: it leaves it."""
        meta = model["metadata"]
        annotations = meta.get("annotations") or {}
        server = (model.get("spec") or {}).get("server")
        uid, inputs = meta["uid"], (meta.get("generation"), server,
                                    *(annotations.get(k) for k in server_switch.MANUAL_ANNOTATIONS))
        before = self.member_inputs.get(uid)
        if event_type == "DELETED":
            self.member_inputs.pop(uid, None)
        elif before == inputs:
            return
        elif server:
            self.member_inputs[uid] = inputs
        else:
            self.member_inputs.pop(uid, None)     # no longer a member: forgotten once its server is told
        if event_type is None:
            return
        for named in {server, before[1] if before else None} - {None}:
            if isinstance(named, str):
                self._kick_server(meta["namespace"], named)

    def was_member(self, uid: str) -> bool:
        """A RankingModel that named a server when last seen (member_event)."""
        return uid in self.member_inputs

    def owned_event(self, obj: dict) -> None:
        """One of a server's objects changed or went (its Deployment, ConfigMap, a member's Service):
        the server repairs it."""
        meta = obj["metadata"]
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")
                      and o.get("kind") == self.kind), None)
        if owner and meta.get("namespace"):
            self.queue.kick((meta["namespace"], owner["name"], owner["uid"]))

    def pool_changed(self, pool: str) -> None:
        """A GpuNodePool came, changed or went: the servers placed on it plan again."""
        for (namespace, name), uid in list(self.uids.items()):
            found = self.watched.get(self.kind, namespace, name)
            if found is not None and (found.get("spec") or {}).get("nodePool") == pool:
                self.queue.kick((namespace, name, uid))

    def pod_event(self, event: dict) -> None:
        if self.pause.paused:
            return
        pod = event["object"]
        changed = self.pods.observe("Pod", pod, deleted=event.get("type") == "DELETED")
        server = (pod["metadata"].get("labels") or {}).get(names.LABEL_SERVER)
        if changed and server and event.get("type") is not None:
            self._kick_server(pod["metadata"]["namespace"], server)

    def deployment_event(self, event: dict) -> None:
        """The server's own Deployment (no model label): drift repaired at once."""
        if event.get("type") is not None:
            self.owned_event(event["object"])

    # --- forgetting

    def forget_server(self, meta: dict) -> None:
        uid = meta["uid"]
        self.memory.forget(uid)
        self.clock.forget((meta["namespace"], meta["name"], uid))
        for memory in (self.inputs_seen, self.status_written):
            memory.pop(uid, None)

    def forget_the_cluster(self) -> None:
        self.inputs_seen.clear()
        self.uids.clear()
        self.member_inputs.clear()
        self.watched.clear()
        self.pods.clear()


def build(settings: OperatorContext, pause: PauseState | None = None) -> tuple[ModelController, PoolController]:
    """The controllers of one operator process, sharing its settings and pause state: models,
    pools, and the shared servers (the models' `servers`: their members are models)."""
    model_controller = ModelController(settings, pause)
    model_controller.servers = ServerController(settings, model_controller)
    return model_controller, PoolController(settings, model_controller)


def start(model_controller: ModelController, pool_controller: PoolController) -> None:
    """Their threads: the queues' workers, the clock, the children's watch streams and the drift checks."""
    model_controller.start()
    if model_controller.servers is not None:
        model_controller.servers.start()
    pool_controller.start()
    settings = model_controller.settings
    if settings.kube is not None:
        watches.start(settings.kube, watch_streams(model_controller), settings.namespaces,
                      paused=lambda: model_controller.pause.paused)
    threading.Thread(target=drift_checks, args=(model_controller, pool_controller), daemon=True,
                     name="drift-checks").start()


def watch_streams(model_controller: ModelController) -> list[watches.Stream]:
    """What is watched without kopf (controller/watches.py), by label, and where each event goes:
    a model's children and pods, a shared server's pods and Deployments."""
    streams = [watches.Stream(kind, names.LABEL_MODEL, functools.partial(model_controller.child_event, kind))
               for kind in ("Deployment", "Service", "Job", "PodDisruptionBudget")]
    streams.append(watches.Stream("Pod", names.LABEL_MODEL, model_controller.pod_event))
    server_controller = model_controller.servers
    if server_controller is not None:
        streams += [watches.Stream("Pod", names.LABEL_SERVER, server_controller.pod_event),
                    watches.Stream("Deployment", names.LABEL_SERVER, server_controller.deployment_event)]
    return streams


def drift_checks(model_controller: ModelController, pool_controller: PoolController,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Children that are not watched, and whose deletion would otherwise wait for --resync: every
    MONITOR_CHECK_S a LIST finds the ones this process applied that are gone, and reconciles their
    owners. Validator DaemonSets (the chart grants them in its namespace only), and ServiceMonitors
    when they are applied (their CRD is optional)."""
    while True:
        sleep(MONITOR_CHECK_S)
        if model_controller.pause.paused or model_controller.settings.kube is None:
            continue   # a standby lists nothing: the replica that acts checks
        pool_controller.check_validators()
        model_controller.check_monitors()
