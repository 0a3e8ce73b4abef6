"""A RankingModel's status and what its reconcile removes, as pure functions beside the rollout's
`step()`.

`step()` decides the rollout; these decide the rest of the model's status from its Decision and
what the cluster showed: the phase, the Ready / Progressing / Degraded conditions (one precedence
list for every Degraded reason), the canary's traffic weight, the Events of a condition that
flips, and which children go. modelplan gathers the facts and the shell applies the outcome.
Status comes in and goes out as the typed model (api.rankingmodel's RankingModelStatus), so the
code cannot write a field the CRD schema lacks; a stored one is read through `known_status`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Iterable

from rankops.api.base import unknown_fields_message  # noqa: F401 (said by the shell)
from rankops.api.conditions import DEGRADED, PROGRESSING, READY, flipped, get_condition, set_condition
from rankops.api.phases import (  # noqa: F401 (the precedence lists: re-exported)
    DEGRADED_PRECEDENCE, NOT_APPLIED_REASONS, SERVING_REASONS, DegradedReason, ModelPhase, RolloutPhase)
from rankops.api.planning import PlanStatus
from rankops.api.rankingmodel import RankingModelSpec, RankingModelStatus, RolloutStatus, TrafficMode
from rankops.render import names
from rankops.render.desired import effective_weight
from rankops.rollout.machine import ACTIVE, ROLLED_BACK, Decision, Event, attempt_id
from rankops.rollout import warming

SPEC_NOT_APPLIED = "SpecNotApplied"   # Ready's reason while a generation cannot be applied


@dataclass(frozen=True)
class StableView:
    """The stable Deployment as the cluster shows it."""
    exists: bool = False
    desired: int = 0
    ready: int = 0
    settled: int = 0                 # Ready pods already running the current template
    version: str | None = None       # the version its template runs


@dataclass(frozen=True)
class Facts:
    """What the status is decided from, besides the spec, the old status and the step's Decision."""
    now: str                                   # RFC 3339: a condition that flips says it changed then
    generation: int | None
    stable: StableView
    canary_ready: int = 0                      # Ready canary pods of the canary version, on live nodes
    replicas: int = 1                          # the replicas wanted (spec, or the plan's)
    plan: PlanStatus | None = None             # status.plan
    problems: tuple[str, ...] = ()             # what the plan predicts will go wrong
    unbatched: tuple[str, ...] = ()            # inputs that keep Triton from batching requests
    pool_note: str | None = None               # the pool has no validated ready node
    unschedulable: str | None = None           # stable pods the scheduler cannot place, and why
    moving: str | None = None                  # replicas moving off leaving nodes (rollout/disruption)
    placement: tuple[str, str] | None = None   # (reason, message): no ready node runs the image
    notes: tuple[str, ...] = ()                # what rankops could not check
    warm_failing: tuple[str, ...] = ()         # pods un-Ready as their model fails its warm requests (rollout.warming)


@dataclass(frozen=True)
class StatusDecision:
    status: RankingModelStatus       # the whole status
    events: tuple[Event, ...] = ()


