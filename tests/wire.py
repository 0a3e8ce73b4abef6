"""Statuses as the API server stores them (camelCase dicts), to and from the typed models the core
takes and returns: a test writes a status as a user would read it with kubectl."""
from __future__ import annotations

from typing import Any

from rankops.api.rankingmodel import RankingModelStatus, RolloutStatus


def status(wire: dict[str, Any] | RankingModelStatus | None) -> RankingModelStatus:
    """The typed status of a stored one (validated: a test's typo is an error, not dropped)."""
    if isinstance(wire, RankingModelStatus):
        return wire
    return RankingModelStatus.model_validate(wire or {})


def rollout(wire: dict[str, Any] | RolloutStatus | None) -> RolloutStatus | None:
    if wire is None or isinstance(wire, RolloutStatus):
        return wire
    return RolloutStatus.model_validate(wire)


def stored(model: Any) -> Any:
    """A typed status (or part of one, or a list of them) as the API server stores it."""
    if isinstance(model, list):
        return [stored(m) for m in model]
    return model.to_wire() if hasattr(model, "to_wire") else model
