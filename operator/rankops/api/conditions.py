"""Status conditions, Kubernetes style: observations, not a state machine.

`set_condition` is pure: it returns a new list where lastTransitionTime changes only when the
status flips, so re-running a reconcile with the same observations changes nothing. `flipped` is
when a condition's change is said as an Event, for both kinds.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import Field

from rankops.api.base import ApiModel

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"


class Condition(ApiModel):  # status.conditions of both RankingModel and GpuNodePool
    type: Annotated[str, Field(description="Ready or Degraded; a RankingModel also has Progressing.")]
    status: Annotated[Literal["True", "False", "Unknown"], Field(description="True, False or Unknown.")]
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                                 description="CamelCase reason for the last transition.")]
    message: Annotated[str, Field(description="Human-readable details.")] = ""
    observed_generation: Annotated[int | None, Field(
        description="The generation the condition was computed from.")] = None
    last_transition_time: Annotated[str | None, Field(description="When status last changed (RFC 3339).")] = None


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(conditions: list[Condition], type_: str, status: bool | None, reason: str, message: str,
                  generation: int | None, now: str | None = None) -> list[Condition]:
    """Return conditions with `type_` set; the transition time moves only when status flips."""
    status_word = "Unknown" if status is None else ("True" if status else "False")
    previous = get_condition(conditions, type_)
    since = previous.last_transition_time if previous and previous.status == status_word else None
    updated = Condition(type=type_, status=status_word, reason=reason, message=message[:1024],
                        observed_generation=generation, last_transition_time=since or now or now_iso())
    others = [c for c in conditions if c.type != type_]
    order = {READY: 0, PROGRESSING: 1, DEGRADED: 2}
    return sorted(others + [updated], key=lambda c: (order.get(c.type, 9), c.type))


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions or [] if c.type == type_), None)


def flipped(before: Condition | None, after: Condition) -> bool:
    """Whether `after` says something new of its condition, which an Event then says once: a status
    or a reason other than `before`'s, or no `before`. The same observation again (every reconcile,
    a message with new numbers) says nothing. RankingModels and GpuNodePools both go by it."""
    return before is None or (before.status, before.reason) != (after.status, after.reason)
