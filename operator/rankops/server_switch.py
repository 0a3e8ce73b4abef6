"""A member's version switch inside a shared server's running pods (issue 42), pure: its new
spec.version loaded beside the version the server holds in one pod, gated there by version (warm-up,
and equivalence against the held version in the same pod), then loaded pod by pod, the held version
unloaded last. It is rollout/inplace.py's machine, run on the member's entries of each pod's index;
its record lives in the member's line of the server's status (`switch`), so a restarted operator
carries on from it.

When the next version does not fit beside every member on the card, the switch is a swap
(rollout/inplace.py): each pod in turn leaves the member's endpoints, has the held version unloaded
and the new one loaded alone, so the card never holds both. It takes one pod of the member's
serving out at a time, so it needs the fewer of the member's and the server's failureTolerance at
1 or more and two pods running; the gates judge the first pod swapped, equivalence against the
held version on another pod.

A member of a shared server has no pods of its own to fall back to: a switch that cannot be in place
(no swap either, the two cannot be one Triton model's versions, the equivalence reference is not
the held version) or that stops (a gate failed,
a load failed or ran out of time, the held version's P99 over its bound while it loaded) leaves the
held version serving, and the member's message says why and what to do. A stopped switch is not
tried again for the same spec.version: set spec.version back to the held version (which clears it),
or to another version, or ask again with the member's rankops.io/retry annotation naming the version.

The member's manual controls are the model path's (rollout/record.py): rankops.io/abort naming the
version switching in rolls the switch back, in any phase, paused or not; rankops.io/retry naming a
version whose switch stopped begins it again. Each acts once per value: the value acted on is kept
in the member's status line (aborted, retried), so one left in place never acts again.

    held 1, spec.version 2:  begin -> Loading -> Gating -> Promoting -> Unloading -> Switched: held 2
                                          \\-> RollingBack -> RolledBack: held 1 (a gate, an abort)
                                          \\-> FallingBack -> FellBack: held 1 (memory, interference, a load)
    spec.version changed mid-switch: the switch rolls back (its version unloaded everywhere), then
    the next one begins.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rankops.api.rankingmodel import RankingModelSpec
from rankops.api.sharedserver import MANUAL_VALUE_MAX
from rankops.planner.two_versions import SideBySide
from rankops.rollout import inplace, inplace_phase
from rankops.rollout.record import ABORT_ANNOTATION, CONSUMED, RETRY_ANNOTATION, Event, iso, parse_time

IN_FLIGHT = (*inplace.FORWARD, *inplace.CLEANING)
MANUAL_ANNOTATIONS = (ABORT_ANNOTATION, RETRY_ANNOTATION)     # what a member's switch reads of its annotations
MAX_SAID = 1000             # a record's message and reason in status (one line per member)
MAX_LOAD_TIMEOUT_S = 1800   # a member's rollout.inPlace.loadTimeoutSeconds, at most, on a shared server
STOPPED = (inplace.ROLLED_BACK, inplace.FELL_BACK)


@dataclass(frozen=True)
class SwitchSeen:
    """What the shell read for one member's switch in flight: the member's entries of each pod's
    index, the gates' verdicts on their pod, the held version's P99 (worst pod, Triton's window)."""
    pods: tuple[inplace.PodIndex, ...]
    gates: Mapping[str, inplace.GateVerdict]
    stable_p99_ms: float | None
    others_p99_ms: Mapping[str, float] = field(default_factory=dict)   # the other members' worst P99, any pod


@dataclass(frozen=True)
class MemberSwitch:
    record: inplace.Record | None       # the member's status line's `switch`
    held: str                           # the version the server holds for it after this round
    actions: tuple[Any, ...] = ()       # inplace.Load / Unload / RunGate, for the shell
    events: tuple[Event, ...] = ()
    note: str = ""                      # for the member's message
    # gate -> (outcome, summary) of this switch's verdicts on its gate pod (the status line's gates);
    # None: the pods were not read this round (what the line holds stands)
    verdicts: Mapping[str, tuple[str, str]] | None = None
    # the manual values acted on, kept in the status line ("aborted", "retried": the annotation's value)
    acted: Mapping[str, str] = field(default_factory=dict)

    @property
    def in_flight(self) -> bool:
        return self.record is not None and self.record.phase in IN_FLIGHT

    @property
    def incoming(self) -> str | None:
        """The version loaded beside the held one while the switch needs its files and its loads."""
        return self.record.version if self.in_flight else None


def step(member: str, spec: RankingModelSpec, held: str, record: inplace.Record | None, seen: SwitchSeen | None,
         fit: tuple[bool | None, str], replicas: int, now: dt.datetime, busy: str | None = None,
         others_slo_ms: Mapping[str, float] | None = None, manual: Mapping[str, str] | None = None,
         acted: Mapping[str, str] | None = None, server_tolerance: int | None = None,
         wanted_replicas: int = 0) -> MemberSwitch:
    """One round of `member`'s switch: begin one when spec.version is not the held version, move one in
    flight on what the shell read (`seen`; None: nothing read this round, nothing moves), and say
    where it stands. `fit`: planner.shared_server.switch_fits for the member; `replicas`: the pods the
    server runs; `busy`: another member whose switch is in flight (one at a time: the cards have room
    for one member's version twice, as switch_fits counts it), so none begins; `others_slo_ms`: each other
    member's slo.p99LatencyMs. The other members share the card: while another member's P99 is over
    its SLO, no load starts, and a switch that has loaded in a pod is rolled back (the interference
    bound held for them, as maxStableP99Ms holds it for the member's own serving version).
    `manual`: the member's rankops.io/abort and rankops.io/retry values; `acted`: the values its status
    line says were acted on ("aborted", "retried"), each acting once; `server_tolerance`: the server's
    failureTolerance (_policy); `wanted_replicas`: the pods the server wants (a swap counts the pods
    missing from it against its tolerance). A switch that loaded nothing holds the server's one switch at a time
    for at most one load's deadline: paused, it is let go; waiting on another member's P99, it stops."""
    target = spec.version
    acted = dict(acted or {})
    aborting = _asked(manual, acted, ABORT_ANNOTATION, record.version if record is not None else None)
    if record is not None and record.phase in IN_FLIGHT:
        if seen is None:
            return MemberSwitch(record, held, note=f"switching to {record.version}: {record.message}", acted=acted)
        abort = None if record.version == target else (
            f"spec.version is back to {target}" if target == record.from_version else
            f"spec.version changed to {target}")
        if abort is None and record.artifact and record.phase not in inplace.CLEANING \
                and version_digest(spec, record.version) not in (None, record.artifact):
            abort = (f"spec.versions' {record.version} changed mid-switch (its modelUri, sha256 or format): what "
                     "was gated is not what a pod would fetch")
        if aborting is not None:     # acted on, or moot (the switch already rolls back): never again
            acted[record_key(ABORT_ANNOTATION)] = aborting
            if abort is None and record.phase not in inplace.CLEANING:
                abort = f"aborted by annotation {ABORT_ANNOTATION}={aborting}"
        policy = _policy(spec, replicas, server_tolerance, wanted_replicas if record.swap else 0)
        if spec.rollout.paused and abort is None and record.phase == inplace.LOADING and not record.touched:
            # paused before anything loaded: no switch is under way (it holds no room on the cards, nor
            # the server's one switch at a time); it begins again once the rollout is unpaused
            return MemberSwitch(None, held, note=f"spec.version {target!r} waits: rollout.paused (nothing of "
                                                 f"{record.version} was loaded)", acted=acted)
        slos = others_slo_ms or {}
        missing = {name: p99 for name, p99 in sorted(seen.others_p99_ms.items()) if name in slos and p99 > slos[name]}
        over = [f"{name}'s P99 {p99:.1f} ms > its slo.p99LatencyMs {slos[name]:g} ms" for name, p99 in missing.items()]
        # while it waits, no figure that moves each round (each round would rewrite the status)
        over_said = [f"{name}'s P99 over its slo.p99LatencyMs {slos[name]:g} ms" for name in missing]
        if over and abort is None and record.phase in (inplace.LOADING, inplace.GATING, inplace.PROMOTING):
            if not record.touched:      # nothing loaded yet: it waits, as long as one load may take
                waited = (now - parse_time(record.since)).total_seconds()
                if waited > policy.load_timeout_s:
                    stopped = replace(record, phase=inplace.FELL_BACK, since=iso(now), reason=(
                        f"nothing of {record.version} loaded in {waited:.0f} s (loadTimeout {policy.load_timeout_s:g} "
                        f"s): {'; '.join(over)}"), message=f"{'; '.join(over_said)}: {record.from_version} serves on")
                    return MemberSwitch(stopped, held, (), (Event("Warning", "InPlaceNotPossible",
                                                                  f"{member}: {stopped.reason}"),),
                                        _note(stopped, target, held, acted), acted=acted)
                waiting = replace(record, message=f"waiting to load {record.version}: {'; '.join(over_said)} (no load "
                                                  "starts while a member it shares the cards with misses its P99)")
                return MemberSwitch(waiting, held, note=_note(waiting, target, held), acted=acted)
            abort = f"{'; '.join(over)} while {record.version} loaded beside {record.from_version}"
        observed = inplace.Observed(now, seen.pods, seen.gates, seen.stable_p99_ms, abort)
        switch = inplace.step(record, observed, policy)
        if spec.rollout.paused and record.swap and record.load_pod and not abort:
            # a swap's pod taken out finishes its swap (or swaps back) before the pause holds: no pod is
            # left out of the member's endpoints for the pause; no other pod is taken meanwhile
            if switch.record.load_pod not in (None, record.load_pod):
                switch = inplace.Switch(replace(switch.record, load_pod=None, load_since=None, touched=record.touched),
                                        tuple(a for a in switch.actions if a.pod != switch.record.load_pod),
                                        switch.events)
        elif spec.rollout.paused and not abort and record.phase not in inplace.CLEANING \
                and switch.record.phase not in (*inplace.CLEANING, *inplace.CLEANING.values()):
            # rollout.paused: only what makes the switch safer moves (a rollback and its unloads)
            return MemberSwitch(record, held, note=f"switching to {record.version} is paused (rollout.paused) at "
                                                   f"{record.phase}: {record.message}", acted=acted)
        record = switch.record
        done = record.phase == inplace.SWITCHED
        actions = tuple(a for a in switch.actions if not isinstance(a, inplace.FallBack))
        events = tuple(Event(e.type, e.reason, f"{member}: {e.message}") for e in switch.events)
        verdicts = {gate: (v.outcome, f"{v.summary} (on pod {record.gate_pod})") for gate, v in seen.gates.items()
                    if v.pod_uid and v.pod_uid == record.gate_pod_uid}
        return MemberSwitch(record, record.version if done else held, actions, events,
                            _note(record, target, held if not done else record.version, acted), verdicts, acted)
    if target == held:
        # Nothing to switch; a stopped switch's record is cleared by setting spec.version back
        return MemberSwitch(None if record is not None and record.phase in STOPPED else record, held, acted=acted)
    retried: tuple[Event, ...] = ()
    if record is not None and record.version == target and record.phase in STOPPED:
        again = _asked(manual, acted, RETRY_ANNOTATION, target)
        if again is None:
            return MemberSwitch(record, held, note=_note(record, target, held, acted), acted=acted)
        acted[record_key(RETRY_ANNOTATION)] = again          # the stopped switch is let go: it begins anew when it can
        retried = (Event("Normal", "InPlaceSwitchRetried",
                         f"{member}: switching {target} in again, asked by {RETRY_ANNOTATION}={again}"),)
        record = None
    waits = lambda why: MemberSwitch(record, held, events=retried, note=f"spec.version {target!r} waits{why}",  # noqa: E731
                                     acted=acted)
    if spec.rollout.paused:
        return waits(": rollout.paused")
    if busy is not None:
        return waits(f": {busy}'s version switch is in flight on this server (one at a time)")
    fits, arithmetic = fit
    if fits is None:        # its needs not counted now (its spec, the server's pack): it waits, not stopped
        return waits(f" to switch in place: {arithmetic}")
    side = SideBySide(fits, arithmetic, () if fits else (f"the server's memory: {arithmetic}",))
    swap = False
    if fits is False and not _shareable(spec, held, target, SideBySide(True, arithmetic)).problems:
        # it does not fit beside the held version: swapped pod by pod when one pod may be taken out
        tolerance = _policy(spec, replicas, server_tolerance, wanted_replicas).failure_tolerance
        if tolerance >= 1 and replicas >= 2:
            side, swap = SideBySide(True, arithmetic), True
        else:
            side = SideBySide(False, arithmetic, (f"the server's memory: {arithmetic}; nor swapped pod by pod: that "
                                                  f"takes one of the member's pods out at a time, and needs "
                                                  f"failureTolerance >= 1 (the fewer of the member's and the "
                                                  f"server's: {tolerance}) and 2 pods running ({replicas})",))
    # A switch begins: a retry or an abort naming its version, set before it, is used up (a leftover
    # value neither aborts it nor begins it again once it stops: write <version>/<word> to ask again)
    for annotation in MANUAL_ANNOTATIONS:
        if (value := _asked(manual, acted, annotation, target)) is not None:
            acted[record_key(annotation)] = value
    started = inplace_phase.start(spec, target, held, now, _shareable(spec, held, target, side))
    record = replace(inplace.Record.from_status(started.record.to_wire()), artifact=version_digest(spec, target))
    if swap and record.phase == inplace.LOADING:
        record = replace(record, swap=True, message=f"swapping {held} for {target} pod by pod (the two do not fit "
                                                    f"on the card together: {arithmetic})")
    if record.phase == inplace.FELL_BACK:
        record = replace(record, message=f"{record.reason}; {held} serves on")
        events = (*retried, Event("Warning", "InPlaceNotPossible", f"{member}: {record.message}"))
        return MemberSwitch(record, held, (), events, _note(record, target, held, acted), acted=acted)
    return MemberSwitch(record, held, (), (*retried, *(Event(e.type, e.reason, f"{member}: {record.message if swap else e.message}")
                                                       for e in started.events)),
                        _note(record, target, held, acted), acted=acted)


def _asked(manual: Mapping[str, str] | None, acted: Mapping[str, str], annotation: str,
           version: str | None) -> str | None:
    """The annotation's value when it names `version` ("<version>" or "<version>/<anything>") and was
    not acted on yet; None otherwise (a leftover value, or one naming another version, does nothing)."""
    value = (manual or {}).get(annotation)
    if value is None or version is None or value.split("/", 1)[0] != version or len(value) > MANUAL_VALUE_MAX:
        return None
    return None if acted.get(record_key(annotation)) == value else value


def record_key(annotation: str) -> str:
    """Where a member's status line keeps the value of `annotation` acted on (the model's rollout
    record's names: aborted, retried)."""
    return CONSUMED[annotation]


def version_digest(spec: RankingModelSpec, version: str) -> str | None:
    """Digest of spec.versions' entry named `version` (None: not listed): what its pods fetch and load."""
    import hashlib
    import json

    entry = next((v for v in spec.versions if v.name == version), None)
    if entry is None:
        return None
    wire = json.dumps(entry.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(wire.encode()).hexdigest()[:32]


def _policy(spec: RankingModelSpec, replicas: int, server_tolerance: int | None,
            wanted: int = 0) -> inplace.Policy:
    """The in-place machine's policy for a member's switch: the pods a load may take out of serving are
    the fewer of the member's failureTolerance and the server's (a load that kills a pod takes every
    member in it), less the pods `wanted` that are not running (a swap's: each takes a pod out of the
    member's serving, and a pod missing already has), and one load's deadline is at most MAX_LOAD_TIMEOUT_S (the server's one switch at a
    time is not one tenant's to hold for a day)."""
    policy = inplace_phase.policy(spec, replicas)
    tolerance = policy.failure_tolerance if server_tolerance is None else min(policy.failure_tolerance,
                                                                              server_tolerance)
    tolerance = max(0, tolerance - max(0, wanted - replicas))
    return replace(policy, failure_tolerance=tolerance, load_timeout_s=min(policy.load_timeout_s, MAX_LOAD_TIMEOUT_S))


def _shareable(spec: RankingModelSpec, held: str, target: str, side: SideBySide) -> SideBySide:
    """`side` with every reason the two versions cannot be one Triton model's (formats, precisions,
    both Triton version 1), from the spec (planner.two_versions.cannot_share)."""
    from rankops.planner.two_versions import cannot_share

    by_name = {v.name: v for v in spec.versions}
    if held not in by_name or target not in by_name:
        missing = held if held not in by_name else target
        return SideBySide(side.fits, side.arithmetic, (*side.problems, f"{missing} is not in spec.versions"))
    return SideBySide(side.fits, side.arithmetic, (*side.problems, *cannot_share(
        inplace_phase.version_on_gpu(by_name[held]), inplace_phase.version_on_gpu(by_name[target]))))


def _note(record: inplace.Record, target: str, held: str, acted: Mapping[str, str] | None = None) -> str:
    """What the member's message says of its switch (`acted`: the manual values used up, so the retry
    it suggests is one that acts)."""
    if record.phase in IN_FLIGHT:
        return f"switching to {record.version} in place ({record.phase}): {record.message}"
    if record.phase in STOPPED and record.version == target:
        retry = target if _asked({RETRY_ANNOTATION: target}, acted or {}, RETRY_ANNOTATION, target) else \
            f"{target}/again" if (acted or {}).get(record_key(RETRY_ANNOTATION)) != f"{target}/again" else \
            f"{target}/<a new word>"
        return (f"spec.version {target!r} was not switched in ({record.phase}: {record.reason or record.message}); "
                f"{held} serves: a shared server's member switches only in place. Set spec.version back to "
                f"{held!r} (which clears this) and then to a version that can switch, ask again with "
                f"{RETRY_ANNOTATION}={retry}, make room on the server, or serve the model on pods of its own "
                "(no spec.server)")
    return ""


def record_of(line: Any) -> inplace.Record | None:
    """The switch record of a member's status line (api.sharedserver.MemberStatus), None without one."""
    switch = getattr(line, "switch", None)
    return inplace.Record.from_status(switch.to_wire()) if switch is not None else None


def gates_of(switch: MemberSwitch | None, line: Any, now: str) -> list[Any]:
    """The status line's gates (api.rankingmodel.GateResult): this round's verdicts on the switch's gate
    pod, else those the line had for the same version (a verdict is kept, not read again; a restart
    gates again, its new verdicts replacing these); none once no switch is recorded."""
    from rankops.api.rankingmodel import GateResult

    if switch is None or switch.record is None:
        return []
    kept = [g for g in getattr(line, "gates", None) or [] if g.version == switch.record.version]
    if switch.verdicts is not None and switch.record.phase == inplace.GATING:
        # gating now, on what the machine holds: a verdict it does not hold (a new process gates again) goes
        kept = [g for g in kept if g.gate in switch.verdicts]
    known = {g.gate: g for g in kept}
    for gate, (outcome, summary) in sorted((switch.verdicts or {}).items()):
        said = summary if len(summary) <= MAX_SAID else summary[:MAX_SAID - 1] + "…"
        was = known.get(gate)
        if was is None or (was.outcome, was.summary) != (outcome, said):
            known[gate] = GateResult(gate=gate, version=switch.record.version, outcome=outcome, reason="InPlace",
                                     summary=said, finished_at=now)
    return [known[g] for g in sorted(known)][:4]


def acted_of(switch: MemberSwitch | None, line: Any) -> dict[str, str | None]:
    """The status line's manual values acted on (aborted, retried): this round's, else those the line had."""
    kept = {record_key(a): getattr(line, record_key(a), None) for a in MANUAL_ANNOTATIONS}
    return {**kept, **(switch.acted if switch is not None else {})}


def acted_in(line: Any) -> dict[str, str]:
    """The manual values a member's status line says were acted on (MemberView.acted)."""
    return {key: value for key, value in acted_of(None, line).items() if value is not None}


def status_of(switch: MemberSwitch) -> Any:
    """The record as the member's status line keeps it (api.rankingmodel.InPlaceSwitchStatus)."""
    from rankops.api.rankingmodel import InPlaceSwitchStatus

    if switch.record is None:
        return None
    wire = switch.record.to_status()
    for key in ("message", "reason"):          # gate summaries and Triton's words: bounded like a member's message
        if len(wire.get(key) or "") > MAX_SAID:
            wire[key] = wire[key][:MAX_SAID - 1] + "…"
    return InPlaceSwitchStatus.model_validate(wire)
