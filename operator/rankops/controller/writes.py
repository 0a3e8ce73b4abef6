"""Apply one reconcile's children all or nothing, and back off from writes the API server refuses.

A child is written only when it differs from what is observed (controller/unchanged.py). A new
set of children is first applied as a dry run: if the API server refuses any of them
(an annotation it will not store, an API the cluster does not serve, a right the operator lacks),
none is written, so what serves stays as it was instead of a ConfigMap of the new spec beside a
Deployment of the old one. A set applied before is applied straight away.

A model none of whose children exists yet, and whose writes were never refused, has nothing
serving to keep: its children are written without the dry run (half the writes of a new model),
Deployments last, and a refusal deletes what that pass created, so a refused model still leaves
no child behind, and no pod ever started. Its later passes dry-run first, as above.

What was applied and what was refused is remembered per object in this process only (a `Writes`,
owned by the ModelController): it saves dry runs and paces retries, and losing it on a restart
costs one dry run, nothing else.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from rankops.controller import refusal
from rankops.controller.kube import ApiError, ApiMissing, Kube, namespace_terminating
from rankops.controller.unchanged import unchanged, with_digest
from rankops.render.names import FIELD_MANAGER

log = logging.getLogger("rankops.writes")

HANDOVER_MANAGER = "rankops-replicas-handover"


class ChildRefused(Exception):
    def __init__(self, refused: refusal.Refused):
        super().__init__(refused.message())
        self.refused = refused


class Writes:
    """What this process applied and had refused, per object; `clock` paces the retries."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.applied: dict[str, str] = {}                 # uid -> digest of the children last applied
        self.refused: dict[str, refusal.Refused] = {}     # uid -> the last refusal, while it stands
        self.handed_over: set[tuple[str, str]] = set()    # (namespace, Deployment) checked in this process

    def apply_all(self, kube: Kube, meta: dict[str, Any], objects: list[dict[str, Any]]) -> None:
        """Apply `objects` (children of the object with metadata `meta`), or raise ChildRefused with
        nothing written. Transient errors (409, 429, 5xx) propagate as ApiError."""
        uid, generation = meta.get("uid", ""), meta.get("generation")
        objects = [with_digest(obj) for obj in objects]
        digest = refusal.digest(objects)
        previous = self.refused.get(uid)
        if refusal.backing_off(previous, generation, digest, self.clock()):
            raise ChildRefused(previous)
        observed = [_observed(kube, obj) for obj in objects]
        # Only what differs from the child as observed is written (the others are as accepted before).
        changed = [obj for obj, seen in zip(objects, observed) if not unchanged(obj, seen)]
        try:
            if previous is None and uid not in self.applied and all(seen is None for seen in observed):
                _create_all(kube, changed)
            else:
                if self.applied.get(uid) != digest:
                    for obj in changed:
                        _apply(kube, obj, dry_run=True)
                for obj in changed:
                    _apply(kube, obj, dry_run=False)
        except _Refusal as exc:
            refused = refusal.record(previous, generation, digest, exc.refusal, self.clock())
            self.refused[uid] = refused
            self.applied.pop(uid, None)
            log.warning(f"{meta.get('namespace')}/{meta.get('name')}: {refused.message()}")
            raise ChildRefused(refused) from None
        self.applied[uid] = digest
        self.refused.pop(uid, None)

    def forget(self, uid: str) -> None:
        """Drop what is remembered of a deleted object."""
        self.applied.pop(uid, None)
        self.refused.pop(uid, None)

    def hand_over_replicas(self, kube: Kube, namespace: str, name: str, applied: list[dict[str, Any]]) -> None:
        """autoscaling mode external: before the stable Deployment `name` is first applied without
        spec.replicas while rankops owns that field, its value is applied once under a manager of its
        own, so that leaving it out does not reset it to 1 (server-side apply removes a field its only
        owner stops applying); the user's autoscaler's next scale takes it from there. Read once per
        Deployment and process, from the API server (the watch cache keeps no managedFields)."""
        ours = next((o for o in applied if o.get("kind") == "Deployment" and o["metadata"]["name"] == name), None)
        if ours is None or "replicas" in ours.get("spec", {}) or (namespace, name) in self.handed_over:
            return
        deployment = getattr(kube, "kube", kube).get("Deployment", namespace, name)
        if owns_replicas(deployment):
            kube.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": name, "namespace": namespace},
                        "spec": {"replicas": (deployment.get("spec") or {}).get("replicas", 1)}},
                       field_manager=HANDOVER_MANAGER)
            log.info(f"{namespace}/{name}: spec.replicas handed over to the user's autoscaler "
                     "(autoscaling mode external)")
        self.handed_over.add((namespace, name))


class _Refusal(Exception):
    def __init__(self, found: refusal.Refusal):
        self.refusal = found


_UNREADABLE: dict[str, Any] = {"metadata": {"deletionTimestamp": "unknown"}}   # never `unchanged`


def _observed(kube: Kube, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The child as it is, None when it does not exist; _UNREADABLE when it cannot be read (the
    apply then says why)."""
    try:
        return kube.get(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
    except ApiMissing:
        return _UNREADABLE
    except ApiError as exc:
        if refusal.is_refusal(exc.status):
            return _UNREADABLE
        raise


def creation_order(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order a new model's children are created in: Deployments last, so that no pod starts
    before the rest is accepted (benchmarks/reconcile_bench.py's raw apply sends them so too)."""
    return sorted(objects, key=lambda obj: obj["kind"] == "Deployment")


def _create_all(kube: Kube, objects: list[dict[str, Any]]) -> None:
    """Create children none of which exists, in creation_order; on a refusal, delete those this
    pass created and raise it."""
    ordered = creation_order(objects)
    created: list[dict[str, Any]] = []
    try:
        for obj in ordered:
            if _only_ours(_apply(kube, obj, dry_run=False)):
                created.append(obj)
    except _Refusal:
        for obj in reversed(created):
            meta = obj["metadata"]
            try:
                kube.delete(obj["kind"], meta.get("namespace"), meta["name"])
            except ApiError as exc:   # the next pass finds it and dry-runs first: said, not fatal
                log.warning(f"could not remove {obj['kind']} {meta['name']} after its sibling was refused: "
                            f"{exc.status} {exc.reason}")
        raise


def _only_ours(answer: dict[str, Any] | None) -> bool:
    """The applied object has no field of another manager: it did not exist before this pass (an
    object of the same name that something else made, and this cache did not know, is left be)."""
    managers = {m.get("manager") for m in ((answer or {}).get("metadata") or {}).get("managedFields") or []}
    return managers <= {FIELD_MANAGER}


def _apply(kube: Kube, obj: dict[str, Any], dry_run: bool) -> dict[str, Any] | None:
    try:
        return kube.apply(obj, dry_run=dry_run)
    except ApiMissing:
        raise _Refusal(refusal.missing_api(obj)) from None
    except ApiError as exc:
        if not refusal.is_refusal(exc.status) or namespace_terminating(exc):
            raise
        raise _Refusal(refusal.from_api_error(obj, exc.status, exc.reason, exc.body)) from None


def owns_replicas(deployment: dict[str, Any] | None, manager: str = FIELD_MANAGER) -> bool:
    """Whether `manager` owns the Deployment's spec.replicas (its managedFields say so)."""
    for entry in ((deployment or {}).get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply" \
                and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            return True
    return False
