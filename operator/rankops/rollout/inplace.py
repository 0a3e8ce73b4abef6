"""An in-place version switch (issue 41): a new version loaded beside the serving one inside the
running Triton pods, gated on one pod, then switched pod by pod; pure, not wired to the controller yet.

`step(record, observed, policy)` is level-based: it reads the record kept in status, each pod's
Triton repository index (which versions it has loaded, and in what state), the gate verdicts, the
stable version's P99 and the clock, and returns the actions that must hold now and the next
record. The same inputs give the same actions, so an operator restarted mid-switch carries on from
the record and the indexes; the controller runs each action idempotently (at most one request in
flight per pod and version) and never branches on what woke it.

    Loading -> Gating -> Promoting -> Unloading -> Switched
       \\_________\\__________\\___________\\-> RollingBack -> RolledBack    (a gate failed, or aborted)
       \\_________\\__________\\-> FallingBack -> FellBack (the pods strategy takes over: interference
                                                          bound, a load that failed or ran out of time)

- Loading: one serving pod (the gate pod) loads the new version beside the old one.
- Gating: the gates (warmup, equivalence) run against that pod, by version.
- Promoting: the other pods load it, one at a time.
- Unloading: every pod serves the new version; the old one is unloaded everywhere, its files removed.
- RollingBack / FallingBack: the new version is unloaded from every pod that has it (the old one
  loaded again first where it is gone), its files removed.

When the switched pod serves the new version: **as soon as Triton has it READY, to that pod's
share of the traffic (1 of N pods), while the gates run against it.** Triton answers a request
that names no version from the highest-numbered READY version, so a loaded version numbered above
the serving one takes the pod's traffic at once; holding the old one as the answer until the gates
pass would take a second model name (the new version's memory twice: more than the arithmetic
allows) or the pod out of the Service (a replica's capacity, which in place exists to keep). A cold
version never answers: the rendered config's `model_warmup` runs before Triton marks it READY. The
exposure is the pods strategy's first step with `traffic: replicas` (1 of N pods), and a failing
gate unloads the version at once. A version numbered below the serving one stays unanswered by
unversioned requests until the old one is unloaded (Unloading): there the gates pass first.

"Loaded" is what the index says: READY, LOADING or UNLOADING (Triton lists an unloaded version as
UNAVAILABLE, reason "unloaded"; a failed load as UNAVAILABLE with Triton's error). Triton's unload
endpoint takes the whole model down, so both Load and Unload are carried out as a load whose config
override's version policy lists `keep`, the versions the pod holds afterwards.

A version whose directory is not on the pod's volume yet (the pod stages it: fetcher/stager.py) is
not in the index at all: Triton 2.51 loads the listed versions it finds, answers 200 and skips the
missing one (or refuses the whole load when it finds none). So an absent version is waited for,
its load asked again each round (a load under way is LOADING in the index), up to loadTimeout
counted from the first ask; only an error in the index is a failed load.

A swap (a shared server's member whose new version does not fit beside the held one on the card,
server_switch.py): the new version replaces the old one in each pod in turn instead of loading
beside it. The pod taken (`load_pod`) leaves the member's endpoints first (the shell's rule), is
its router asked to close the member's keep-alive connections (Drain), given DRAIN_S for its
requests in flight, has the old version unloaded, then loads the new one
alone; the gates judge it there, equivalence against the old version on another pod. One pod at a
time is taken, and only while the others serving the member keep replicas - failureTolerance. A
rollback swaps back the same way, one pod at a time.

Invariants: at most one pod loads at a time; a load starts only while at least
replicas - failureTolerance pods serve and the stable P99 was read (a load never starts blind);
a pod that restarts comes back with what its Deployment says (the old version: the template moves
at promotion) and is loaded again; a lost gate pod means a new gate pod and gates of its own.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rankops.planner.two_versions import SideBySide
from rankops.render.tritonconfig import triton_version
from rankops.rollout.record import Event, iso, parse_time

LOADING, GATING, PROMOTING, UNLOADING, SWITCHED = "Loading", "Gating", "Promoting", "Unloading", "Switched"
ROLLING_BACK, ROLLED_BACK, FALLING_BACK, FELL_BACK = "RollingBack", "RolledBack", "FallingBack", "FellBack"
FORWARD = (LOADING, GATING, PROMOTING, UNLOADING)
CLEANING = {ROLLING_BACK: ROLLED_BACK, FALLING_BACK: FELL_BACK}
TERMINAL = (SWITCHED, ROLLED_BACK, FELL_BACK)
# Triton's repository index states.
READY, LOADING_STATE, UNLOADING_STATE, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
HELD = (READY, LOADING_STATE, UNLOADING_STATE)
DRAIN_S = 5.0   # a swap's pod is out of the member's endpoints this long before its version is unloaded
DRAIN_HOLD_S = 30.0     # each drain ask holds the pod's router drain this long (asked again each round)
MAX_DRAIN_S = 30.0      # a drain waits at most this long for the router's last connection of the member to end


@dataclass(frozen=True)
class VersionState:
    state: str               # READY | LOADING | UNLOADING | UNAVAILABLE
    reason: str = ""         # Triton's: "unloaded", or the load's error


@dataclass(frozen=True)
class PodIndex:
    name: str
    uid: str
    serving: bool            # Ready, not being deleted, on a live node (rollout/readiness)
    versions: Mapping[int, VersionState] | None   # its repository index by Triton version; None: not read
    unread: str = ""         # why the index was not read
    key_refused: bool = False   # the pod refused the model's restricted-API key (the key Secret was made again)
    drain_open: int | None = None   # a swap's: the member's connections its router still had open (None: not asked)
    staged: frozenset[int] | None = None    # a swap's: its version directories on the pod's volume (None: not known)


@dataclass(frozen=True)
class GateVerdict:
    outcome: str             # pass | fail | error
    summary: str
    pod_uid: str             # the pod it judged: a verdict on another pod is no evidence


@dataclass(frozen=True)
class Policy:
    replicas: int
    failure_tolerance: int
    max_stable_p99_ms: float            # rollout.inPlace.maxStableP99Ms (default: the SLO's P99)
    load_timeout_s: float = 600.0
    gates: tuple[str, ...] = ("warmup", "equivalence")


@dataclass(frozen=True)
class Observed:
    now: dt.datetime
    pods: tuple[PodIndex, ...]
    gates: Mapping[str, GateVerdict] = field(default_factory=dict)
    stable_p99_ms: float | None = None  # the old version's server P99 over its pods' last window; None: not read
    abort: str | None = None            # why to stop now (rankops.io/abort, spec.version changed)


@dataclass(frozen=True)
class Record:
    """What the switch keeps in status (the next round's status.rollout.inPlace)."""
    version: str
    from_version: str
    phase: str
    since: str                               # when the phase began (RFC 3339)
    gate_pod: str | None = None
    gate_pod_uid: str | None = None
    load_pod: str | None = None              # the pod asked to load last, and when
    load_since: str | None = None
    touched: tuple[str, ...] = ()            # every pod asked to load the new version
    message: str = ""
    failed_gate: str | None = None
    reason: str | None = None                # why it rolled back or fell back, with the numbers
    artifact: str | None = None              # digest of the incoming version's spec entry when it began (a member's)
    swap: bool = False                       # each pod's old version replaced, not loaded beside (module docstring)

    def to_status(self) -> dict[str, Any]:
        names = {"from_version": "fromVersion", "gate_pod": "gatePod", "gate_pod_uid": "gatePodUid",
                 "load_pod": "loadPod", "load_since": "loadSince", "failed_gate": "failedGate"}
        out = {names.get(k, k): v for k, v in self.__dict__.items() if v not in (None, "", ()) and v is not False}
        if self.touched:
            out["touched"] = list(self.touched)
        return out

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> "Record":
        names = {"fromVersion": "from_version", "gatePod": "gate_pod", "gatePodUid": "gate_pod_uid",
                 "loadPod": "load_pod", "loadSince": "load_since", "failedGate": "failed_gate"}
        values = {names.get(k, k): v for k, v in data.items()}
        values["touched"] = tuple(values.get("touched") or ())
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in values.items() if k in known})   # what status says beside it (servedBy)


