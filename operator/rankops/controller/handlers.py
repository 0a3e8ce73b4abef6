"""kopf handlers: thin wiring from watch events and timers to the reconcilers.

Stacking on.create + on.update(spec) + on.resume with a timer makes the reconcile level-based:
the timer also repairs drift in children, reads gate Job results and moves rollouts along.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

import kopf
from kubernetes.client.exceptions import ApiException

from rankops.api.crdgen import GROUP, VERSION
from rankops.controller import models, pools
from rankops.controller.context import OPERATOR
from rankops.controller.patching import merge_patch

log = logging.getLogger("rankops.handlers")
_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)


def _metrics():
    try:
        from rankops import metrics
        return metrics
    except ImportError:  # metrics are optional at import time (e.g. in unit tests of handlers)
        return None


def _run(kind: str, reconcile, body, patch, logger) -> None:
    """Serialise reconciles of one object (timer and event handlers may overlap), then record."""
    uid = body["metadata"]["uid"]
    started = time.monotonic()
    result_word = "error"
    with _locks[uid]:
        try:
            result = reconcile(body)
            result_word = "degraded" if result.status.get("phase") == "Degraded" else "ok"
        except ApiException as exc:
            raise kopf.TemporaryError(f"Kubernetes API said {exc.status} {exc.reason}: "
                                      f"{(exc.body or '')[:300]}", delay=10) from exc
        finally:
            metrics = _metrics()
            if metrics:
                metrics.observe_reconcile(kind, result_word, time.monotonic() - started)
    status_patch = merge_patch(body.get("status") or {}, result.status)
    if status_patch:
        patch.setdefault("status", {}).update(status_patch)
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])
        logger.info(f"{event.reason}: {event.message}")
    metrics = _metrics()
    if metrics:
        if getattr(result, "outcome", None):
            metrics.observe_rollout(result.outcome)
        for gate in getattr(result, "gate_results", []) or []:
            metrics.observe_gate(gate.get("gate", "unknown"), gate.get("outcome", "error"))
        if kind == "GpuNodePool":
            metrics.set_pool_nodes(body["metadata"]["name"], result.status.get("ready", 0),
                                   result.status.get("failing", 0))


def _model(body, patch, logger):
    _run("RankingModel", lambda b: models.reconcile(OPERATOR.kube, b), body, patch, logger)


def _pool(body, patch, logger):
    _run("GpuNodePool", lambda b: pools.reconcile(OPERATOR.kube, b, OPERATOR), body, patch, logger)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    # Own prefixes for kopf's bookkeeping, set before any object is touched: changing them later
    # would make kopf think every object is new and re-run its creation handlers.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8
    settings.watching.server_timeout = 300


@kopf.on.resume(GROUP, VERSION, "rankingmodels")
@kopf.on.create(GROUP, VERSION, "rankingmodels")
@kopf.on.update(GROUP, VERSION, "rankingmodels", field="spec")
def rankingmodel_changed(body, patch, logger, **_):
    _model(body, patch, logger)


@kopf.timer(GROUP, VERSION, "rankingmodels", interval=OPERATOR.interval, sharp=False)
def rankingmodel_tick(body, patch, logger, **_):
    _model(body, patch, logger)


@kopf.on.resume(GROUP, VERSION, "gpunodepools")
@kopf.on.create(GROUP, VERSION, "gpunodepools")
@kopf.on.update(GROUP, VERSION, "gpunodepools", field="spec")
def gpunodepool_changed(body, patch, logger, **_):
    _pool(body, patch, logger)


@kopf.timer(GROUP, VERSION, "gpunodepools", interval=OPERATOR.interval, sharp=False)
def gpunodepool_tick(body, patch, logger, **_):
    _pool(body, patch, logger)
