"""Read the serving pods' own Triton metrics: for the canary analysis and for spec.autoscaling.

A pod's metrics port (8002) answers what its tenant makes it answer, so every read is bounded
and nothing it says is taken on trust:

- Which pods: only the Ready, traffic-taking pods owned (controller ownerReference) by a
  ReplicaSet that the model's own stable or canary Deployment owns; a pod that merely carries the
  labels is not read. Its track and the Triton version it must report come from that Deployment.
- Each read (triton/metrics.fetch) has one deadline for connect, headers and body, a body cap and
  no redirects; the parser (triton/metrics.parse) is linear, keeps only the version's series and
  refuses what Triton could not have written. Whatever goes wrong is a reason ("pod (ip): ..."),
  never an exception out of a reconcile.
- Off the reconcile: in the operator (`PodMetrics(kick=...)`) a reconcile never waits on a pod.
  It takes the last answers, asks for new ones, and is kicked when they are in. Reads run on a
  few threads of their own, handed out round-robin by model, at most `per_model` at a time for
  one model: a model whose pods stall holds at most that many reader threads, each for at most
  the read deadline, and a pod that failed is read again only after a backoff. Without `kick`
  (tests, one-off reconciles) the reads run at once, concurrently, within the same deadline.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rankops.controller.kube import ApiError
from rankops.render import names
from rankops.render.serving import METRICS_PORT
from rankops.render.tritonconfig import triton_version
from rankops.rollout.readiness import pod_ready
from rankops.triton.metrics import READ_DEADLINE_S, MetricsUnavailable, ModelCounters, scrape

log = logging.getLogger("rankops.pod_metrics")
TRACKS = {names.CANARY: "canary", names.STABLE: "stable"}
READER_THREADS = 8          # reads at once, all models together
PER_MODEL = 2               # reads at once for one model
FRESH_S = 2.0               # an answer younger than this is not asked again
MAX_AGE_S = 60.0            # an answer older than this no longer counts as a reading
BACKOFF_S = (5.0, 300.0)    # a pod whose read failed: first wait, doubling up to the second
REPLICA_SETS_KEPT = 4096
MISS_S = 60.0               # a ReplicaSet not found, or not the model's: asked again after this


def readable(address: str | None, networks: Sequence[str]) -> bool:
    if not address:
        return False
    if not networks:
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net, strict=False) for net in networks)


@dataclass(frozen=True)
class Target:
    """One pod to read: its track, name, IP, and the Triton version label its series must carry."""
    track: str
    pod: str
    address: str
    version: str
    port: int = METRICS_PORT


@dataclass(frozen=True)
class Answer:
    at: dt.datetime                          # when it came back
    counters: ModelCounters | None = None    # None: not read, `problem` says why
    problem: str = ""


@dataclass
class Snapshot:
    """What one reconcile has of its serving pods: track -> pod -> (counters, when read), and the
    pods of each track that are not read (each "pod (ip): why")."""
    readings: dict[str, dict[str, tuple[ModelCounters, dt.datetime]]] = field(
        default_factory=lambda: {"canary": {}, "stable": {}})
    unread: dict[str, list[str]] = field(default_factory=lambda: {"canary": [], "stable": []})
    # Pods asked for and not answered yet (their first read is under way): not read, but no problem.
    pending: dict[str, list[str]] = field(default_factory=lambda: {"canary": [], "stable": []})

    @property
    def problems(self) -> tuple[str, ...]:
        """The pods that could not be read, and why (what status and Events say)."""
        return tuple(p for track in ("canary", "stable") for p in self.unread[track])

    def not_read(self, track: str) -> tuple[str, ...]:
        """The track's pods with no reading now: none can pass a bound that needs them."""
        return (*self.unread[track], *self.pending[track])

    def counters(self) -> dict[str, dict[str, ModelCounters]]:
        return {track: {pod: c for pod, (c, _) in pods.items()} for track, pods in self.readings.items()}


