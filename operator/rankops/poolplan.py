"""A GpuNodePool's plan: what one reconcile applies, the status it writes and the Events it says, as
one pure function of the pool and the nodes its selector matches: the pools' seam, as modelplan.py
is the models'.

    read (controller/pools.py: the pool, its nodes, every pool) -> plan() -> apply -> record

The plan holds the validator DaemonSet (with the operator's pull secrets, owned by the pool), the
typed status (pool_status.py counts the nodes' verdicts) and the Events of the conditions that
flip, by the rule both kinds share (api.conditions.flipped). `rankops render` prints the plan of a
pool as new (no node observed), so what it prints is what the operator applies.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rankops.api.base import unknown_fields_message
from rankops.api.conditions import DEGRADED, flipped, get_condition, set_condition
from rankops.api.errors import describe
from rankops.api.gpunodepool import GpuNodePool, GpuNodePoolStatus
from rankops.pool_status import node_claims, pool_status, seconds_until_stale
from rankops.render.pullsecrets import with_pull_secrets
from rankops.rollout.record import Event, iso
from rankops.validator.daemonset import DEFAULT_PRIORITY_CLASS, DEFAULT_SERVICE_ACCOUNT, render_validator

INVALID_SPEC = "InvalidSpec"
# A flip to these says something is wrong with the pool: a Warning Event; any other flip is Normal.
WARNING_WHEN_TRUE = ("Degraded", "Overlapping", "NodesWithoutGpus")
WARNING_WHEN_FALSE = ("Ready",)


@dataclass(frozen=True)
class PoolSettings:
    """What the cluster admin started the operator with, as far as pools go (`rankops run`'s flags;
    the defaults are the chart's names for the release `rankops` in rankops-system)."""
    namespace: str = "rankops-system"                     # where the validator DaemonSets run
    validator_service_account: str = DEFAULT_SERVICE_ACCOUNT
    validator_image: str | None = None                    # instead of each pool's spec.validator.image
    validator_priority_class: str = DEFAULT_PRIORITY_CLASS   # "" for none
    pull_secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, operator: Any) -> "PoolSettings":
        """From the operator's settings (controller.context.OperatorContext)."""
        return cls(operator.namespace, operator.validator_service_account, operator.validator_image,
                   getattr(operator, "validator_priority_class", DEFAULT_PRIORITY_CLASS),
                   tuple(getattr(operator, "image_pull_secrets", ())))


@dataclass(frozen=True)
class ParsedPool:
    """A pool's body as read: its stored status (what this operator knows of it), and its spec or
    why the spec does not validate."""
    old: GpuNodePoolStatus
    unknown: tuple[str, ...] = ()      # stored status fields dropped: said once, left out of the next write
    pool: GpuNodePool | None = None
    invalid: str | None = None


@dataclass(frozen=True)
class PoolPlan:
    applies: tuple[dict[str, Any], ...]
    status: GpuNodePoolStatus
    events: tuple[Event, ...] = ()
    requeue_after_s: float | None = None   # when a node's report turns stale (before --resync)


def parse(body: dict[str, Any]) -> ParsedPool:
    """The pool of `body`, parsed once per reconcile; the shell reads its nodes by its selector."""
    old, unknown = GpuNodePoolStatus.from_stored(body.get("status") or {})
    try:
        pool = GpuNodePool.model_validate({"metadata": body["metadata"], "spec": body.get("spec", {})})
    except ValidationError as exc:
        return ParsedPool(old, tuple(unknown), invalid="; ".join(describe(exc)))
    return ParsedPool(old, tuple(unknown), pool=pool)


def plan(body: dict[str, Any], parsed: ParsedPool, nodes: list[dict[str, Any]], pools: list[dict[str, Any]],
         settings: PoolSettings, now: dt.datetime) -> PoolPlan:
    """`nodes`: those the pool's selector matches; `pools`: every GpuNodePool (the oldest pool that
    selects a node owns it); `now`: the reconcile's time, timezone-aware."""
    meta, old = body["metadata"], parsed.old
    generation = meta.get("generation")
    # Said once: the status written next leaves them out.
    events = [Event("Warning", "StatusFieldsUnknown", unknown_fields_message(list(parsed.unknown)))] \
        if parsed.unknown else []
    if parsed.pool is None:
        was = get_condition(old.conditions, DEGRADED)
        # Only Degraded, as before (what a valid spec reported no longer holds), its time kept while it stays.
        conditions = set_condition([was] if was else [], DEGRADED, True, INVALID_SPEC, parsed.invalid or "",
                                   generation, iso(now))
        if flipped(was, get_condition(conditions, DEGRADED)):
            events.append(Event("Warning", INVALID_SPEC, parsed.invalid or ""))
        return PoolPlan((), old.model_copy(update={"conditions": conditions, "observed_generation": generation}),
                        tuple(events))
    pool = parsed.pool
    # A pool being deleted keeps its status, but its validator is not applied again: its release
    # removes it before it clears the nodes' marks.
    validator = [] if meta.get("deletionTimestamp") else render_validator(
        pool, namespace=settings.namespace, service_account=settings.validator_service_account,
        image=settings.validator_image, priority_class_name=settings.validator_priority_class)
    claims = node_claims(pool, nodes, pools)
    status = pool_status(pool, nodes, claims, old, generation, iso(now))
    for condition in status.conditions:
        if flipped(get_condition(old.conditions, condition.type), condition):
            warn = (condition.type in WARNING_WHEN_TRUE and condition.status == "True") or \
                   (condition.type in WARNING_WHEN_FALSE and condition.status == "False")
            events.append(Event("Warning" if warn else "Normal", condition.reason, condition.message))
    owned = [n for n in nodes if claims[(n.get("metadata") or {}).get("name", "?")].owned]
    return PoolPlan(tuple(with_pull_secrets(validator, list(settings.pull_secrets))), status, tuple(events),
                    requeue_after_s=seconds_until_stale(pool, owned, now))


def as_new(body: dict[str, Any], settings: PoolSettings = PoolSettings(), now: dt.datetime | None = None) -> PoolPlan:
    """The plan of a pool as new (no node observed): what `rankops render` prints."""
    body = {**body, "metadata": body.get("metadata") or {}}
    return plan(body, parse(body), [], [], settings, now or dt.datetime.now(dt.timezone.utc))
