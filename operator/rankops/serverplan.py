"""A shared tritonserver's plan (issue 42): which members it holds, the objects that serve them,
what each pod must load and unload, and each member's state, as one pure function (plan_server).

The per pod part is pure and level-based: from the members the server should hold (model -> Triton version) and the
pod's repository index (triton/repository.py, read from the pod and checked), the loads and
unloads that bring the pod there. Running it again on the converged index asks for nothing.

A member's state in a pod:
- Serving: its wanted version is READY (an older version may still be there during a reload).
- Loading: its wanted version is LOADING (or UNLOADING: a transition, not loaded again meanwhile).
- Failed: Triton tried and refused it (UNAVAILABLE with a reason other than "unloaded"): its
  artifact missing or corrupt, its config refused, the device out of memory. The other members are
  untouched: Triton loads and fails models one by one. A failed member is not loaded again on every
  round (`retry_failed`): its spec or artifact changes, or the caller's backoff says when.
- Absent: the pod has never loaded it, or it was unloaded (Failed instead when its last load was refused).
Every model the pod holds that is not a member is unloaded: a member removed, or a model nobody named;
a member serving its version beside another READY one is loaded again, which drops the other.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankops import server_autoscale
from rankops.api.phases import DegradedReason
from rankops.api.rankingmodel import RankingModelSpec, RolloutStrategy
from rankops.api.sharedserver import SharedServerSpec
from rankops.render.policy import TenantPolicy
from rankops.render.tritonconfig import ServingShape, triton_version
from rankops.triton.repository import IndexEntry

SERVING, LOADING, FAILED, ABSENT = "Serving", "Loading", "Failed", "Absent"
# The pod refused its load only because its files have not arrived (the stager still fetching):
# loaded again each round until they come, or until the shell's wait is over (then FAILED).
STAGING = "Staging"
UNLOADED = "unloaded"           # the reason Triton gives a version it unloaded on request
# Triton's refusals of a load whose files are not there yet (the pod's stager still fetching
# them): a wait, not a failure; the shell bounds the wait (a member never staged is Failed with the
# last refusal). "failed to poll" is also Triton's word for a config override it rejects, so it
# counts only while the pod's index lists no such model (its directory is not there).
NO_MODEL_DIRECTORY = "failed to poll from model repository"
NO_VERSION_DIRECTORY = "at least one version must be available under the version policy"
HELD_STATES = ("READY", "LOADING", "UNLOADING")     # a version a pod's index holds


@dataclass(frozen=True)
class MemberState:
    model: str
    state: str                  # SERVING | LOADING | STAGING | FAILED | ABSENT
    reason: str = ""            # Triton's, when FAILED


@dataclass(frozen=True)
class PodActions:
    load: tuple[str, ...] = ()      # members to load (or reload at their wanted version or config), by name
    unload: tuple[str, ...] = ()    # models the pod holds that are not members

    @property
    def nothing(self) -> bool:
        return not self.load and not self.unload


def not_staged(load_error: str, model: str, index: Iterable[IndexEntry]) -> bool:
    """The load of `model` was refused only because its files have not arrived yet: its version
    directory is missing, or its whole directory (the pod's `index` does not list it)."""
    if NO_VERSION_DIRECTORY in load_error:
        return True
    return NO_MODEL_DIRECTORY in load_error and not any(e.name == model for e in index)


def member_state(model: str, version: int, index: Iterable[IndexEntry], load_error: str = "",
                 staging_over: bool = False) -> MemberState:
    """`load_error`: the pod's answer to the last load of this version, when it refused it. Triton lists
    no version for a model whose version directory is missing (the artifact never came), so the
    refusal is the only word of that failure: STAGING while the shell still waits for the files,
    FAILED once `staging_over`."""
    entries = list(index)
    entry = next((e for e in entries if e.name == model and e.version == version), None)
    if entry is not None and entry.state == "READY":
        return MemberState(model, SERVING)
    if entry is not None and entry.state in ("LOADING", "UNLOADING"):     # in transition: not loaded again
        return MemberState(model, LOADING, entry.state.lower())
    if load_error and not_staged(load_error, model, entries) and not staging_over:
        return MemberState(model, STAGING, load_error)
    if load_error:
        return MemberState(model, FAILED, load_error)
    if entry is not None and entry.reason and entry.reason != UNLOADED:
        return MemberState(model, FAILED, entry.reason)
    return MemberState(model, ABSENT)


def pod_actions(members: Mapping[str, int], index: Iterable[IndexEntry], load_errors: Mapping[str, str] | None = None,
                retry_failed: bool | Collection[str] = False, staging_over: Collection[str] = (),
                configs: Mapping[str, str] | None = None, loaded: Mapping[str, str] | None = None,
                refused: Mapping[str, str] | None = None, switching: Mapping[str, int] | None = None) -> PodActions:
    """The loads and unloads that make the pod hold exactly `members` (model -> Triton version);
    `load_errors`: member -> the pod's refusal of its last load; `retry_failed`: every failed member,
    or those named (whose backoff is over), is loaded again; `configs` / `loaded` / `refused`:
    member -> the digest of the config it should have / was last loaded with on this pod / whose
    load this pod refused (the shell's record). A member serving an older config is loaded again
    (Triton swaps it in once loaded); a refused load is sent again once its backoff is over, or at
    once for another config (the tenant fixed it). A member with no record is not reloaded.
    `switching`: member -> the Triton version its switch loads beside the wanted one (server_switch.py):
    its loads are the switch's wherever the pod holds either version; only a pod holding neither gets
    the wanted one here."""
    entries, errors = list(index), load_errors or {}
    wanted_configs, had, refusals = configs or {}, loaded or {}, refused or {}
    load = []
    for model, version in sorted(members.items()):
        incoming = (switching or {}).get(model)
        if incoming is not None and any(e.name == model and e.version in (version, incoming) and e.state in HELD_STATES
                                        for e in entries):
            continue
        state = member_state(model, version, entries, errors.get(model, ""), model in staging_over).state
        stale = any(e.name == model and e.version != version and e.state == "READY" for e in entries)
        edited = model in had and model in wanted_configs and had[model] != wanted_configs[model]
        retry = retry_failed if isinstance(retry_failed, bool) else model in retry_failed
        new_config = model in refusals and model in wanted_configs and refusals[model] != wanted_configs[model]
        again = retry or new_config or model not in errors       # a refused reload waits out its backoff
        if state in (ABSENT, STAGING) or (state == FAILED and (retry or new_config)) or \
                (state == SERVING and (stale or edited) and again):
            # a load's version policy names the one version: Triton drops the others as it loads
            load.append(model)
    held = {e.name for e in entries if e.state in ("READY", "LOADING")}
    return PodActions(tuple(load), tuple(sorted(held - set(members))))


# --- the server's plan ---------------------------------------------------------------------------

PENDING, REFUSED = "Pending", "Refused"
# Why a member is where it is (its status' reason).
REASON_SERVES = "Serving"
REASON_LOADING = "Loading"
REASON_NO_READY_POD = "NoReadyPod"
# The member's own RankingModel says these as its Degraded reason (model_status.member_status).
REASON_LOAD_FAILED = DegradedReason.MEMBER_LOAD_FAILED.value
REASON_SERVER_FULL = DegradedReason.SERVER_FULL.value
REASON_NOT_SHAREABLE = DegradedReason.NOT_SHAREABLE.value
REASON_CANNOT_PACK = DegradedReason.CANNOT_PACK.value


@dataclass(frozen=True)
class MemberView:
    """A RankingModel naming the server, as the plan reads it."""
    name: str
    spec: RankingModelSpec
    # The version the server holds for it (the member's status), None before its first admission:
    # a member keeps this version until its switch is gated; a new spec.version is said, not served.
    held_version: str | None = None
    shape: ServingShape | None = None      # its resolved batching (the caller's cache); None: resolved here
    # Digest of the config its pods serve (its status line's configDigest): a held member whose
    # config changed since is placed after those whose did not, so an edit that grows it cannot
    # push out a member that did not change.
    served_digest: str | None = None
    switch: Any = None          # rollout.inplace.Record: its last version switch (its status line's)
    # its rankops.io/abort and rankops.io/retry values (server_switch.MANUAL_ANNOTATIONS), and the values
    # its status line says were acted on ("aborted", "retried"): each acts on its switch once
    manual: Mapping[str, str] = field(default_factory=dict)
    acted: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MemberRead:
    """A RankingModel naming the server, as the shell found it."""
    name: str
    uid: str
    spec: RankingModelSpec | None       # None: its spec does not validate now
    error: str = ""                     # why it does not
    manual: Mapping[str, str] = field(default_factory=dict)    # its manual controls' values (MemberView.manual)


def member_views(found: Sequence[MemberRead], held: Mapping[str, str],
                 last_valid: Mapping[str, RankingModelSpec], served: Mapping[str, str] | None = None,
                 switches: Mapping[str, Any] | None = None,
                 acted: Mapping[str, Mapping[str, str]] | None = None) -> tuple[list[MemberView], list[MemberRead]]:
    """The plan's members (`found` in arrival order; `held`: member -> the version the server holds,
    from its status; `last_valid`: uid -> the spec each last validated with; `served`: member -> the
    digest of the config its pods serve, from the status; `switches`: member -> its version switch's
    record, from the status; `acted`: member -> the manual values its status line says were acted on),
    and the held members to freeze. A member
    whose spec does not validate is left out, its own status says why, unless the server holds it:
    then it serves as it was, at its last valid spec; with none known (this process is new) it is
    frozen (render.shared_server.FrozenMember): a bad edit never takes it down, nor the others."""
    views, frozen = [], []
    for member in found:
        spec = member.spec
        if spec is None:
            if member.name not in held:
                continue
            spec = last_valid.get(member.uid)
            if spec is None:
                frozen.append(member)
                continue
        views.append(MemberView(member.name, spec, held.get(member.name),
                                served_digest=(served or {}).get(member.name) if member.name in held else None,
                                switch=(switches or {}).get(member.name) if member.name in held else None,
                                manual=member.manual, acted=(acted or {}).get(member.name, {})))
    return views, frozen


# While a member loads in a ready pod, or a pod's index was not read: the next look (seconds).
POLL_S = 2.0
# While a newcomer is refused for a Service name another holds (say a deleted model's, which the
# garbage collector is about to remove): no event of the server's says when it goes.
NAME_TAKEN_RECHECK_S = 30.0


def next_look_s(plan: ServerPlan, unread: bool, due_s: float | None) -> float | None:
    """When the server's reconcile runs again without an event (None: on events and the resync only).
    Loading in a ready pod, a pod not read, or a member's version switch in flight is looked at again soon; a failed load when its
    backoff ends (`due_s`, the pod shell's); a server that autoscales at its next reading; the rest
    comes by events: a member or pod changing, a pod getting Ready, a load answered."""
    moving = unread or any(m.state == LOADING and m.reason != REASON_NO_READY_POD for m in plan.members) \
        or any(switch.in_flight for switch in plan.switches.values())   # its loads and gates answer no event
    looks = [t for t in (POLL_S if moving else None, due_s, NAME_TAKEN_RECHECK_S if plan.name_taken else None,
                         server_autoscale.READ_EVERY_S if plan.scaling is not None else None)
             if t is not None]
    return min(looks) if looks else None


@dataclass(frozen=True)
class PodView:
    """One pod of the server, as read: its readiness, address and repository index."""
    name: str
    ready: bool
    ip: str = ""
    node: str | None = None
    index: tuple[IndexEntry, ...] | None = None    # None: not read (index_error says why)
    index_error: str = ""
    load_errors: Mapping[str, str] = field(default_factory=dict)   # member -> its last load's refusal here
    retry: frozenset[str] = frozenset()            # failed members whose backoff is over on this pod
    staging_over: frozenset[str] = frozenset()     # members whose files the shell waited for long enough
    loaded: Mapping[str, str] = field(default_factory=dict)        # member -> digest of the config it loaded
    refused: Mapping[str, str] = field(default_factory=dict)       # member -> digest of the config refused here
    last_index: tuple[IndexEntry, ...] | None = None   # index None: the last one read while Ready (for endpoints only)
    terminating: bool = False                      # deletionTimestamp set: draining
    uid: str = ""


@dataclass(frozen=True)
class MemberOutcome:
    name: str
    state: str              # SERVING | LOADING | FAILED | PENDING | REFUSED
    reason: str             # REASON_*
    message: str
    version: str | None     # the version the server holds for it (None: not held)
    port: int | None = None


@dataclass(frozen=True)
class ServerPlan:
    objects: tuple[dict[str, Any], ...]             # what to apply: the server's objects and endpoints
    actions: Mapping[str, PodActions]               # pod -> its loads and unloads
    configs: Mapping[str, tuple[int, str]]          # held member -> (Triton version, config.pbtxt) to load
    members: tuple[MemberOutcome, ...]              # in the order given
    ports: Mapping[str, int]
    replicas: int
    admission: Any                                  # planner.shared_server.Admission (None: nothing to admit)
    name_taken: bool = False                        # a newcomer was refused for a Service name another holds
    # Held members whose planned config is not what their pods serve, whatever they answer: over the
    # server's room (their new config goes nowhere) or refused by a pod (status keeps the old digest).
    unconfirmed: frozenset[str] = frozenset()
    scaling: Any = None                             # server_autoscale.ServerScaling (None: not autoscaled)
    served_sha256: Mapping[str, str] = field(default_factory=dict)   # member -> render.shared_server.served_sha256
    switches: Mapping[str, Any] = field(default_factory=dict)        # held member -> server_switch.MemberSwitch
    # member switching -> its config.pbtxt at the incoming version: the base of its switch's loads
    switch_configs: Mapping[str, str] = field(default_factory=dict)
    # (pod, member) -> the digest of the config a switch that ended this round left it loaded with
    adopted: Mapping[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadSeen:
    """What server_autoscale.step needs from the shell: status.autoscaling as read, this round's
    reading of the pods (None: not read now), the pods asked and not read, the ready pods not asked."""
    now: Any                                        # datetime.datetime
    recorded: Any = None                            # api.sharedserver.ServerAutoscalingStatus
    reading: Mapping[str, Any] | None = None
    previous: Mapping[str, Any] | None = None       # the reading before it (the operator's memory)
    problems: tuple[str, ...] = ()
    not_asked: int = 0


def plan_server(server: str, namespace: str, spec: SharedServerSpec, members: Sequence[MemberView],
                pods: Sequence[PodView], previous_ports: Mapping[str, int], placement: dict[str, Any],
                policy: TenantPolicy = TenantPolicy(), previous_staged: Sequence[Any] = (),
                taken: Mapping[str, str] | None = None, frozen: Sequence[Any] = (),
                replicas_now: int = 0, load: LoadSeen | None = None,
                previous_configs: Mapping[str, str] | None = None, switch_seen: Mapping[str, Any] | None = None,
                now: Any = None) -> ServerPlan:
    """Everything one reconcile of a shared server does. `members`: the RankingModels naming it, in
    arrival order; `pods`: its pods as read; `previous_ports` and `previous_staged`: its routes and
    members.json as last written (read back from its ConfigMap); `taken`: the namespace's Service
    names the server does not own -> who holds each (a newcomer answers at its own name, so one
    named after another's Service is refused: writing it would fail every member's writes);
    `frozen`: held members whose spec cannot be read (render.shared_server.FrozenMember): never
    unloaded, loaded anew only with the config their pods serve (FrozenMember.config, checked by the
    caller), their Service, port and files kept, their room uncounted (so no
    newcomer is admitted and the replicas do not fall below `replicas_now`, the server's status');
    `load`: the pods' load as read, for spec.autoscaling (server_autoscale.step sets the replicas);
    `previous_configs`: configs.json as last written (each member's config as its pods serve it);
    `switch_seen`: member -> server_switch.SwitchSeen, what the shell read for each switch in flight
    (a held member whose spec.version is not the version held switches in place: server_switch.step).

    A newcomer is held when it can join (render.shared_server.member_problems) and the admission
    (planner.shared_server.admit) places it. A member held before stays held whatever its spec
    now says (never evicted): at the version it holds, its problems said in its message, its room
    counted; while its needs cannot be counted, no newcomer is admitted. Held members are in the
    ConfigMap (staged, routed), get their Service and EndpointSlice, and are loaded in every ready
    pod; a model a pod holds that is not held is unloaded there, and its files stay listed
    (`lingering`) until no pod may still hold it."""
    from rankops.planner import inputs_from_spec
    from rankops.planner.pack import ModelToPack
    from rankops.planner.shared_server import admit, server_card
    from rankops.render.desired import RenderError, resolve_shape
    from rankops.render.serving import config_hash
    from rankops import server_switch
    from rankops.planner.shared_server import switch_fits
    from rankops.render.shared_server import (MAX_MEMBERS, PodEndpoint, ServerMember, assign_ports, member_config,
                                              member_endpoints, member_problems, served_sha256, server_objects,
                                              staged_member)

    names = [m.name for m in members] + [f.name for f in frozen]
    if len(set(names)) != len(names):
        raise ValueError(f"a member is listed twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
    outcomes: dict[str, MemberOutcome] = {}
    notes: dict[str, list[str]] = {m.name: [] for m in members}
    shapes: dict[str, ServingShape] = {}
    to_pack, edited, newcomers, uncounted = [], [], [], []
    # Seats: a server holds at most MAX_MEMBERS (one port each). Held members keep theirs; a newcomer
    # that can be counted takes one, in arrival order, and once none is left the rest wait before
    # any work is spent on them (any tenant may name the server, as often as it likes).
    seats = MAX_MEMBERS - sum(1 for m in members if m.held_version) - len(frozen)
    name_taken = False
    unappliable = set()
    for m in members:
        problems = member_problems(spec, ServerMember(m.name, m.spec, m.held_version or m.spec.version),
                                   joining=not m.held_version)
        if not m.held_version and m.name in (taken or {}):
            problems.append(f"{m.name}: the Service {m.name} it would answer at is {taken[m.name]}'s: a member "
                            "answers at its own name; rename the RankingModel (looked at again while it waits: "
                            "a Service being deleted goes)")
            name_taken = True
        if problems and not m.held_version:
            outcomes[m.name] = MemberOutcome(m.name, REFUSED, REASON_NOT_SHAREABLE, "; ".join(problems), None)
            continue
        if not m.held_version and seats <= 0:
            outcomes[m.name] = MemberOutcome(m.name, PENDING, REASON_SERVER_FULL, (
                f"{m.name} waits: a server holds at most {MAX_MEMBERS} members, and {MAX_MEMBERS} are held "
                "or ahead of it; it is considered when one leaves (or serve it on another SharedServer)"), None)
            continue
        notes[m.name] += [f"its spec cannot be applied, so it serves as it was: {p}" for p in problems]
        if m.held_version and m.spec.autoscaling.enabled:
            notes[m.name].append("spec.autoscaling.enabled has no effect on a shared server (its SharedServer's "
                                 "spec.autoscaling scales the pods): set it to false")
        if problems:
            unappliable.add(m.name)
        try:
            shapes[m.name] = m.shape or resolve_shape(m.spec).shape
            counted = ModelToPack(m.name, inputs_from_spec(m.spec, gpu_memory_mib=spec.gpu_memory_mib))
        except (RenderError, ValueError) as exc:   # PlanError is a ValueError
            if not m.held_version:
                outcomes[m.name] = MemberOutcome(m.name, REFUSED, REASON_CANNOT_PACK, f"{m.name}: {exc}", None)
                continue
            notes[m.name].append(f"its needs cannot be counted now ({exc})")
            uncounted.append(m.name)
            continue
        if not m.held_version:
            seats -= 1
            newcomers.append(counted)
        elif m.served_digest is not None and _config_digest(m, namespace, shapes[m.name]) != m.served_digest:
            edited.append(counted)
        else:
            to_pack.append(counted)
    # Placed in this order: held members as they serve, held members whose config changed (an edit that
    # grows one makes it the one that no longer fits, never another), newcomers in arrival order.
    to_pack = [*to_pack, *edited, *newcomers]
    held_before = {m.name for m in members if m.held_version}
    card = server_card(spec)
    # A switch in flight holds one member's version twice on its cards (switch_fits): a newcomer waits for it
    switching_now = [m.name for m in members if m.held_version and _in_flight(m.switch)] + \
        [f.name for f in frozen if _in_flight(f.switch)]
    if uncounted or frozen or switching_now:      # room is taken, by how much is not counted: newcomers wait
        blocked = [t for t in to_pack if t.name not in held_before]
        to_pack = [t for t in to_pack if t.name in held_before]
        unknown = [*uncounted, *(f.name for f in frozen)]
        why = "; ".join([*([f"{', '.join(unknown)} already serve(s) here with needs this plan cannot count now (see "
                            "their own reason)"] if unknown else []),
                         *([f"{', '.join(switching_now)}'s version switch holds room on the cards until it ends"]
                           if switching_now else [])])
        for t in blocked:
            outcomes[t.name] = MemberOutcome(t.name, PENDING, REASON_SERVER_FULL, f"{t.name} waits: {why}", None)
    admission = admit(to_pack, card, held_before) if to_pack else None
    kept: list[str] = []
    if admission is not None:
        for name, why in admission.refused:
            if name in held_before:
                notes[name].append(f"its needs cannot be counted now ({why})")
                kept.append(name)
            else:
                outcomes[name] = MemberOutcome(name, REFUSED, REASON_CANNOT_PACK, why, None)
        for name, why in admission.waiting:
            outcomes[name] = MemberOutcome(name, PENDING, REASON_SERVER_FULL, why, None)
        for name, why in admission.over:
            notes[name].append(f"its spec now needs more than the server has left ({why}); it keeps its place "
                               "and its running pods keep the config they loaded")
    placed = [*(admission.admitted if admission else ()), *(n for n, _ in (admission.over if admission else ())),
              *kept, *uncounted]
    by_name = {m.name: m for m in members}
    held = [by_name[n] for n in placed]
    versions = {m.name: m.held_version or m.spec.version for m in held}
    switches: dict[str, Any] = {}
    now = now or (load.now if load is not None else None) or dt.datetime.now(dt.timezone.utc)
    busy = switching_now[0] if switching_now else None
    # the switch in flight steps first; then, one at a time, a member whose spec.version moved may begin
    for m in sorted(held, key=lambda m: not _in_flight(m.switch)):
        if m.held_version and (m.spec.version != m.held_version or m.switch is not None):
            counted = m.name in (admission.admitted if admission else ()) and m.name not in unappliable
            fit = switch_fits(admission, card, m.name) if counted else \
                (None, f"{m.name}'s spec cannot be counted or applied now")
            switches[m.name] = server_switch.step(m.name, m.spec, m.held_version, m.switch,
                                                  (switch_seen or {}).get(m.name), fit,
                                                  # the pods that run now (an address, not going): a pod not
                                                  # started yet loads the version held when it starts, so a
                                                  # promotion waits for no pod that cannot be scheduled
                                                  max(1, sum(1 for p in pods if p.ip and not p.terminating)), now,
                                                  busy=busy if busy != m.name else None,
                                                  others_slo_ms={o.name: o.spec.slo.p99_latency_ms for o in held
                                                                 if o.name != m.name and o.spec.slo},
                                                  manual=m.manual, acted=m.acted,
                                                  server_tolerance=spec.failure_tolerance,
                                                  # the pods wanted: one missing already spends a swap's tolerance
                                                  wanted_replicas=max(replicas_now,
                                                                      admission.cards if admission else 0))
            if switches[m.name].in_flight:
                busy = busy or m.name
            versions[m.name] = switches[m.name].held
            if switches[m.name].note:
                notes[m.name].append(switches[m.name].note)
            if switches[m.name].record is not None and "strategy" in m.spec.rollout.model_fields_set \
                    and m.spec.rollout.strategy is RolloutStrategy.pods:
                # asked for, not given: said, not silently ignored
                notes[m.name].append("rollout.strategy pods is not used on a shared server: a member has no pods of "
                                     "its own, so its versions switch inside the server's pods (in place, or "
                                     "swapped pod by pod); serve the model on its own pods (no spec.server) for a "
                                     "canary on pods")
    for f in frozen:    # its spec unreadable: its switch is held where it is (nothing moves), its record kept
        if _in_flight(f.switch):
            switches[f.name] = server_switch.MemberSwitch(f.switch, f.version)
    incoming = {name: sw.incoming for name, sw in switches.items() if sw.incoming}
    # A swap's pod taken (server_switch.py): the member is the switch's there, out of its endpoints
    taken = {name: sw.record.load_pod for name, sw in switches.items()
             if sw.incoming and sw.record.swap and sw.record.load_pod}
    ports = assign_ports([*(m.name for m in held), *(f.name for f in frozen)], previous_ports)
    configs: dict[str, tuple[int, str]] = {}
    for m in held:
        try:
            configs[m.name] = member_config(m.name, namespace, m.spec, versions[m.name], shapes[m.name])
        except (KeyError, ValueError) as exc:
            notes[m.name].append(f"no config to load it with on a new pod ({exc})")
    # The base of a switch's loads (their version policy is the switch's): the config at the incoming
    # version, else the held one's (a rollback must unload whatever the spec now lists)
    switch_configs = {}
    for name in incoming:
        if name not in by_name:
            continue
        try:
            switch_configs[name] = member_config(name, namespace, by_name[name].spec, incoming[name], shapes[name])[1]
        except (KeyError, ValueError):
            if name in configs:
                switch_configs[name] = configs[name][1]
    wanted = {name: version for name, (version, _) in configs.items()}
    for m in held:      # no config (its spec no longer lists the version held): kept where loaded, never unloaded
        if m.name not in wanted:
            wanted[m.name] = triton_version(versions[m.name])
    rendered = set(configs)
    for f in frozen:    # likewise; loaded where it is not only with the config its pods serve (configs.json)
        wanted[f.name] = triton_version(f.version)
        if f.config:
            configs[f.name] = (wanted[f.name], f.config)
    over = {n for n, _ in (admission.over if admission else ())}     # keep what they loaded
    digests = {name: config_hash(text) for name, (_, text) in configs.items() if name not in over}

    # A switch that ended this round left its pods with the new version, loaded with the config now
    # wanted (its last loads'): the shell records that (ShellPods.adopt), so no pod loads it again
    adopted = {(pod.name, name): digests[name] for name, sw in switches.items()
               if name in digests and name in by_name and sw.record is not None
               and sw.record.phase == server_switch.inplace.SWITCHED and _in_flight(by_name[name].switch)
               for pod in pods if pod.index is not None
               and member_state(name, triton_version(sw.held), pod.index).state == SERVING}
    actions: dict[str, PodActions] = {}
    per_pod: dict[str, dict[str, MemberState]] = {}
    unconfirmed = set(over) | {name for pod in pods for name, refused in pod.refused.items()
                               if name in configs and refused == config_hash(configs[name][1])}
    for pod in pods:
        if not pod.ready or pod.index is None or pod.terminating:
            continue
        loaded = {**pod.loaded, **{name: d for (at, name), d in adopted.items() if at == pod.name}}
        asked = pod_actions(wanted, pod.index, pod.load_errors, pod.retry, pod.staging_over, digests, loaded,
                            pod.refused, {n: triton_version(v) for n, v in incoming.items()})
        # A member over the server's room keeps what its pods loaded: its new config goes nowhere,
        # not even to a new pod (it would overfill the card).
        actions[pod.name] = PodActions(tuple(n for n in asked.load if n in configs and n not in over
                                             and taken.get(n) != pod.name), asked.unload)
        per_pod[pod.name] = {name: member_state(name, version, pod.index, pod.load_errors.get(name, ""),
                                                name in pod.staging_over)
                             for name, version in wanted.items()}
        for name, version in incoming.items():     # either version READY serves the member's requests
            if per_pod[pod.name][name].state != SERVING and \
                    member_state(name, triton_version(version), pod.index).state == SERVING:
                per_pod[pod.name][name] = MemberState(name, SERVING)
        for name in [n for n, at in taken.items() if at == pod.name]:
            per_pod[pod.name].pop(name, None)     # drained for its swap: no endpoint, nor judged there meanwhile
    # A pod that holds neither version (new) loads the held one first; the switch's load waits for it,
    # and for a load of the held version under way (the two loads would race: the last one wins)
    for name in incoming:
        fresh = {pod for pod, a in actions.items() if name in a.load}
        fresh |= {pod.name for pod in pods if any(e.name == name and e.version == wanted[name] and
                                                  e.state == server_switch.inplace.LOADING_STATE
                                                  for e in pod.index or ())}
        if fresh and name in switches:
            sw = switches[name]
            switches[name] = dataclasses.replace(sw, actions=tuple(
                a for a in sw.actions if not (isinstance(a, server_switch.inplace.Load) and a.pod in fresh)))
    held_names = {m.name for m in held} | {f.name for f in frozen}
    # A held member whose spec no longer lists its version keeps its files as last staged; members
    # that left keep theirs while a pod may still hold them, at most as many as the seats (the
    # stager's file has room for that many beside the held ones; one dropped early only loses its
    # files, a model Triton loaded stays loaded).
    lingering = [s for s in previous_staged if s.model in held_names and s.model not in rendered]
    lingering += [s for s in previous_staged if s.model not in held_names and _may_hold(s.model, pods)][:MAX_MEMBERS]
    # one card a pod; none once nothing is held or may still be loaded
    replicas = max(1, admission.cards if admission is not None else 0) if held or lingering or frozen else 0
    scaling = None
    if spec.autoscaling.enabled and load is not None and admission is not None:
        # an over member serves its old config: its new needs stand in for it (the safe side), and it
        # still holds a scale-down (uncounted below)
        over_names = {n for n, _ in admission.over}
        counted = [t for t in to_pack if t.name in admission.admitted or t.name in over_names]
        scaling = server_autoscale.step(
            spec, load.recorded, load.reading, counted, replicas_now or replicas, load.now, previous=load.previous,
            problems=load.problems, uncounted=[*(n for n, _ in admission.over), *kept, *uncounted,
                                               *(f.name for f in frozen)], not_asked=load.not_asked,
            # a bound below the member's own batching delay asks for less than its batcher waits by design
            max_queue_ms={m.name: max(m.spec.autoscaling.max_avg_queue_ms,
                                      shapes[m.name].max_queue_delay_microseconds / 1000.0)
                          for m in held if m.spec.autoscaling.max_avg_queue_ms is not None and m.name in shapes})
        replicas = scaling.replicas
    elif spec.autoscaling.enabled and load is not None and replicas:
        # members are held and none can be counted: their load cannot be sized, the pods they run are kept
        replicas = max(replicas, min(replicas_now, spec.max_replicas))
        unsized = [*uncounted, *(f.name for f in frozen)]
        shedding = server_autoscale.shed_over(load.previous, load.reading, unsized, load.not_asked)
        scaling = server_autoscale.hold(spec, load.recorded, replicas, "no held member's needs can be counted now "
                                        f"({', '.join(unsized) or 'none held'})", shedding)
        replicas = scaling.replicas
    if frozen:          # its needs are unknown: the cards it has are kept
        replicas = max(replicas, min(replicas_now, spec.max_replicas))
    routed: list[dict[str, Any]] = []        # each member's EndpointSlice
    for m in held:
        endpoints = [PodEndpoint(p.name, p.ip, p.node, _serves_on(m.name, wanted.get(m.name), p, per_pod)
                                 and taken.get(m.name) != p.name, p.terminating) for p in pods]
        routed.append(member_endpoints(m.name, server, namespace, ports[m.name], endpoints))
        refused_edits = [f"{p.name}: {p.load_errors[m.name]}" for p in pods if p.name in per_pod
                         and per_pod[p.name].get(m.name, MemberState(m.name, ABSENT)).state == SERVING
                         and p.load_errors.get(m.name)]
        if refused_edits:
            notes[m.name].append("its new config was refused (it serves the config it loaded before) on "
                                 + "; ".join(refused_edits))
        outcomes[m.name] = _held_outcome(m, versions[m.name], ports[m.name], per_pod, pods, notes[m.name],
                                         loads_anew=m.name in configs and m.name not in over)
    for f in frozen:
        endpoints = [PodEndpoint(p.name, p.ip, p.node, _serves_on(f.name, wanted[f.name], p, per_pod)
                                 and taken.get(f.name) != p.name, p.terminating) for p in pods]
        routed.append(member_endpoints(f.name, server, namespace, ports[f.name], endpoints))
        outcomes[f.name] = _frozen_outcome(f, ports[f.name], per_pod, bool(f.config))
    # What each member's pods serve, by the rule its status line's digest is written with (one round,
    # one rule: configs.json and the status never disagree after a restart)
    asked = {name for a in actions.values() for name in a.load}
    staged_of = {m.name: staged_member(ServerMember(m.name, m.spec, versions[m.name], incoming.get(m.name)))
                 for m in held}
    staged_of.update({s.model: s for s in lingering if s.model in {f.name for f in frozen}})
    served_configs, served = {}, {}
    frozen_config = {f.name: f.config for f in frozen if f.config}
    for name in [*(m.name for m in held), *(f.name for f in frozen)]:
        if planned_is_served(outcomes[name], configs, asked, unconfirmed):
            served_configs[name] = configs[name][1]
            served[name] = served_sha256(server, configs[name][1], staged_of.get(name))
        elif name in by_name and (previous_configs or {}).get(name) is not None and by_name[name].served_digest \
                and config_hash(previous_configs[name]) == by_name[name].served_digest:
            served_configs[name] = previous_configs[name]      # an edit not served yet: the old one serves
        elif name in frozen_config:                            # checked against the status' full hash
            served_configs[name] = frozen_config[name]
    objects = server_objects(server, namespace, spec, [ServerMember(m.name, m.spec, versions[m.name],
                                                                    incoming.get(m.name)) for m in held],
                             ports, replicas, placement, policy, lingering, frozen, served_configs,
                             taken=len(set(taken.values())))
    return ServerPlan(tuple([*objects, *routed]), actions, configs,
                      tuple(outcomes[n] for n in [*(m.name for m in members), *(f.name for f in frozen)]), ports,
                      replicas, admission, name_taken, frozenset(unconfirmed), scaling, served, switches,
                      switch_configs, adopted)


def _in_flight(record: Any) -> bool:
    """A member's switch record (rollout.inplace.Record) says a switch is under way."""
    from rankops.server_switch import IN_FLIGHT

    return record is not None and record.phase in IN_FLIGHT


def planned_is_served(outcome: MemberOutcome, configs: Mapping[str, tuple[int, str]], asked: Collection[str],
                      unconfirmed: Collection[str]) -> bool:
    """Whether a member's pods serve its planned config: it serves, and no pod is asked to load it again
    or refused it (what its status line's configDigest and configs.json record)."""
    return outcome.state == SERVING and outcome.name in configs and outcome.name not in asked \
        and outcome.name not in unconfirmed


REASON_SPEC_INVALID = DegradedReason.INVALID_SPEC.value


def _frozen_outcome(member: Any, port: int, per_pod: Mapping[str, Mapping[str, MemberState]],
                    config_known: bool) -> MemberOutcome:
    """A frozen member (render.shared_server.FrozenMember): Serving while every pod read serves it;
    else Failed (held still: never unloaded), saying where it serves and what another pod loads."""
    states = [members[member.name] for members in per_pod.values() if member.name in members]
    serving = sum(1 for s in states if s.state == SERVING)
    others = ("a pod without it loads it with the config its pods serve (configs.json, its digest checked)"
              if config_known else "loading it on no other until the spec is fixed (the config its pods serve is "
                                   "not known here)")
    said = (f"{member.name}: its spec does not validate ({member.error[:400]}); the server holds it and serves "
            f"{member.version} as it was on {serving} of {len(states)} pod(s); {others}")
    if states and serving == len(states):
        return MemberOutcome(member.name, SERVING, REASON_SERVES, said, member.version, port)
    return MemberOutcome(member.name, FAILED, REASON_SPEC_INVALID, said, member.version, port)


def _config_digest(member: MemberView, namespace: str, shape: ServingShape) -> str | None:
    """Digest of the config the held member would be loaded with now (None: none can be rendered)."""
    from rankops.render.serving import config_hash
    from rankops.render.shared_server import member_config

    try:
        return config_hash(member_config(member.name, namespace, member.spec, member.held_version, shape)[1])
    except (KeyError, ValueError):
        return None


def _serves_on(model: str, version: int | None, pod: PodView, per_pod: Mapping[str, Mapping[str, MemberState]]) -> bool:
    """The member serves on the pod, for its endpoint: by this read of the pod's index, or, where
    the read missed a Ready pod, by the last one (a slow Triton keeps its traffic)."""
    if pod.name in per_pod:
        return per_pod[pod.name].get(model, MemberState(model, ABSENT)).state == SERVING
    if version is None or not pod.ready or pod.terminating or pod.last_index is None:
        return False
    return member_state(model, version, pod.last_index).state == SERVING


def _may_hold(model: str, pods: Sequence[PodView]) -> bool:
    """A pod may still have `model` loaded: its index says so, or it was not read."""
    return any(p.index is None or any(e.name == model and e.state in ("READY", "LOADING", "UNLOADING")
                                      for e in p.index) for p in pods)


def _held_outcome(member: MemberView, version: str, port: int, per_pod: Mapping[str, Mapping[str, MemberState]],
                  pods: Sequence[PodView], notes: Sequence[str], loads_anew: bool = True) -> MemberOutcome:
    """A held member's state over the ready pods whose index was read: Serving on all of them,
    Failed where any refused it (Triton's reason, the pod named), else Loading. One that is loaded
    on no pod that lacks it (`loads_anew` False: over the server's room, or no config to load it
    with) is judged on the pods that hold it, and Failed where none does: nothing is on its way."""
    states = {pod: members[member.name] for pod, members in per_pod.items() if member.name in members}
    notes = list(notes)
    if not loads_anew:
        lacking = sorted(pod for pod, s in states.items() if s.state == ABSENT)
        states = {pod: s for pod, s in states.items() if s.state != ABSENT}
        if lacking:
            notes.append(f"not loaded on {', '.join(lacking)}: no new load is sent for it")
        if lacking and not states:
            return MemberOutcome(member.name, FAILED, REASON_SERVER_FULL,
                                 f"{member.name} {version} is held but loaded on no ready pod ({'; '.join(notes)})",
                                 version, port)
    unread = [f"{p.name}: {p.index_error}" for p in pods if p.ready and p.index is None and p.index_error]
    if unread:
        notes.append("index unreadable on " + "; ".join(unread))
    staging = sorted(pod for pod, s in states.items() if s.state == STAGING)
    if staging:
        notes.insert(0, f"waiting for its files on {', '.join(staging)}")
    tail = f" ({'; '.join(notes)})" if notes else ""
    failed = {pod: s for pod, s in states.items() if s.state == FAILED}
    if failed:
        said = "; ".join(f"{pod}: {s.reason}" for pod, s in sorted(failed.items()))
        return MemberOutcome(member.name, FAILED, REASON_LOAD_FAILED,
                             f"{member.name} {version} failed to load on {len(failed)} of {len(states)} pod(s): "
                             f"{said}{tail}", version, port)
    if not states:
        return MemberOutcome(member.name, LOADING, REASON_NO_READY_POD,
                             f"no ready pod of the server holds {member.name} {version} yet{tail}", version, port)
    serving = sorted(pod for pod, s in states.items() if s.state == SERVING)
    if len(serving) == len(states):
        return MemberOutcome(member.name, SERVING, REASON_SERVES,
                             f"{member.name} {version} serves on {len(serving)} pod(s){tail}", version, port)
    return MemberOutcome(member.name, LOADING, REASON_LOADING,
                         f"{member.name} {version} serves on {len(serving)} of {len(states)} pod(s), loading on the "
                         f"others{tail}", version, port)