def known_status(status: dict[str, Any]) -> tuple[RankingModelStatus, list[str]]:
    """A stored status without the fields this operator's RankingModelStatus does not know (what a
    newer rankops left behind before an older one was rolled back onto the same CRD), and without
    the phases it does not know, and what was dropped (a field's path, "path=value" of a value).
    Kept, they made every status write a ValidationError: a crash loop with no status.

    status.phase is decided anew by every reconcile: an unknown one just goes. status.rollout.phase
    is what the machine continues from, and one it does not know it cannot continue: the record
    is kept (its version, fromVersion and attempt, and the manual controls acted on, so a leftover
    rankops.io/promote or abort never acts twice) but closed as Canceled, the one end that claims
    nothing: no promotion (trusted_stable vouches only for a Promoted one), no failure. The machine
    then treats it as any ended rollout: spec.version at the stable version leaves stable serving
    (the canary goes), another version starts a fresh attempt from CanaryStarting, its gates run
    again, and no traffic reaches its canary before they pass.

    A field whose value does not validate (a status edited by hand) is dropped as well, said as
    "path=invalid": the next reconcile decides it anew."""
    kept, dropped = RankingModelStatus.known_fields(status)
    rollout = kept.get("rollout")
    if isinstance(rollout, dict) and "phase" not in rollout:
        unknown = (status.get("rollout") or {}).get("phase")
        said = f"status.rollout.phase {unknown} is not a phase this operator knows (written by a newer rankops?)" \
            if unknown is not None else "status.rollout had no phase"
        kept["rollout"] = {**rollout, "phase": RolloutPhase.CANCELED, "message": (
            f"{said}: "
            f"the rollout of version {rollout.get('version')} is not continued; "
            "if spec.version still names another version than the stable one, it starts again with its gates")}
    return RankingModelStatus.validated_dropping(kept, dropped)


def weight(spec: RankingModelSpec, decision: Decision, stable_ready: int, canary_ready: int) -> int | None:
    """The canary's share of traffic now, in percent (None: no canary)."""
    canary = decision.serving.canary_version
    if not canary:
        return None
    if not decision.serving.canary_traffic:
        return 0
    if spec.rollout.canary.traffic is TrafficMode.replicas:
        return effective_weight(stable_ready, canary_ready)   # the share Ready pods really get
    return decision.serving.canary_weight or spec.rollout.canary.weight   # the step's weight, routed exactly


def decide(spec: RankingModelSpec, old: RankingModelStatus, decision: Decision, facts: Facts) -> StatusDecision:
    """The status after a reconcile that applied `decision`, and the Events its conditions' flips say."""
    stable, gen, want = facts.stable, facts.generation, facts.replicas
    events: list[Event] = []
    conditions = old.conditions
    rollout = decision.rollout
    active = rollout is not None and rollout.phase in ACTIVE
    # The stable Deployment runs fewer while a replacing canary holds some of its GPUs, and more
    # while replicas move off leaving nodes: Ready once it runs at least what is rendered (a surge
    # being scaled back is still Ready) and serves what it can.
    deployed = want - decision.serving.stable_lent + decision.serving.stable_surge
    is_ready = stable.exists and stable.version == decision.serving.stable_version \
        and stable.settled >= min(want, deployed) and stable.desired >= deployed
    ready_msg = (f"{stable.settled}/{want} replicas of version {decision.serving.stable_version} Ready and up to date"
                 + (f" ({stable.ready} Ready in all)" if stable.ready != stable.settled else ""))
    prev_ready = get_condition(conditions, READY)
    conditions = set_condition(conditions, READY, is_ready, "ReplicasReady" if is_ready else "ReplicasNotReady",
                               ready_msg, gen, facts.now)
    if prev_ready and prev_ready.status != ("True" if is_ready else "False"):
        events.append(Event("Normal" if is_ready else "Warning", "Ready" if is_ready else "NotReady", ready_msg))
    progressing = ("AwaitingDecision" if rollout.awaiting_decision else rollout.phase) if active \
        else ("MovingReplicas" if facts.moving else "Deploying" if not is_ready else "Stable")
    was_progressing = get_condition(conditions, PROGRESSING)
    conditions = set_condition(conditions, PROGRESSING, active or not is_ready or bool(facts.moving), progressing,
                               (rollout.message or "") if active else facts.moving or ready_msg, gen, facts.now)
    if facts.moving and (not was_progressing or was_progressing.reason != "MovingReplicas") and not active:
        events.append(Event("Normal", "MovingReplicas", facts.moving))

    failed = rollout if rollout and rollout.phase == ROLLED_BACK and rollout.version == spec.version else None
    reason, message = degraded_reason(facts, failed, rollout if active else None)
    was = get_condition(conditions, DEGRADED)
    degraded = reason != DegradedReason.AS_EXPECTED
    conditions = set_condition(conditions, DEGRADED, degraded, reason, message, gen, facts.now)
    if degraded and flipped(was, get_condition(conditions, DEGRADED)) and reason != DegradedReason.ROLLED_BACK:
        events.append(Event("Warning", reason, message))   # a rollback has its own Event, from step()

    if active:
        phase = ModelPhase(rollout.phase)
    elif failed:
        phase = ModelPhase.ROLLED_BACK
    else:
        phase = ModelPhase.READY if is_ready else ModelPhase.PENDING
    status = RankingModelStatus(
        observed_generation=gen, phase=phase, stable_version=decision.stable_version,
        stable_pods_version=decision.stable_pods_version,
        canary_version=decision.serving.canary_version,
        canary_weight=weight(spec, decision, stable.ready, facts.canary_ready),
        replicas=want, ready_replicas=stable.ready, ready=f"{stable.ready}/{want}",
        rollout=rollout, gates=list(decision.gates), plan=facts.plan, conditions=conditions)
    return StatusDecision(status, tuple(events))