# Actions: what must hold now. Load and Unload are both a load with a config override whose version
# policy is `keep` (see the module's docstring).
@dataclass(frozen=True)
class Load:
    pod: str
    version: str
    keep: tuple[str, ...]


@dataclass(frozen=True)
class Unload:
    pod: str
    version: str
    keep: tuple[str, ...]       # () in a swap: the model unloaded from the pod (Triton's unload)


@dataclass(frozen=True)
class Drain:
    """A swap's: the pod's router closes the member's keep-alive connections (triton/route.py) for
    `seconds`, so pooled clients leave the pod taken; 0 ends the drain."""
    pod: str
    seconds: float


@dataclass(frozen=True)
class RemoveFiles:
    pod: str
    version: str


@dataclass(frozen=True)
class RunGate:
    gate: str
    pod: str
    version: str
    reference: str | None = None    # a swap's: the pod whose old version equivalence compares with


@dataclass(frozen=True)
class FallBack:
    reason: str


@dataclass(frozen=True)
class Switch:
    record: Record
    actions: tuple[Any, ...] = ()
    events: tuple[Event, ...] = ()


def begin(version: str, from_version: str, now: dt.datetime, fit: SideBySide | None) -> Switch:
    """A switch to `version`, or the pods strategy at once when the plan says it cannot be in place."""
    record = Record(version=version, from_version=from_version, phase=LOADING, since=iso(now),
                    message=f"loading {version} beside {from_version} in one pod")
    if fit is not None and fit.in_place:
        return Switch(record, events=(Event("Normal", "InPlaceSwitchStarted", record.message),))
    why = "; ".join(fit.problems) if fit is not None and fit.problems else \
        f"memory {fit.arithmetic}" if fit is not None else "no memory arithmetic for the two versions"
    reason = f"{version} cannot be loaded beside {from_version}: {why}"
    record = replace(record, phase=FELL_BACK, reason=reason, message=f"{reason}; rolling out with pods")
    return Switch(record, (FallBack(reason),), (Event("Normal", "InPlaceNotPossible", record.message),))