def _controller(meta: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((o for o in meta.get("ownerReferences") or [] if o.get("controller") and o.get("kind") == kind), None)


def serving_targets(pods: list[dict[str, Any]], deployments: dict[str, dict[str, Any] | None],
                    replica_set_owner: Callable[[str, str], str | None], networks: Sequence[str],
                    ready_only: bool = True) -> tuple[list[Target], list[tuple[str, str]], list[str]]:
    """(the pods to read, (track, "pod (ip): why") of the model's serving pods that may not be read,
    the pods that carry the model's labels but are not its Deployments' own). `deployments`: track
    -> the model's Deployment; `replica_set_owner(name, uid)`: the uid of the Deployment that
    controls that ReplicaSet (None: none, or not that ReplicaSet). `ready_only` False: its pods that
    are not Ready (or not taking traffic) too, as long as they are not going (the in-place switch)."""
    by_uid = {(d.get("metadata") or {}).get("uid"): (track, d) for track, d in deployments.items() if d}
    targets: list[Target] = []
    refused: list[tuple[str, str]] = []
    foreign: list[str] = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        serving = pod_ready(pod) and labels.get(names.LABEL_TRAFFIC) == "on"
        if not (labels.get(names.LABEL_TRACK) in TRACKS and (serving or not ready_only)
                and not meta.get("deletionTimestamp")):
            continue
        owner = _controller(meta, "ReplicaSet")
        try:
            deployment_uid = replica_set_owner(owner.get("name", ""), owner.get("uid", "")) if owner else None
        except (ApiError, OSError) as exc:   # an API error (RBAC, outage) is a reason, not a failed reconcile
            track = TRACKS[labels[names.LABEL_TRACK]]
            hint = "; the operator needs replicasets get" if getattr(exc, "status", None) == 403 else ""
            refused.append((track, f"{meta.get('name')}: its ReplicaSet {owner.get('name')} could not be read "
                                   f"({type(exc).__name__} {exc}){hint}"))
            continue
        if deployment_uid not in by_uid:
            foreign.append(f"{meta.get('name')}: not a pod of the model's Deployments (its ReplicaSet "
                           f"{(owner or {}).get('name', 'none')} is not theirs): not read")
            continue
        track, deployment = by_uid[deployment_uid]
        # The version its own ReplicaSet's template gave it (a rolling update leaves pods of the
        # previous template beside the new one), else the Deployment's.
        # An in-place model's template names no version (a switch must not restart its pods): its
        # Deployment's own label says what its pods serve.
        template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
        version = str(triton_version(labels.get(names.LABEL_VERSION)
                                     or (template.get("labels") or {}).get(names.LABEL_VERSION)
                                     or ((deployment.get("metadata") or {}).get("labels") or {}).get(
                                         names.LABEL_VERSION, "")))
        address = status.get("podIP")
        if readable(address, networks):
            targets.append(Target(TRACKS[track], meta["name"], address, version))
        else:
            refused.append((TRACKS[track], f"{meta['name']} ({address or 'no IP'}): outside the networks the "
                                           f"operator may read (rankops run --pod-metrics-network "
                                           f"{','.join(networks)})"))
    return targets, refused, foreign


def read_target(target: Target, model: str, deadline_s: float, now: Callable[[], dt.datetime]) -> Answer:
    """One bounded read of one pod; every way it can go wrong is a problem, never an exception."""
    address = f"[{target.address}]" if ":" in target.address else target.address
    try:
        counters = scrape(f"{address}:{target.port}", model, target.version, timeout_s=deadline_s)
    except MetricsUnavailable as exc:
        return Answer(now(), problem=f"{target.pod} ({target.address}): {exc}")
    except Exception as exc:  # noqa: BLE001 - a bug here must not fail the model's reconcile
        return Answer(now(), problem=f"{target.pod} ({target.address}): {type(exc).__name__}: {exc}")
    if not counters.seen:
        return Answer(now(), problem=f"{target.pod} ({target.address}): no series of model {model} version "
                                     f"{target.version} ({counters.note})")
    return Answer(now(), counters)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class PodMetrics:
    """The serving pods' answers, read off the reconciles (see the module's docstring)."""

    def __init__(self, kick: Callable[[Hashable], None] | None = None, threads: int = READER_THREADS,
                 per_model: int = PER_MODEL, deadline_s: float = READ_DEADLINE_S, max_age_s: float = MAX_AGE_S,
                 now: Callable[[], dt.datetime] = _utcnow, monotonic: Callable[[], float] = time.monotonic):
        """`max_age_s`: answers older than this are no reading (the runtime passes at least two of
        its --interval, so a clock reconcile finds the last round's)."""
        self.kick, self.threads, self.per_model, self.deadline_s = kick, threads, per_model, deadline_s
        self.max_age_s = max_age_s
        self.now, self.monotonic = now, monotonic
        self._cond = threading.Condition()
        self._answers: dict[Hashable, dict[Target, Answer]] = {}
        self._queued: OrderedDict[Hashable, deque[tuple[Target, str]]] = OrderedDict()
        self._in_flight: dict[Hashable, set[Target]] = {}
        self._failures: dict[tuple[Hashable, Target], tuple[int, float]] = {}   # (count, not before)
        # ReplicaSet uid -> (its Deployment's uid, None: kept; or None and when to ask again)
        self._owners: OrderedDict[str, tuple[str | None, float | None]] = OrderedDict()
        self._delivered: set[Hashable] = set()   # models kicked with a round not yet taken by a reconcile
        self._started = False

    # -- which pods

    def replica_set_owner(self, kube: Any, namespace: str) -> Callable[[str, str], str | None]:
        """`(name, uid) -> the uid of the Deployment controlling that ReplicaSet`. A ReplicaSet found
        with its controller is read once per uid (its controller does not change); one not found,
        or not controlled, is asked again after MISS_S (a forged ownerReference costs one GET a
        while, not one per reconcile; an orphan adopted later is seen)."""
        def owner(name: str, uid: str) -> str | None:
            if not name or not uid:
                return None
            now = self.monotonic()
            with self._cond:
                known = self._owners.get(uid)
                if known is not None and (known[1] is None or now < known[1]):
                    return known[0]
            found = kube.get("ReplicaSet", namespace, name)
            meta = (found or {}).get("metadata") or {}
            deployment = (_controller(meta, "Deployment") or {}).get("uid") if meta.get("uid") == uid else None
            with self._cond:
                self._owners[uid] = (deployment, None if deployment else now + MISS_S)
                self._owners.move_to_end(uid)
                while len(self._owners) > REPLICA_SETS_KEPT:
                    self._owners.popitem(last=False)
            return deployment
        return owner

    # -- reading

    def read(self, who: Hashable, model: str, targets: Sequence[Target]) -> dict[Target, Answer]:
        """The answers of `targets`: read now (no `kick`), or the last ones in, with new reads asked
        for those not fresh, and `who` kicked once they are in. A target with no answer yet is
        missing from the result."""
        if self.kick is None:
            if not targets:
                return {}
            with ThreadPoolExecutor(min(len(targets), self.threads), thread_name_prefix="rankops-metrics") as pool:
                answers = pool.map(lambda t: read_target(t, model, self.deadline_s, self.now), targets)
                return dict(zip(targets, answers))
        now = self.monotonic()
        wall = self.now()
        with self._cond:
            answers = self._answers.setdefault(who, {})
            # The reconcile that a finished round kicked takes it and asks for none: one round per
            # reconcile that asked, however long a round took (else a slow round kicks forever).
            delivered = who in self._delivered
            self._delivered.discard(who)
            for gone in [t for t in answers if t not in targets]:
                del answers[gone]
            for target in list(self._failures):
                if target[0] == who and target[1] not in targets:
                    del self._failures[target]
            queued = self._queued.get(who)
            waiting = {t for t, _ in queued} if queued else set()
            waiting |= self._in_flight.get(who, set())
            for target in targets:
                last = answers.get(target)
                if delivered or target in waiting or (last and (wall - last.at).total_seconds() < FRESH_S):
                    continue
                failures = self._failures.get((who, target))
                if failures and now < failures[1]:
                    continue
                self._queued.setdefault(who, deque()).append((target, model))
            if self._queued.get(who):
                self._start()
                self._cond.notify_all()
            return {t: a for t, a in answers.items()
                    if (wall - a.at).total_seconds() <= self.max_age_s or a.counters is None}

    def forget(self, who: Hashable) -> None:
        with self._cond:
            self._answers.pop(who, None)
            self._delivered.discard(who)
            self._queued.pop(who, None)
            for key in [k for k in self._failures if k[0] == who]:
                del self._failures[key]

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        for i in range(self.threads):
            threading.Thread(target=self._work, name=f"rankops-metrics-{i}", daemon=True).start()

    def _next(self) -> tuple[Hashable, Target, str]:
        """The next read, round-robin by model, no model above `per_model` reads at once."""
        while True:
            for who in list(self._queued):
                queue = self._queued[who]
                if not queue:
                    del self._queued[who]
                    continue
                if len(self._in_flight.get(who, ())) >= self.per_model:
                    continue
                target, model = queue.popleft()
                self._queued.move_to_end(who)   # the others come first next time
                if not queue:
                    del self._queued[who]
                self._in_flight.setdefault(who, set()).add(target)
                return who, target, model
            self._cond.wait()

    def _work(self) -> None:
        while True:
            with self._cond:
                who, target, model = self._next()
            answer = read_target(target, model, self.deadline_s, self.now)
            with self._cond:
                flying = self._in_flight.get(who, set())
                flying.discard(target)
                if who in self._answers:   # not forgotten meanwhile
                    self._answers[who][target] = answer
                if answer.counters is None:
                    count = self._failures.get((who, target), (0, 0.0))[0] + 1
                    wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (count - 1))
                    self._failures[(who, target)] = (count, self.monotonic() + wait)
                else:
                    self._failures.pop((who, target), None)
                done = not flying and not self._queued.get(who) and who in self._answers
                if done:
                    self._delivered.add(who)
                if not flying:
                    self._in_flight.pop(who, None)
                self._cond.notify_all()
            if done and self.kick is not None:
                try:
                    self.kick(who)
                except Exception:  # noqa: BLE001 - the reader thread must outlive a failed kick
                    log.exception(f"kicking {who} after its metrics round failed")


def read(kube: Any, reader: PodMetrics, who: Hashable, namespace: str, model: str,
         deployments: dict[str, dict[str, Any] | None], networks: Sequence[str] = ()) -> Snapshot:
    """The model's serving pods as the reader has them now (one pod list)."""
    pods = kube.list("Pod", namespace, labels={names.LABEL_MODEL: model})
    targets, refused, _ = serving_targets(pods, deployments, reader.replica_set_owner(kube, namespace), networks)
    answers = reader.read(who, model, targets)
    snapshot = Snapshot()
    for track, why in refused:
        snapshot.unread[track].append(why)
    for target in targets:
        answer = answers.get(target)
        if answer is None:
            snapshot.pending[target.track].append(f"{target.pod} ({target.address}): not read yet (a read is under way)")
        elif answer.counters is None:
            snapshot.unread[target.track].append(answer.problem)
        else:
            snapshot.readings[target.track][target.pod] = (answer.counters, answer.at)
    return snapshot