def first_status_can_wait(old: RankingModelStatus, new: RankingModelStatus) -> bool:
    """Whether a new model's first status (it has none yet) may be left unwritten for one reconcile:
    it would only say Pending, waiting for the replicas just created, nothing wrong and no rollout.
    The reconcile that sees them Ready (a Deployment event), or the clock's at --interval, writes
    it; in a burst of new models that is one status write per model instead of two."""
    if old.phase or new.phase != ModelPhase.PENDING or (new.rollout is not None and new.rollout.phase in ACTIVE):
        return False
    ready = get_condition(new.conditions, READY)
    if ready is not None and ready.reason == WAITING_FOR_SERVER:
        return False      # a SharedServer's member: no Deployment event of its own comes to write it
    degraded = get_condition(new.conditions, DEGRADED)
    return not degraded or degraded.status != "True"


def first_ready_event(old: RankingModelStatus, new: RankingModelStatus) -> Event | None:
    """The Ready Event of a model whose first status, Pending, was left unwritten
    (first_status_can_wait): `decide` says a flip of Ready, and this one had no Ready to flip from."""
    ready = get_condition(new.conditions, READY)
    if old.phase or not ready or ready.status != "True":
        return None
    return Event("Normal", "Ready", ready.message)


# Every reason a model is Degraded, most serious first, is api.phases.DegradedReason in its order:
# DEGRADED_PRECEDENCE, one list for both kinds. The first ones (NOT_APPLIED_REASONS) mean this
# generation is not applied (what served before serves on, Ready says SpecNotApplied); the others
# (SERVING_REASONS) are found while the generation serves.


