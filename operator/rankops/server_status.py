"""A shared server's status and Events from its plan (issue 42), pure: what its reconcile writes
and says once serverplan.plan_server has decided.

Each member's line (state, reason, message, version, port) is what the member's own RankingModel
status reads (model_status.member_status, which says the member's own Events); its transition
time moves only when its state or reason changes. Every Event here is the server's, so its owner
reads its members' history in one place: a member's change of state or reason, said once (the
rule of api.conditions.flipped: the same observation again, a message with new numbers, says
nothing), a member that left, and each flip of the server's conditions: Ready when every member
serves, Degraded when one failed, waits or is refused (the worst reason first).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rankops.api.conditions import DEGRADED, READY, flipped, get_condition, set_condition
from rankops.api.sharedserver import MAX_LISTED_MEMBERS, MEMBER_MESSAGE_MAX, MemberStatus, SharedServerStatus
from rankops.render.serving import config_hash
from rankops.rollout.record import Event
from rankops import server_switch, serverplan

# A member's change to these is a Warning; any other is Normal.
WARNING_STATES = (serverplan.FAILED, serverplan.PENDING, serverplan.REFUSED)
# Degraded's reason when several members are in trouble: the worst first.
DEGRADED_PRECEDENCE = (serverplan.REASON_LOAD_FAILED, serverplan.REASON_SERVER_FULL,
                       serverplan.REASON_NOT_SHAREABLE, serverplan.REASON_CANNOT_PACK)
ALL_SERVING, NOT_SERVING, NO_MEMBERS, AS_EXPECTED = "AllMembersServing", "MembersNotServing", "NoMembers", "AsExpected"
MEMBER_LEFT = "MemberLeft"
HELD_STATES = (serverplan.SERVING, serverplan.LOADING, serverplan.FAILED)


@dataclass(frozen=True)
class Decided:
    status: SharedServerStatus
    events: tuple[Event, ...]          # on the server


def server_status(plan: serverplan.ServerPlan, old: SharedServerStatus, generation: int | None,
                  now: str) -> Decided:
    """The status to write after `plan`, from the status as read (`old`), and the Events to say."""
    before = {m.name: m for m in old.members}
    asked = {name for actions in plan.actions.values() for name in actions.load}
    members, events = [], []
    for outcome in listed(plan.members):
        was = before.get(outcome.name)
        # The config its pods serve: the planned one once it serves and no pod is asked to load it again.
        if serverplan.planned_is_served(outcome, plan.configs, asked, plan.unconfirmed):
            digest, full = config_hash(plan.configs[outcome.name][1]), plan.served_sha256.get(outcome.name)
        else:
            digest, full = (was.config_digest, was.served_sha256) if was else (None, None)
        switch = plan.switches.get(outcome.name)
        line = MemberStatus(name=outcome.name, state=outcome.state, reason=outcome.reason,
                            message=_bounded(outcome.message), version=outcome.version, port=outcome.port,
                            config_digest=digest, served_sha256=full, last_transition_time=now,
                            switch=server_switch.status_of(switch) if switch is not None else None,
                            gates=server_switch.gates_of(switch, was, now),
                            **server_switch.acted_of(switch, was))
        if switch is not None:
            events += switch.events
        if was is not None and (was.state, was.reason) == (line.state, line.reason):
            line = line.model_copy(update={"last_transition_time": was.last_transition_time or now})
        else:
            kind = "Warning" if line.state in WARNING_STATES else "Normal"
            events.append(Event(kind, line.reason, f"{outcome.name}: {line.state}: {line.message}"))
        members.append(line)
    named = {o.name for o in plan.members}
    for gone in (m for m in old.members if m.name not in named):
        events.append(Event("Normal", MEMBER_LEFT, f"{gone.name} left the server: unloaded"
                                                   + (f", port {gone.port} freed" if gone.port else "")))
    conditions = _conditions(plan, old, generation, now)
    for condition in conditions:
        before = get_condition(old.conditions, condition.type)
        if before is None and condition.type == DEGRADED and condition.status == "False":
            continue        # a new server with nothing wrong: nothing to say
        if flipped(before, condition):
            warn = condition.type == DEGRADED and condition.status == "True"
            events.append(Event("Warning" if warn else "Normal", condition.reason, condition.message))
    scaling = plan.scaling
    events += [Event(kind, reason, message) for kind, reason, message in (scaling.events if scaling else ())]
    status = SharedServerStatus(observed_generation=generation, replicas=plan.replicas, members=members,
                                conditions=conditions, autoscaling=scaling.status if scaling else None)
    return Decided(status, tuple(events))


def listed(outcomes: Sequence[serverplan.MemberOutcome]) -> list[serverplan.MemberOutcome]:
    """The lines the status has room for (MAX_LISTED_MEMBERS): the members the server holds first
    (never more than a server's seats, so every one is listed and stays held), then the others in
    arrival order."""
    held = [o for o in outcomes if o.state in HELD_STATES]
    return (held + [o for o in outcomes if o.state not in HELD_STATES])[:MAX_LISTED_MEMBERS]


def held_versions(status: SharedServerStatus) -> dict[str, str]:
    """member -> the version the server holds for it, from its status: a line Serving, Loading or
    Failed (still in the pods' wanted set) holds its version; Pending and Refused hold nothing."""
    return {line.name: line.version for line in status.members if line.state in HELD_STATES and line.version}


def changed_members(old: SharedServerStatus, new: SharedServerStatus) -> tuple[str, ...]:
    """The members whose line changed, or that left: their own reconcile reads the line."""
    before = {line.name: line for line in old.members}
    now = {line.name for line in new.members}
    return tuple(line.name for line in new.members if before.get(line.name) != line) + \
        tuple(name for name in before if name not in now)


def _conditions(plan: serverplan.ServerPlan, old: SharedServerStatus, generation: int | None, now: str) -> list:
    """Ready and Degraded; each message counts first, then names (a condition's message is cut at 1024)."""
    outcomes = plan.members
    unlisted = len(outcomes) - MAX_LISTED_MEMBERS
    tail = f", {unlisted} more member(s) not listed in status.members" if unlisted > 0 else ""
    waiting = [o for o in outcomes if o.state != serverplan.SERVING]
    if not outcomes:
        ready = (False, NO_MEMBERS, "no RankingModel names this server: it runs no pod")
    elif not waiting:
        ready = (True, ALL_SERVING, f"{len(outcomes)} member(s) serve on every ready pod ({plan.replicas} pod(s) "
                                    "asked for)")
    else:
        ready = (False, NOT_SERVING, f"{len(waiting)} of {len(outcomes)} member(s) not serving{tail}: "
                                     + _listed(waiting))
    troubled = sorted((o for o in outcomes if o.state in WARNING_STATES), key=lambda o: _rank(o.reason))
    if troubled:
        degraded = (True, troubled[0].reason, f"{len(troubled)} member(s) failed, wait or are refused{tail}: "
                                              + _listed(troubled))
    else:
        degraded = (False, AS_EXPECTED, "no member failed, waits or is refused")
    conditions = set_condition(list(old.conditions), READY, *ready, generation, now)
    return set_condition(conditions, DEGRADED, *degraded, generation, now)


def _rank(reason: str) -> int:
    return DEGRADED_PRECEDENCE.index(reason) if reason in DEGRADED_PRECEDENCE else len(DEGRADED_PRECEDENCE)


def _listed(outcomes: Sequence[serverplan.MemberOutcome]) -> str:
    return "; ".join(f"{o.name}: {o.state} ({o.reason})" for o in outcomes)


def _bounded(message: str) -> str:
    return message if len(message) <= MEMBER_MESSAGE_MAX else message[:MEMBER_MESSAGE_MAX - 1] + "…"


def blocked(old: SharedServerStatus, reason: str, message: str, generation: int | None, now: str) -> Decided:
    """The server's spec (or its pool, or a write of its objects) cannot be applied: Degraded says
    why, and its members' lines and what serves are left as they were."""
    was = get_condition(old.conditions, DEGRADED)
    conditions = set_condition(list(old.conditions), DEGRADED, True, reason, message, generation, now)
    events = (Event("Warning", reason, message),) if flipped(was, get_condition(conditions, DEGRADED)) else ()
    return Decided(old.model_copy(update={"conditions": conditions, "observed_generation": generation}), events)