class _Step:
    def __init__(self, record: Record, observed: Observed, policy: Policy):
        self.rec, self.obs, self.policy = record, observed, policy
        self.new, self.old = record.version, record.from_version
        self.actions: list[Any] = []
        self.events: list[Event] = []

    # --- what the indexes say
    def state(self, pod: PodIndex, version: str) -> VersionState | None:
        return None if pod.versions is None else pod.versions.get(triton_version(version))

    def holds(self, pod: PodIndex, version: str) -> bool:
        s = self.state(pod, version)
        return s is not None and s.state in HELD

    def ready(self, pod: PodIndex, version: str) -> bool:
        s = self.state(pod, version)
        return s is not None and s.state == READY

    def pod(self, name: str | None) -> PodIndex | None:
        return next((p for p in self.obs.pods if p.name == name), None)

    # --- moves
    def set(self, **changes: Any) -> None:
        self.rec = replace(self.rec, **changes)

    def move(self, phase: str, message: str, reason: str = "", kind: str = "Normal") -> None:
        self.set(phase=phase, since=iso(self.obs.now), message=message)
        if reason:
            self.events.append(Event(kind, reason, message))

    def roll_back(self, gate: str | None, why: str) -> None:
        self.set(failed_gate=gate, reason=why)
        if not self.rec.swap:       # a swap's pod stays taken: its rollback carries on from it
            self.set(load_pod=None, load_since=None)
        self.move(ROLLING_BACK, f"{why}; unloading {self.new} from every pod that loaded it", "InPlaceRollingBack",
                  "Warning")

    def fall_back(self, why: str) -> None:
        self.set(reason=why)
        if not self.rec.swap:
            self.set(load_pod=None, load_since=None)
        self.move(FALLING_BACK, f"{why}; unloading {self.new} and rolling out with pods", "InPlaceFallingBack",
                  "Warning")

    def not_staged(self, pod: PodIndex) -> str:
        """A note for a pod asked before whose index still lacks the new version (its files)."""
        if pod.versions is None or self.state(pod, self.new) is not None:
            return ""
        return f"; not in its index yet: waiting for its files on {pod.name}'s volume"

    def load(self, pod: PodIndex, version: str, keep: tuple[str, ...]) -> None:
        self.actions.append(Load(pod.name, version, keep))
        if version == self.new:
            if self.rec.load_pod != pod.name:
                self.set(load_pod=pod.name, load_since=iso(self.obs.now))
            if pod.name not in self.rec.touched:
                self.set(touched=(*self.rec.touched, pod.name))

    def take(self, pod: PodIndex) -> None:
        """A swap takes `pod`: out of the member's endpoints from now (the shell), drained, then swapped."""
        self.set(load_pod=pod.name, load_since=iso(self.obs.now))
        if pod.name not in self.rec.touched:
            self.set(touched=(*self.rec.touched, pod.name))

    def staged(self, pod: PodIndex) -> bool:
        """A swap may take `pod`: the new version's files are on its volume, as its router said (not
        known: not taken; the wait is bounded by loadTimeout, stuck_for_files)."""
        return pod.staged is not None and triton_version(self.new) in pod.staged

    def stuck_for_files(self) -> bool:
        """No pod could be taken for the new version's files for loadTimeout of this phase: the swap stops."""
        waited = (self.obs.now - parse_time(self.rec.since)).total_seconds()
        if waited <= self.policy.load_timeout_s:
            return False
        self.fall_back(f"no pod had {self.new}'s files on its volume (as its router says) for {waited:.0f}s "
                       f"(loadTimeout {self.policy.load_timeout_s:g}s)")
        return True

    def drained(self, pod: PodIndex) -> bool:
        """The pod taken has had DRAIN_S, and its router said, to an ask since it was taken, that no
        connection of the member is open; or MAX_DRAIN_S passed (not known is waited out in full)."""
        waited = (self.obs.now - parse_time(self.rec.load_since)).total_seconds()
        return waited >= DRAIN_S and (pod.drain_open == 0 or waited >= MAX_DRAIN_S)

    # --- guards
    def serving(self) -> int:
        return sum(p.serving for p in self.obs.pods)

    def below_floor(self) -> str | None:
        """Why a swap may not take one more pod out now: the others serving the member would fall
        below replicas - failureTolerance, or to none."""
        floor = max(1, self.policy.replicas - self.policy.failure_tolerance)
        serving = len(self.serving_either())
        if serving - 1 < floor:
            return (f"{serving} pods serve it: taking one out to swap it would leave fewer than "
                    f"{floor} (replicas - failureTolerance, at least 1)")
        return None

    def serving_either(self) -> list[PodIndex]:
        """The pods serving the member now (a swap's): either version READY, not the pod taken."""
        return [p for p in self.obs.pods if p.serving and p.name != self.rec.load_pod
                and (self.ready(p, self.old) or self.ready(p, self.new))]

    def may_start_load(self) -> str | None:
        """Why no load may start now (None: one may)."""
        floor = self.policy.replicas - self.policy.failure_tolerance
        if self.serving() < floor:
            return (f"{self.serving()} pods serving, below replicas - failureTolerance = {floor}: no load starts "
                    "until they are back")
        if self.rec.swap and (why := self.below_floor()):
            return why
        if self.obs.stable_p99_ms is None:
            return f"the stable P99 is not read: no load of {self.new} starts without it"
        return None

    def loading_now(self) -> bool:
        """A load of the new version is in flight: asked and not READY yet, or LOADING in an index."""
        asked = self.pod(self.rec.load_pod)
        return (asked is not None and not self.ready(asked, self.new)) or any(
            (st := self.state(p, self.new)) is not None and st.state == LOADING_STATE for p in self.obs.pods)

    def interfering(self) -> bool:
        """While the new version loads or warms in a serving pod, the stable P99 is held to its bound."""
        p99, bound = self.obs.stable_p99_ms, self.policy.max_stable_p99_ms
        if p99 is None or p99 <= bound:
            return False
        where = self.rec.load_pod or self.rec.gate_pod
        doing = {LOADING: "loaded", GATING: "was gated"}.get(self.rec.phase, "loaded")
        self.fall_back(f"stable {self.old} P99 {p99:.1f} ms > {bound:g} ms (maxStableP99Ms) while {self.new} "
                       f"{doing} in {where}")
        return True

    def load_failed(self) -> bool:
        """The pod asked last has not got it READY: Triton's error, or the load's deadline. A version
        not in the index is no error: its files are not on the pod's volume yet (the module's
        docstring), and the deadline covers their fetch too."""
        pod = self.pod(self.rec.load_pod)
        if pod is None and self.rec.load_pod:
            # A load that kills its pod (host memory, which the arithmetic does not count) would kill
            # the next one too: no second pod is tried.
            self.fall_back(f"{self.rec.load_pod} went away while loading {self.new}")
            return True
        if pod is None or self.ready(pod, self.new):
            return False
        s = self.state(pod, self.new)
        if s is not None and s.state == UNAVAILABLE and s.reason and s.reason != "unloaded":
            self.fall_back(f"{self.new} failed to load in {pod.name}: {s.reason}")
            return True
        age = (self.obs.now - parse_time(self.rec.load_since)).total_seconds()
        if age > self.policy.load_timeout_s:
            seen = f"{s.state}{': ' + s.reason if s.reason else ''}" if s else \
                f"not read: {pod.unread}" if pod.versions is None else "not in its index: its files not on its volume"
            self.fall_back(f"{self.new} not READY in {pod.name} after {age:.0f}s (loadTimeout "
                           f"{self.policy.load_timeout_s:g}s; index: {seen})")
            return True
        return False


