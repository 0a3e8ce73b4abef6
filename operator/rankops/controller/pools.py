"""Reconcile one GpuNodePool: its validator DaemonSet, and a status aggregated from node labels."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rankops.api.conditions import now_iso
from rankops.api.errors import describe
from rankops.api.gpunodepool import GpuNodePool
from rankops.controller.kube import Kube
from rankops.rollout.machine import Event
from rankops.validator.daemonset import render_validator
from rankops.validator.pool_status import aggregate_pool_status, pool_conditions


@dataclass
class Result:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)


def _owned(obj: dict[str, Any], pool: dict[str, Any]) -> dict[str, Any]:
    # A cluster-scoped owner may own namespaced objects: deleting the pool removes its DaemonSet.
    obj["metadata"]["ownerReferences"] = [{
        "apiVersion": pool["apiVersion"], "kind": "GpuNodePool", "name": pool["metadata"]["name"],
        "uid": pool["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    return obj


def reconcile(kube: Kube, body: dict[str, Any], operator) -> Result:
    meta = body["metadata"]
    gen = meta.get("generation")
    old = dict(body.get("status") or {})
    events: list[Event] = []
    try:
        pool = GpuNodePool.model_validate({"metadata": meta, "spec": body.get("spec", {})})
    except ValidationError as exc:
        message = "; ".join(describe(exc))
        conditions = [{"type": "Degraded", "status": "True", "reason": "InvalidSpec", "message": message,
                       "lastTransitionTime": now_iso(), "observedGeneration": gen}]
        events.append(Event("Warning", "InvalidSpec", message))
        return Result({**old, "conditions": conditions, "observedGeneration": gen}, events)

    for obj in render_validator(pool, namespace=operator.namespace,
                                service_account=operator.validator_service_account,
                                **({"image": operator.validator_image} if operator.validator_image else {})):
        kube.apply(_owned(obj, body))

    selector = ",".join(f"{k}={v}" for k, v in pool.spec.node_selector.items())
    nodes = kube.list("Node", label_selector=selector)
    summary = aggregate_pool_status(pool, nodes)
    conditions = pool_conditions(summary, old.get("conditions") or [], gen, now_iso())
    before = {c.get("type"): (c.get("status"), c.get("reason")) for c in old.get("conditions") or []}
    for cond in conditions:
        if before.get(cond["type"]) != (cond["status"], cond["reason"]):
            warn = (cond["type"] == "Degraded" and cond["status"] == "True") or \
                   (cond["type"] == "Ready" and cond["status"] == "False")
            events.append(Event("Warning" if warn else "Normal", cond["reason"], cond["message"]))
    return Result({**summary, "conditions": conditions, "observedGeneration": gen}, events)