def first_problem(problems: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The (reason, message) that Degraded says of these: the first in DEGRADED_PRECEDENCE (a reason
    it lacks comes last, in the order given)."""
    order = {reason: i for i, reason in enumerate(DEGRADED_PRECEDENCE)}
    ranked = sorted(enumerate(problems), key=lambda p: (order.get(p[1][0], len(order)), p[0]))
    return ranked[0][1] if ranked else None


def degraded_reason(facts: Facts, failed: RolloutStatus | None,
                    active: RolloutStatus | None = None) -> tuple[str, str]:
    """Degraded's (reason, message): the first of what is wrong, by DEGRADED_PRECEDENCE. `active`:
    the rollout in flight, whose canary may be unplaceable or unjudgeable."""
    R = DegradedReason
    problems: list[tuple[str, str]] = []
    if failed:
        problems.append((R.ROLLED_BACK, failed.message or ""))
    if facts.unschedulable:
        problems.append((R.PODS_UNSCHEDULABLE, facts.unschedulable))
    if active and active.unschedulable:
        problems.append((R.PODS_UNSCHEDULABLE, f"canary {active.version}: {active.unschedulable}"))
    if active and active.analysis_problem:
        problems.append((R.CANARY_NOT_JUDGED, f"canary analysis of {active.version}: {active.analysis_problem}"))
    if facts.pool_note:
        problems.append((R.NO_READY_NODES, facts.pool_note))
    if facts.placement:
        problems.append(facts.placement)
    if facts.warm_failing:
        problems.append((R.WARMUP_FAILING, warming.describe(facts.warm_failing)))
    if facts.unbatched:
        problems.append((R.REQUESTS_NOT_BATCHED, "; ".join(facts.unbatched)))
    if facts.problems:
        problems.append((R.PLAN_PREDICTS_PROBLEM, "; ".join(facts.problems)))
    return first_problem(problems) or (R.AS_EXPECTED, "; ".join(["no problem seen", *facts.notes]))


def degraded_only(old: RankingModelStatus, generation: int | None, reason: str, message: str,
                  now: str) -> StatusDecision:
    """A problem only the operator can see (an invalid spec, a missing input, a refused write): say
    so, and leave whatever is serving (and the rest of the status) as it was.

    Ready keeps saying whether what serves is Ready (the previous generation's objects), but at
    this generation and with a reason that says this one is not applied.
    """
    was = get_condition(old.conditions, DEGRADED)
    conditions = set_condition(old.conditions, DEGRADED, True, reason, message, generation, now)
    ready = get_condition(conditions, READY)
    serving = {"True": True, "False": False}.get(ready.status if ready else None)
    stable = old.stable_version
    note = (f"generation {generation} is not applied ({reason}: see Degraded); "
            + (f"version {stable} serves as before ({old.ready or '?'} Ready)" if stable and ready
               else "nothing serves yet"))
    conditions = set_condition(conditions, READY, serving, SPEC_NOT_APPLIED, note, generation, now)
    conditions = set_condition(conditions, PROGRESSING, False, SPEC_NOT_APPLIED, note, generation, now)
    events = (Event("Warning", reason, message),) if flipped(was, get_condition(conditions, DEGRADED)) else ()
    status = old.model_copy(update={"conditions": conditions, "phase": ModelPhase.DEGRADED,
                                    "observed_generation": generation})
    return StatusDecision(status, events)


def unwanted_tracks(decision: Decision) -> list[str]:
    """The tracks besides stable that the decision does not serve: the canary without a canary
    version, the reference without a reference version."""
    return [track for track, version in ((names.CANARY, decision.serving.canary_version),
                                         (names.REFERENCE, decision.reference_version)) if not version]


def wanted_job_names(model: str, decision: Decision) -> set[str]:
    """The gate Jobs the decision runs now (the Jobs of its rollout attempt's current gate)."""
    if not decision.gate_jobs:
        return set()
    version, attempt = decision.rollout.version, attempt_id(decision.rollout)
    return {names.gate_job_name(model, gate, version, attempt) for gate in decision.gate_jobs}


def track_children(model: str, track: str) -> list[tuple[str, str]]:
    """(kind, name) of the objects one track (canary, reference) is made of."""
    return [("Deployment", names.deployment_name(model, track)),
            ("Service", names.track_service_name(model, track)),
            ("ConfigMap", names.config_map_name(model, track)),
            ("PodDisruptionBudget", names.disruption_budget_name(model, track))]


def unwanted_children(model: str, decision: Decision) -> list[tuple[str, str]]:
    """(kind, name) of the track objects the decision no longer wants, whether they exist or not."""
    return [child for track in unwanted_tracks(decision) for child in track_children(model, track)]


def deletions(model: str, decision: Decision, present: Collection[tuple[str, str]],
              gate_jobs: Iterable[tuple[str, bool]]) -> list[tuple[str, str]]:
    """(kind, name) of the children to delete: the objects of the tracks no longer served that
    exist (`present`: the (kind, name) of this model's children the cluster shows), and the gate
    Jobs still running that the decision no longer runs (`gate_jobs`: (name, finished) of this
    model's gate Jobs), superseded or rolled back: their load stops. Finished Jobs stay, for
    their verdicts and logs (their TTL removes them). Nothing that does not exist is deleted."""
    present = set(present)
    keep = wanted_job_names(model, decision)
    return [child for child in unwanted_children(model, decision) if child in present] + \
        [("Job", job) for job, finished in gate_jobs if job not in keep and not finished]


# --- a member of a SharedServer (spec.server): its status is its line of the server's status

SERVED_BY_SERVER = "ServedBySharedServer"      # Ready's reason while the server serves it
WAITING_FOR_SERVER = "WaitingForServer"        # Ready's reason while the server loads it, or has not listed it
# The server's word for a member that does not serve -> the member's Degraded reason.
MEMBER_PROBLEMS = {"Failed": DegradedReason.MEMBER_LOAD_FAILED, "Pending": DegradedReason.SERVER_FULL}


def member_status(old: RankingModelStatus, spec: RankingModelSpec, server: str, line: Any | None, found: bool,
                  generation: int | None, now: str) -> StatusDecision:
    """The status of a RankingModel that names a SharedServer, from that server's status: `found`
    whether the server exists, `line` its status.members entry for this model (api.sharedserver
    MemberStatus; None: not listed yet). Serving: Ready. Loading, or not listed yet: Pending.
    Failed on a pod, waiting for room, refused: Degraded with the server's reason and words.
    Events: Ready's and Degraded's flips, by the rule of conditions.flipped."""
    R = DegradedReason
    serving = line is not None and line.state == "Serving"
    if not found:
        problem = (R.SHARED_SERVER_NOT_FOUND, f"SharedServer {server} (spec.server) does not exist in this "
                   "namespace: create it (kubectl apply -f sharedserver.yaml); spec.server cannot be changed")
        ready_note = f"SharedServer {server} does not exist"
    elif line is None:
        problem, ready_note = None, f"SharedServer {server} has not listed this model yet"
    else:
        reason = MEMBER_PROBLEMS.get(line.state) or (line.reason if line.state == "Refused" else None)
        problem = (reason, f"SharedServer {server}: {line.message}") if reason else None
        ready_note = f"SharedServer {server}: {line.message}"
    waits = serving and line.version is not None and line.version != spec.version
    switch = getattr(line, "switch", None) if waits else None
    # its new version: switched in place by the server (server_switch.py), stopped, or waiting its turn
    moving = "SwitchingInPlace" if switch is not None and switch.version == spec.version and \
        switch.phase not in ("Switched", "RolledBack", "FellBack") else \
        "SwitchStopped" if switch is not None and switch.version == spec.version else "VersionWaits"
    conditions = set_condition(old.conditions, READY, serving, SERVED_BY_SERVER if serving else WAITING_FOR_SERVER,
                               ready_note, generation, now)
    conditions = set_condition(conditions, PROGRESSING, not serving or (waits and moving != "SwitchStopped"),
                               moving if waits else "Stable" if serving else "Loading",
                               ready_note, generation, now)
    reason, message = problem or (R.AS_EXPECTED, "no problem seen")
    conditions = set_condition(conditions, DEGRADED, problem is not None, reason, message, generation, now)
    events = []
    for type_, bad in ((READY, not serving), (DEGRADED, problem is not None)):
        was, now_is = get_condition(old.conditions, type_), get_condition(conditions, type_)
        if was is not None and flipped(was, now_is) or (was is None and type_ == DEGRADED and problem):
            events.append(Event("Warning" if bad else "Normal", now_is.reason, now_is.message))
    phase = ModelPhase.READY if serving else ModelPhase.DEGRADED if problem else ModelPhase.PENDING
    version = line.version if line is not None and line.state in ("Serving", "Loading", "Failed") else None
    status = RankingModelStatus(observed_generation=generation, phase=phase, stable_version=version or old.stable_version,
                                conditions=conditions, gates=list(getattr(line, "gates", None) or []))
    return StatusDecision(status, tuple(events))