def _loading(s: _Step) -> None:
    gate = s.pod(s.rec.gate_pod)
    if s.rec.gate_pod and (gate is None or gate.uid != s.rec.gate_pod_uid or not gate.serving):
        how = "gone" if gate is None else "restarted" if gate.uid != s.rec.gate_pod_uid else "not serving"
        if s.rec.load_pod == s.rec.gate_pod and how != "not serving":
            # Lost while it loaded: the load may be what killed it, and would kill the next pod too.
            return s.fall_back(f"gate pod {s.rec.gate_pod} {how} while loading {s.new}")
        s.events.append(Event("Warning", "InPlaceGatePodLost",
                              f"gate pod {s.rec.gate_pod} {how} while loading {s.new}: choosing another"))
        s.set(gate_pod=None, gate_pod_uid=None, load_pod=None, load_since=None)
        gate = None
    if gate is not None and s.ready(gate, s.new):
        s.set(load_pod=None, load_since=None)
        s.move(GATING, f"{s.new} READY beside {s.old} in {gate.name}; gating it there", "InPlaceLoaded")
        return _gating(s)
    if s.rec.swap and gate is not None and s.rec.load_pod == gate.name:
        return _swap_in(s, gate)
    if gate is not None and (s.holds(gate, s.new) or s.rec.load_pod == gate.name):
        if not s.load_failed():
            if not s.holds(gate, s.new):
                s.load(gate, s.new, (s.old, s.new))
            s.set(message=f"loading {s.new} beside {s.old} in {gate.name}{s.not_staged(gate)}")
        return
    blocked = s.may_start_load()
    if blocked:
        waited = (s.obs.now - parse_time(s.rec.since)).total_seconds()
        if s.obs.stable_p99_ms is None and waited > s.policy.load_timeout_s:
            # No traffic (or no reading) for that long: the interference bound cannot be judged.
            return s.fall_back(f"no P99 of {s.old} read for {waited:.0f}s (loadTimeout "
                               f"{s.policy.load_timeout_s:g}s): the interference bound cannot be judged")
        s.set(message=f"waiting to load {s.new}: {blocked}")
        return
    if gate is None:
        pods = sorted(s.obs.pods, key=lambda p: p.name)
        # a swap's pod already holding the new version alone (its gate pod lost for a round) is gated again
        swapped = [p for p in pods if s.rec.swap and p.serving and p.versions is not None and s.ready(p, s.new)
                   and not s.holds(p, s.old)]
        gate = next(iter(swapped), None) or next((p for p in pods if p.serving and p.versions is not None
                                                  and s.ready(p, s.old) and (not s.rec.swap or s.staged(p))), None)
        if gate is None and s.rec.swap and any(p.serving and s.ready(p, s.old) for p in pods) \
                and s.stuck_for_files():
            return
        if gate is None:
            waits = f"{s.new}'s files on its volume (its stager's)" if s.rec.swap else f"{s.old} READY"
            s.set(message=f"waiting for a serving pod whose index shows {s.old} READY, and {waits}")
            return
        if s.rec.swap and _reference(s, gate) is None:
            waited = (s.obs.now - parse_time(s.rec.since)).total_seconds()
            if waited > s.policy.load_timeout_s:
                return s.fall_back(f"no second pod served {s.old} for {waited:.0f}s (loadTimeout "
                                   f"{s.policy.load_timeout_s:g}s): a swap's equivalence has nothing to compare with")
            s.set(message=f"waiting for a second pod serving {s.old}: a swap's equivalence compares with it there")
            return
        s.set(gate_pod=gate.name, gate_pod_uid=gate.uid)
        if s.ready(gate, s.new):
            s.move(GATING, f"{s.new} READY alone in {gate.name}; gating it there", "InPlaceLoaded")
            return _gating(s)
    if s.rec.swap:
        s.take(gate)
        return _swap_in(s, gate)
    s.load(gate, s.new, (s.old, s.new))
    s.set(message=f"loading {s.new} beside {s.old} in {gate.name}")


