"""Status conditions, Kubernetes style: observations, not a state machine.

`set_condition` is pure: it returns a new list where lastTransitionTime changes only when the
status flips, so re-running a reconcile with the same observations changes nothing.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import Field

from rankops.api.base import ApiModel

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"


class Condition(ApiModel):
    type: Annotated[str, Field(description="Ready, Progressing or Degraded.")]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", description="CamelCase reason.")]
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str | None = None


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(conditions: list[dict], type_: str, status: bool | None, reason: str, message: str,
                  generation: int | None, now: str | None = None) -> list[dict]:
    """Return conditions with `type_` set; the transition time moves only when status flips."""
    status_word = "Unknown" if status is None else ("True" if status else "False")
    previous = next((c for c in conditions if c.get("type") == type_), None)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status_word else None
    updated = {
        "type": type_, "status": status_word, "reason": reason, "message": message[:1024],
        "observedGeneration": generation, "lastTransitionTime": since or now or now_iso(),
    }
    if updated["observedGeneration"] is None:
        del updated["observedGeneration"]
    others = [c for c in conditions if c.get("type") != type_]
    order = {READY: 0, PROGRESSING: 1, DEGRADED: 2}
    return sorted(others + [updated], key=lambda c: (order.get(c["type"], 9), c["type"]))


def get_condition(conditions: list[dict], type_: str) -> dict | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)
