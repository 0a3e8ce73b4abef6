"""Reconcile one GpuNodePool: read, plan (poolplan.py: its validator DaemonSet, a status aggregated
from its nodes' reports, the Events), apply; and release a deleted pool: stop its validators, then
clear the marks they left on its nodes."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Any, Callable

from rankops import poolplan
from rankops.api.gpunodepool import GpuNodePoolStatus
from rankops.controller.diffbase import essence_digest
from rankops.controller.kube import ApiError, Kube
from rankops.rollout.machine import Event
from rankops.validator.daemonset import validator_name
from rankops.nodelabels import ANNOTATION_REPORT, LABEL_POOL, label_value
from rankops.validator.node import clear_marks_patch
from rankops.validator.ownership import gpu_capacity, selects


@dataclass
class Result:
    status: GpuNodePoolStatus
    events: list[Event] = field(default_factory=list)
    write: bool = True
    requeue_after_s: float | None = None   # when a node's report turns stale (before --resync)


class Validators:
    """Validator DaemonSets applied, by (namespace, name): the pool (name, uid) each is for (the
    PoolController owns one). Pools are reconciled on events and at --resync; their DaemonSets
    are not watched (the chart grants daemonsets in the operator's namespace only), so `gone`
    finds one deleted."""

    def __init__(self) -> None:
        self.applied: dict[tuple[str, str], tuple[str, str]] = {}

    def gone(self, present: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """(pool, uid) of the pools whose applied validator DaemonSet is no longer listed (`present`:
        the rankops validator DaemonSets the API server lists); forgotten until applied again."""
        return [self.applied.pop(key) for key in list(self.applied) if key not in present]


def reconcile(kube: Kube, body: dict[str, Any], operator, validators: Validators | None = None) -> Result:
    """Read what the pool's plan needs, plan (poolplan.plan, pure), apply its validator DaemonSet
    and note it in `validators` (None: nowhere); the status and Events are the caller's to write."""
    parsed = poolplan.parse(body)
    nodes = kube.list("Node", labels=dict(parsed.pool.spec.node_selector)) if parsed.pool else []
    every_pool = kube.list("GpuNodePool") if parsed.pool else []
    done = poolplan.plan(body, parsed, nodes, every_pool, poolplan.PoolSettings.of(operator),
                         datetime.now(timezone.utc))
    meta = body["metadata"]
    for obj in done.applies:
        kube.apply(obj)
        if validators is not None:
            validators.applied[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = (meta["name"], meta["uid"])
    return Result(done.status, list(done.events), requeue_after_s=done.requeue_after_s)


def pool_inputs(pool: dict[str, Any]) -> str:
    """Digest of what the PoolController acts on in a pool's own event: its spec (by generation),
    a deletion asked for, its finalizer (taken off by someone else), and a status someone else
    wrote. Its own writes are told apart by resourceVersion."""
    meta = pool["metadata"]
    return essence_digest([meta.get("generation"), meta.get("deletionTimestamp"),
                           POOL_FINALIZER in (meta.get("finalizers") or []), pool.get("status")])


def node_inputs(node: dict[str, Any]) -> str:
    """Digest of what a pool's status reads of a node: its labels (selectors, the validator's
    marks), the verdict of its report (not the report's time: a re-validation with the same
    outcome changes nothing) and its GPU capacity. A node event that leaves it alone wakes no pool."""
    meta = node.get("metadata") or {}
    try:
        report = json.loads((meta.get("annotations") or {}).get(ANNOTATION_REPORT, ""))
    except (TypeError, ValueError):
        report = None
    verdict = None
    if isinstance(report, dict):
        checks = [[c.get("id"), c.get("required"), c.get("status")] for c in report.get("checks") or []
                  if isinstance(c, dict)]
        verdict = [report.get("requirementsDigest"), report.get("ready"), report.get("blocking"), checks]
    return essence_digest([meta.get("labels") or {}, verdict, gpu_capacity(node)])


def pools_of_node(node: dict[str, Any], selectors: dict[str, dict[str, str]]) -> list[str]:
    """The pools (by name, with their nodeSelectors) whose status a change of `node` may move: those
    that select it, and the one whose mark it carries (a node that stopped matching leaves it)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    mark = labels.get(LABEL_POOL)
    return sorted(name for name, selector in selectors.items()
                  if selects(selector, labels) or (mark is not None and mark == label_value(name)))


# The operator's own, not kopf's: kopf takes its finalizer (rankops.io/finalizer, which older
# operators' kopf deletion handler put on pools) off an object no kopf handler needs it for.
POOL_FINALIZER = "rankops.io/clear-node-marks"
KOPF_FINALIZER = "rankops.io/finalizer"   # released with it: what it held is done
# How long a failing API (not a refusal) may hold a deleted pool, from the operator's first try to
# release it, before it goes with its marks left.
RELEASE_TIMEOUT_S = 600.0
VALIDATOR_STOP_WAIT_S = 60.0  # then clear anyway: a pod stuck Terminating on a lost node writes nothing


@dataclass
class Release:
    validators_stopped: bool
    cleared: list[str] = field(default_factory=list)   # nodes whose marks were removed
    shared_with: str | None = None                     # a live pool with the same label value


def stop_validators(kube: Kube, pool_name: str, namespace: str, wait_s: float = VALIDATOR_STOP_WAIT_S,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> bool:
    """Delete the pool's validator DaemonSet in the foreground and wait until it is gone, that is
    until each of its pods has stopped: a pod still running would mark its node again after the
    marks are cleared (the pool's ownerReference removes the DaemonSet only after the pool).
    True once gone, False when still there after `wait_s`."""
    name = validator_name(pool_name)
    deadline = clock() + wait_s
    while (ds := kube.get("DaemonSet", namespace, name)) is not None:
        if "foregroundDeletion" not in (ds["metadata"].get("finalizers") or []):
            kube.delete("DaemonSet", namespace, name, propagation="Foreground")
        if clock() >= deadline:
            return False
        sleep(1.0)
    return True


def clear_node_marks(kube: Kube, pool_name: str) -> Release:
    """Remove the validation marks from the nodes whose rankops.io/pool label is this pool's; a
    node another pool has since re-labelled is left alone, and so is every node when a live pool
    maps to the same label value (names that differ only past 63 characters)."""
    value = label_value(pool_name)
    if value is None:
        return Release(validators_stopped=True)
    for other in kube.list("GpuNodePool"):
        other_meta = other["metadata"]
        if other_meta["name"] != pool_name and not other_meta.get("deletionTimestamp") \
                and label_value(other_meta["name"]) == value:
            return Release(validators_stopped=True, shared_with=other_meta["name"])
    cleared = []
    for node in kube.list("Node", labels={LABEL_POOL: value}):
        name = node["metadata"]["name"]
        for attempt in range(3):
            if node is None or (node["metadata"].get("labels") or {}).get(LABEL_POOL) != value:
                break
            patch = clear_marks_patch(node)
            if not patch:
                break
            try:
                if kube.merge_patch("Node", None, name, patch) is not None:
                    cleared.append(name)
                break
            except ApiError as exc:  # 409: the node changed since it was read; re-read, re-decide
                if exc.status != 409 or attempt == 2:
                    raise
                node = kube.get("Node", None, name)
    return Release(validators_stopped=True, cleared=cleared)


def release(kube: Kube, pool_name: str, namespace: str, **wait: Any) -> Release:
    """A deleted pool's end: its validators stopped (or waited for long enough), its marks cleared."""
    stopped = stop_validators(kube, pool_name, namespace, **wait)
    result = clear_node_marks(kube, pool_name)
    result.validators_stopped = stopped
    return result