def _gating(s: _Step) -> None:
    gate = s.pod(s.rec.gate_pod)
    if gate is None or gate.uid != s.rec.gate_pod_uid or not gate.serving or \
            (gate.versions is not None and not s.ready(gate, s.new)):
        how = "gone" if gate is None else "restarted" if gate.uid != s.rec.gate_pod_uid else \
            "not serving" if not gate.serving else f"no longer has {s.new} READY"
        s.set(gate_pod=None, gate_pod_uid=None)
        s.move(LOADING, f"gate pod {s.rec.gate_pod} {how}: loading {s.new} in another pod, gated anew",
               "InPlaceGatePodLost", "Warning")
        return _loading(s)
    for name in s.policy.gates:
        verdict = s.obs.gates.get(name)
        if verdict is None or verdict.pod_uid != gate.uid:
            reference = _reference(s, gate) if s.rec.swap else None
            if s.rec.swap and reference is None:
                s.set(message=f"{name} gate waits: no other pod serves {s.old} to compare {s.new} in {gate.name} with")
                return
            s.actions.append(RunGate(name, gate.name, s.new, reference.name if reference else None))
            s.set(message=f"{name} gate running against {s.new} in {gate.name}")
            return
        if verdict.outcome != "pass":
            return s.roll_back(name, f"{name} gate {verdict.outcome} for {s.new} in {gate.name}: {verdict.summary}")
    s.move(PROMOTING, f"gates passed for {s.new} in {gate.name}; loading it in the other pods one at a time",
           "InPlaceGatesPassed")
    _promoting(s)


def _load_next(s: _Step) -> bool:
    """Load the new version in the next pod that lacks it, one at a time; True when every pod has it READY."""
    pods = sorted(s.obs.pods, key=lambda p: p.name)
    waiting = [p for p in pods if not p.serving or p.versions is None]
    lacking = [p for p in pods if p.serving and p.versions is not None and not s.ready(p, s.new)]
    if s.rec.swap and s.rec.load_pod:
        taken = s.pod(s.rec.load_pod)
        if taken is None or not s.ready(taken, s.new):
            _swap_in(s, taken)
            return False
        s.set(load_pod=None, load_since=None)        # swapped: back in the member's endpoints
    if not waiting and not lacking and len(pods) >= s.policy.replicas:
        s.set(load_pod=None, load_since=None)
        return True
    if s.rec.swap:
        return _swap_next(s, pods, waiting, lacking)
    if s.load_failed():
        return False
    in_flight = [p for p in lacking if s.holds(p, s.new) or p.name == s.rec.load_pod]
    if in_flight:
        pod = in_flight[0]
        if not s.holds(pod, s.new):
            s.load(pod, s.new, (s.old, s.new))
        s.set(message=f"loading {s.new} in {pod.name} ({len(pods) - len(lacking) - len(waiting)}/{len(pods)} "
                      f"pods have it){s.not_staged(pod)}")
        return False
    blocked = s.may_start_load() if lacking else None
    if lacking and not blocked:
        keep = (s.old, s.new) if s.holds(lacking[0], s.old) else (s.new,)
        s.load(lacking[0], s.new, keep)
        s.set(message=f"loading {s.new} in {lacking[0].name}")
    else:
        why = blocked or ("waiting for " + ", ".join(f"{p.name} ({p.unread or 'not serving'})" for p in waiting)
                          if waiting else f"waiting for {s.policy.replicas} pods (a replica being replaced)")
        s.set(message=f"{s.new} in {len(pods) - len(lacking) - len(waiting)}/{len(pods)} pods; {why}")
    return False


def _promoting(s: _Step) -> None:
    if _load_next(s):
        s.move(UNLOADING, f"every pod serves {s.new}; unloading {s.old}", "InPlacePromoted")
        _unloading(s)


def _unloading(s: _Step) -> None:
    if not _load_next(s):          # a pod restarted meanwhile came back with the old version only
        return
    left = [p for p in s.obs.pods if s.holds(p, s.old)]
    if left:
        s.actions += [Unload(p.name, s.old, (s.new,)) for p in left]
        s.set(message=f"unloading {s.old} from {', '.join(p.name for p in left)}")
        return
    # Its files go only now: until every pod has unloaded it, a rollback loads it again.
    s.actions += [RemoveFiles(p.name, s.old) for p in s.obs.pods]
    s.move(SWITCHED, f"{s.new} serves in every pod; {s.old} unloaded and its files removed", "InPlaceSwitched")


def _reference(s: _Step, gate: PodIndex) -> PodIndex | None:
    """A swap's equivalence reference: another serving pod with the old version READY."""
    return next((p for p in sorted(s.obs.pods, key=lambda p: p.name)
                 if p.name != gate.name and p.serving and s.ready(p, s.old)), None)


def _swap_in(s: _Step, pod: PodIndex | None) -> None:
    """One round of a swap's pod (`load_pod`): drained, its old version unloaded, the new one loaded alone."""
    if s.load_failed() or pod is None:        # Triton's error, the deadline (from when it was taken), or gone
        return
    if s.holds(pod, s.old) and not s.drained(pod):
        open_now = f", {pod.drain_open} connection(s) of it still open" if pod.drain_open else ""
        s.set(message=f"{pod.name} out of the member's endpoints: draining it{open_now} before {s.old} is "
                      f"unloaded there and {s.new} loaded alone")
    elif pod.versions is None:
        s.set(message=f"swapping {s.old} for {s.new} in {pod.name}: its index not read ({pod.unread})")
    elif s.holds(pod, s.old):
        s.actions.append(Unload(pod.name, s.old, ()))
        s.set(message=f"unloading {s.old} from {pod.name} (out of the member's endpoints) to load {s.new} alone")
    else:
        if not s.holds(pod, s.new):
            s.load(pod, s.new, (s.new,))
        s.set(message=f"loading {s.new} alone in {pod.name} (out of the member's endpoints){s.not_staged(pod)}")


def _swap_next(s: _Step, pods: list[PodIndex], waiting: list[PodIndex], lacking: list[PodIndex]) -> bool:
    """A swap's promotion: the next pod serving the old version is taken, once the others keep the floor."""
    have = len(pods) - len(lacking) - len(waiting)
    ready_old = [p for p in lacking if s.ready(p, s.old) and s.staged(p)]
    if not ready_old and any(s.ready(p, s.old) for p in lacking) and s.stuck_for_files():
        return False
    blocked = s.may_start_load() if ready_old else None
    if ready_old and not blocked:
        s.take(ready_old[0])
        _swap_in(s, ready_old[0])
        return False
    why = blocked or (f"waiting for {', '.join(p.name for p in lacking)} to serve {s.old} with {s.new}'s files on "
                      "its volume first" if lacking else
                      "waiting for " + ", ".join(f"{p.name} ({p.unread or 'not serving'})" for p in waiting)
                      if waiting else f"waiting for {s.policy.replicas} pods (a replica being replaced)")
    s.set(message=f"{s.new} in {have}/{len(pods)} pods; {why}")
    return False


def _cleaning_swap(s: _Step) -> None:
    """A swap's rollback: each pod holding the new version taken in turn, drained, the new version
    unloaded and the old one loaded back alone."""
    taken = s.pod(s.rec.load_pod) if s.rec.load_pod else None
    if s.rec.load_pod and taken is None:       # gone: its replacement loads the old version (the server's)
        s.set(load_pod=None, load_since=None)
    if taken is not None:
        if taken.versions is None:
            s.set(message=f"{s.rec.reason}; swapping {s.old} back in {taken.name}: its index not read ({taken.unread})")
            return
        if s.holds(taken, s.new):
            if s.drained(taken):
                s.actions.append(Unload(taken.name, s.new, ()))
            s.set(message=f"{s.rec.reason}; unloading {s.new} from {taken.name} to load {s.old} back alone")
            return
        if not s.ready(taken, s.old):
            state = s.state(taken, s.old)
            failed = state is not None and state.state == UNAVAILABLE and state.reason not in ("", "unloaded")
            age = (s.obs.now - parse_time(s.rec.load_since)).total_seconds()
            if not (failed or age > s.policy.load_timeout_s):
                if not s.holds(taken, s.old):
                    s.load(taken, s.old, (s.old,))
                s.set(message=f"{s.rec.reason}; loading {s.old} back in {taken.name}")
                return
            # the server's own loads (and their backoff) take the pod over: the switch goes on without it
            s.events.append(Event("Warning", "InPlaceSwapBackFailed", f"{s.old} not loaded back in {taken.name} "
                                  f"({state.reason if failed else f'{age:.0f}s'}): the server's loads take it over"))
        s.set(load_pod=None, load_since=None)
    pods = sorted(s.obs.pods, key=lambda p: p.name)
    unread = [p.name for p in pods if p.versions is None and p.name in s.rec.touched]
    holding = next((p for p in pods if p.versions is not None and s.holds(p, s.new)), None)
    if holding is not None and (why := s.below_floor()):
        # the new version serves meanwhile: no pod is taken below the floor, not even to roll back
        s.set(message=f"{s.rec.reason}; {s.new} still in {holding.name}: {why}")
        return
    if holding is not None:
        s.take(holding)
        s.set(message=f"{s.rec.reason}; {holding.name} out of the member's endpoints: draining it before {s.new} "
                      f"is unloaded there")
        return
    if unread:
        s.set(message=f"{s.rec.reason}; unloading {s.new} (index not read: {', '.join(unread)})")
        return
    s.actions += [RemoveFiles(name, s.new) for name in s.rec.touched]
    _cleaned(s)


def _cleaning(s: _Step) -> None:
    """Unload the new version from every pod that has it; the old one is loaded again first where it is gone."""
    if s.rec.swap:
        return _cleaning_swap(s)
    unread = []
    for pod in sorted(s.obs.pods, key=lambda p: p.name):
        if pod.versions is None:
            if pod.name in s.rec.touched:
                unread.append(pod.name)
            continue
        if not s.holds(pod, s.new):
            if pod.name in s.rec.touched:
                s.actions.append(RemoveFiles(pod.name, s.new))
        elif not s.ready(pod, s.old):
            s.load(pod, s.old, (s.old, s.new))
        else:
            s.actions.append(Unload(pod.name, s.new, (s.old,)))
    if any(isinstance(a, (Load, Unload)) for a in s.actions) or unread:
        s.set(message=f"{s.rec.reason}; unloading {s.new}" + (f" (index not read: {', '.join(unread)})" if unread else ""))
        return
    _cleaned(s)


def _cleaned(s: _Step) -> None:
    end = CLEANING[s.rec.phase]
    done = "rolled back" if end == ROLLED_BACK else "rolling out with pods"
    s.move(end, f"{s.rec.reason}; {s.new} unloaded everywhere, {s.old} serves: {done}",
           "InPlaceRolledBack" if end == ROLLED_BACK else "InPlaceFellBack", "Warning")
    if end == FELL_BACK:
        s.actions.append(FallBack(s.rec.reason or ""))


PHASES = {LOADING: _loading, GATING: _gating, PROMOTING: _promoting, UNLOADING: _unloading}


def step(record: Record, observed: Observed, policy: Policy) -> Switch:
    """The actions that must hold now and the next record (see the module's docstring)."""
    s = _Step(record, observed, policy)
    if record.phase == FELL_BACK:
        return Switch(record, (FallBack(record.reason or ""),))
    if record.phase in TERMINAL:
        return Switch(record)
    if record.phase in FORWARD:
        if observed.abort:
            s.roll_back("manual", f"aborted: {observed.abort}")
        elif not ((record.phase == GATING or s.loading_now()) and s.interfering()):
            PHASES[record.phase](s)
    if s.rec.phase in CLEANING:
        s.actions.clear()
        _cleaning(s)
    if record.swap:
        # each round, every pod's router is told whether to drain the member: the pod taken to, the others
        # not (a drain left by an earlier round or process ends); their answers are the next round's
        s.actions += [Drain(p.name, DRAIN_HOLD_S if p.name == s.rec.load_pod else 0) for p in s.obs.pods]
    return Switch(s.rec, tuple(s.actions), tuple(s.events))
