"""A shared server's shell for its pods (issue 42): reads each pod's repository index for
serverplan.plan_server, remembers per pod what the plan must be told, and sends the plan's loads
and unloads.

What it remembers, per pod (by uid: a pod replaced under the same name starts afresh) and per
member (forgotten once the member is no longer asked about: one that comes back starts afresh):
- each member's last load refusal, and what kind. A refusal because the pod's stager has not
  fetched the member's files yet (serverplan.not_staged) is a wait: the stager fetches the
  members one after another, so the member at position k of the server's list may wait k + 1
  times `staging_wait_s` (the fetch deadline) from its first such refusal; then it is a failure
  with Triton's words. Any other refusal is a failure: loaded again after the work queue's backoff
  (doubling per failure in a row, capped), or at once for a new config (`refused`: the digest refused);
- the digest of the config each member was loaded with, so an edited config is loaded again. A
  load whose answer never came (its deadline passed) is neither: the member is Loading in the
  index while Triton works on, and its digest counts once the index shows it READY.

Every request to a pod is bounded (the repository client's deadlines) and runs on a worker thread
(controller/pod_work.py), at most one action per pod and member at once: a pod that accepts and
never answers costs a worker its deadline, and a read of many pods at most its deadline and a
margin, never the caller more. An action asked again while it is in flight is not sent twice, nor
a load whose answer came after the index it was planned from was read (that index could not show
it), unless its config changed since.

`round` is one read -> plan -> execute; the controller calls it per reconcile with what it read
from its caches, applies the plan's objects itself, and comes back by `next_due_s` (a backoff or
a wait ending) or when a load in flight ends (`on_done`).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankops.controller.pod_work import PodWork
from rankops.controller.workqueue import RETRY_CAP_S, RETRY_FIRST_S, Backoff
from rankops.render.serving import HTTP_PORT, METRICS_PORT, config_hash
from rankops.server_autoscale import MAX_READ_PODS, pod_reading
from rankops.serverplan import PodView, ServerPlan, not_staged
from rankops.triton import metrics
from rankops.triton.repository import (INDEX_DEADLINE_S, LOAD_DEADLINE_S, UNLOAD_DEADLINE_S, IndexEntry, Repository,
                                       RepositoryError, config_json)

# The override a load sends, from the member's rendered config.pbtxt (a test image on a CPU edits it).
LoadConfig = Callable[[str], dict[str, Any]]
READ_MARGIN_S = 1.0     # a read of every pod waits at most its deadline and this
MAX_SENT = 10_000       # `sent` keeps the newest half once it holds this many


@dataclass(frozen=True)
class ServerPod:
    """One pod of the server, as the caller read it from its cache."""
    name: str
    uid: str
    ip: str
    ready: bool
    node: str | None = None
    terminating: bool = False
    port: int = HTTP_PORT
    metrics_port: int = METRICS_PORT

    @property
    def reachable(self) -> bool:
        """Worth asking: ready, not draining, with an address."""
        return self.ready and not self.terminating and bool(self.ip)


class PodRecord:
    """What one pod's loads taught: the plan's `load_errors`, `retry`, `staging_over`, `loaded` and
    `refused`. A failed member is loaded again after the queue's Backoff (doubling per failure in a row)."""

    def __init__(self, retry_first_s: float = RETRY_FIRST_S, retry_cap_s: float = RETRY_CAP_S):
        self.load_errors: dict[str, str] = {}       # member -> its last load's refusal
        self.refused: dict[str, str] = {}           # member -> digest of the config whose load was refused
        self.retry_at: dict[str, float] = {}        # failed member -> when its backoff is over
        self.waiting_since: dict[str, float] = {}   # member -> its first not-staged refusal
        self.loaded: dict[str, str] = {}            # member -> digest of the config it was loaded with
        self.unanswered: dict[str, str] = {}        # member -> digest of a load whose answer never came
        self._backoff = Backoff(retry_first_s, retry_cap_s)

    def after_load(self, member: str, digest: str, now: float, error: str = "", staging: bool = False,
                   staging_wait_s: float = float("inf")) -> None:
        """Note a load's answer: `error` its refusal, `staging` when only its files were missing
        (a wait until `staging_wait_s` after the first such refusal, a failure after)."""
        self.unanswered.pop(member, None)
        if not error:
            self.forget(member)
            self.loaded[member] = digest
            return
        self.load_errors[member] = error
        self.refused[member] = digest
        if staging:
            if now - self.waiting_since.setdefault(member, now) < staging_wait_s:
                return
        else:
            self.waiting_since.pop(member, None)
        self.retry_at[member] = now + self._backoff.failed(member)

    def unanswered_load(self, member: str, digest: str) -> None:
        self.unanswered[member] = digest

    def seen_ready(self, member: str) -> None:
        """The index shows the member READY: a load whose answer never came took."""
        if member in self.unanswered:
            self.after_load(member, self.unanswered[member], 0.0)

    def forget(self, member: str) -> None:
        for record in (self.load_errors, self.refused, self.retry_at, self.waiting_since, self.loaded,
                       self.unanswered):
            record.pop(member, None)
        self._backoff.succeeded(member)

    def keep_only(self, members: Sequence[str]) -> None:
        for member in {*self.load_errors, *self.refused, *self.retry_at, *self.waiting_since, *self.loaded,
                       *self.unanswered} \
                - set(members):
            self.forget(member)

    def retry(self, members: Sequence[str], now: float) -> frozenset[str]:
        """The members a failed load may be sent again for: none failed here, or their backoff is over."""
        return frozenset(m for m in members if now >= self.retry_at.get(m, now))

    def staging_over(self, members: Sequence[str], now: float, wait_s: float) -> frozenset[str]:
        """Those waited for long enough: the member at position k of `members` k + 1 times `wait_s`."""
        position = {m: i for i, m in enumerate(members)}
        return frozenset(m for m, since in self.waiting_since.items()
                         if now - since >= wait_s * (position.get(m, len(members)) + 1))

    def next_due(self, members: Sequence[str], wait_s: float, now: float) -> float | None:
        """When something here next changes by time alone (a backoff over, a wait over), as the
        clock reads; what is over already is not due again (a load answered moves it on)."""
        position = {m: i for i, m in enumerate(members)}
        dues = [*self.retry_at.values(),
                *(since + wait_s * (position.get(m, len(members)) + 1) for m, since in self.waiting_since.items())]
        dues = [d for d in dues if d > now]
        return min(dues) if dues else None


class ServerPods:
    """Reads and loads for one shared server's pods (see the module's docstring). `headers`: the
    server's API key header; `staging_wait_s`: how long one member's files may take to arrive (the
    server's fetch deadline); `load_config`: the override sent for a member's config text;
    `on_done`: called after each load or unload ends (the controller's kick)."""

    def __init__(self, headers: Mapping[str, str] | None, staging_wait_s: float,
                 load_config: LoadConfig = config_json, index_deadline_s: float = INDEX_DEADLINE_S,
                 load_deadline_s: float = LOAD_DEADLINE_S, retry_first_s: float = RETRY_FIRST_S,
                 retry_cap_s: float = RETRY_CAP_S, workers: int = 8, clock: Callable[[], float] = time.monotonic,
                 on_done: Callable[[], None] = lambda: None):
        self.headers, self.staging_wait_s, self.load_config = headers, staging_wait_s, load_config
        self.index_deadline_s, self.load_deadline_s = index_deadline_s, load_deadline_s
        self.retry_first_s, self.retry_cap_s, self.clock, self.on_done = retry_first_s, retry_cap_s, clock, on_done
        self._work = PodWork(workers, "shared")
        self._metrics_work = PodWork(workers, "shared-metrics")   # a slow metrics page never delays an index read
        self._lock = threading.Lock()
        self._records: dict[str, PodRecord] = {}                   # pod uid -> its record
        self._pods: dict[str, ServerPod] = {}                      # pod name -> as last read
        self._indexes: dict[str, tuple[IndexEntry, ...]] = {}      # pod name -> its index as last read
        self._members: tuple[str, ...] = ()                        # the members last asked about, in order
        self._ended: dict[tuple[str, str], tuple[str, float]] = {}   # (pod, member) -> (digest, when answered)
        self._read_at = 0.0
        self.errors: dict[tuple[str, str], str] = {}               # (pod, member) -> its last unload's failure
        self.sent: list[tuple[str, str, str]] = []                 # (pod, action, member), in order
        self.unread: tuple[str, ...] = ()                          # reachable pods whose index the last read lacks
        self._last_index: dict[str, tuple[IndexEntry, ...]] = {}  # pod uid -> its last index read, while Ready

    # --- reads
    def read(self, pods: Sequence[ServerPod], members: Sequence[str],
             known_configs: Mapping[str, str] | None = None) -> list[PodView]:
        """The plan's view of `pods`: each reachable pod's index (read at once, each within its
        deadline) with what this shell remembers of it. `members`: those the plan is asked about,
        in the server's order (what is remembered of any other is forgotten). `known_configs`:
        member -> the digest of the config its serving pods loaded (the server's status): where this
        process has no record of a member a pod serves, that is its record (an edit made while the
        operator was down is loaded all the same)."""
        now = self._read_at = self.clock()
        reachable = [p for p in pods if p.reachable]
        unread = (None, f"index not read within {self.index_deadline_s + READ_MARGIN_S:g} s")
        indexes = dict(zip([p.name for p in reachable],
                           self._work.read_all(self._index, reachable, self.index_deadline_s + READ_MARGIN_S, unread)))
        with self._lock:
            names = {p.name for p in pods}
            self._pods, self._members = {p.name: p for p in pods}, tuple(members)
            self._records = {p.uid: self._records.get(p.uid) or self._new_record() for p in pods}
            self._indexes = {name: index for name, (index, _) in indexes.items() if index is not None}
            self.unread = tuple(sorted(name for name, (index, _) in indexes.items() if index is None))
            # A pod's last index read stands for its endpoints while a read misses (a slow Triton keeps
            # its traffic); a pod not Ready forgets it (a restarted Triton holds no member).
            last = {}
            for p in pods:
                read_now = indexes.get(p.name, (None, ""))[0]
                if p.reachable and (read_now is not None or p.uid in self._last_index):
                    last[p.uid] = read_now if read_now is not None else self._last_index[p.uid]
            self._last_index = last
            self._ended = {k: v for k, v in self._ended.items() if k[0] in names and k[1] in members}
            self.errors = {k: v for k, v in self.errors.items() if k[0] in names}
            views = []
            for pod in pods:
                record = self._records[pod.uid]
                record.keep_only(members)
                index, error = indexes.get(pod.name, (None, ""))
                for entry in index or ():
                    if entry.state == "READY":
                        record.seen_ready(entry.name)
                        if entry.name not in record.loaded and entry.name in (known_configs or {}):
                            record.loaded[entry.name] = known_configs[entry.name]
                views.append(PodView(pod.name, pod.ready, pod.ip, pod.node, index, error,
                                     load_errors=dict(record.load_errors),
                                     retry=record.retry(members, now),
                                     staging_over=record.staging_over(members, now, self.staging_wait_s),
                                     loaded=dict(record.loaded), refused=dict(record.refused),
                                     terminating=pod.terminating,
                                     last_index=None if index is not None else self._last_index.get(pod.uid),
                                     uid=pod.uid))
        return views

    def read_load(self, pods: Sequence[ServerPod], members: Sequence[str], now: Callable[[], Any],
                  most: int = MAX_READ_PODS) -> tuple[dict[str, Any], tuple[str, ...], int]:
        """({pod: server_autoscale.pod_reading} of the reachable pods, the first `most` by name, each
        metrics page read at once within its deadline and parsed for `members` only; the pods asked
        and not read, with why; the reachable pods not asked). A page is Triton's, but a member's
        model runs code of its tenant's in that process: every read is bounded like any pod's answer."""
        reachable = sorted((p for p in pods if p.reachable), key=lambda p: p.name)
        asked = reachable[:most]
        unread = (None, f"metrics not read within {self.index_deadline_s + READ_MARGIN_S:g} s")
        pages = self._metrics_work.read_all(lambda pod: self._metrics(pod, members, now), asked,
                                    self.index_deadline_s + READ_MARGIN_S, unread)
        reading = {pod.name: read for pod, (read, _) in zip(asked, pages) if read is not None}
        problems = tuple(f"{pod.name}: {error}" for pod, (read, error) in zip(asked, pages) if read is None)
        return reading, problems, len(reachable) - len(asked)

    def _metrics(self, pod: ServerPod, members: Sequence[str], now: Callable[[], Any]) -> tuple[dict | None, str]:
        try:
            page = metrics.fetch(pod.ip, pod.metrics_port, self.index_deadline_s)
            at = now()          # when the counters were Triton's: the rate's window, whatever parsing takes
            seen = {member: c for member, c in metrics.parse_models(page, members).items() if c.seen}
            # served + shed: what was asked and could be served (a request refused for bad inputs is no load)
            return pod_reading(at, {m: c.values["success"] + c.values["rejected"] for m, c in seen.items()},
                               {m: c.values["rejected"] for m, c in seen.items()},
                               {m: c.values["success"] for m, c in seen.items()},
                               {m: c.values["queue_us"] for m, c in seen.items()}), ""
        except metrics.MetricsUnavailable as exc:
            return None, str(exc)[:300]
        except Exception as exc:  # noqa: BLE001 - a pod answers what it likes: never an exception out of a read
            return None, f"metrics not read ({type(exc).__name__})"

    def adopt(self, adopted: Mapping[tuple[str, str], str]) -> None:
        """(pod, member) -> the digest of the config a member's version switch left it loaded with
        (serverplan.ServerPlan.adopted): this shell's record of the pod, so it is not loaded again."""
        with self._lock:
            for (pod_name, member), digest in adopted.items():
                pod = self._pods.get(pod_name)
                record = self._records.get(pod.uid) if pod is not None else None
                if record is not None:
                    record.loaded[member] = digest

    def read_p99s(self, pods: Sequence[ServerPod], member: str, version: int, others: Sequence[str] = (),
                  most: int = MAX_READ_PODS) -> tuple[float | None, dict[str, float]]:
        """The worst P99 (ms) of `member` at Triton `version` over the reachable pods' latency windows
        (None when no pod reports one), and each of `others`' worst (any version), from each pod's
        metrics page read once, at once, each bounded."""
        asked = sorted((p for p in pods if p.reachable), key=lambda p: p.name)[:most]

        def p99s(pod: ServerPod) -> dict[str, float] | None:
            try:
                page = metrics.fetch(pod.ip, pod.metrics_port, self.index_deadline_s)
                found = {**metrics.parse_models(page, list(others)), member: metrics.parse_models(
                    page, [member], str(version))[member]}
            except Exception:  # noqa: BLE001 - unread: the switch starts no load without its P99
                return None
            return {m: c.quantiles_us[0.99] / 1000 for m, c in found.items() if c.quantiles_us.get(0.99) is not None}

        worst: dict[str, float] = {}
        for read in self._metrics_work.read_all(p99s, asked, self.index_deadline_s + READ_MARGIN_S):
            for m, value in (read or {}).items():
                worst[m] = max(value, worst.get(m, 0.0))
        own = worst.pop(member, None)
        return own, worst

    def next_due_s(self) -> float | None:
        """Seconds until a backoff or a wait of the members last read ends (None: none is running)."""
        now = self.clock()
        with self._lock:
            dues = [d for r in self._records.values() if (d := r.next_due(self._members, self.staging_wait_s, now))]
        return max(0.0, min(dues) - now) if dues else None

    def _index(self, pod: ServerPod) -> tuple[tuple[IndexEntry, ...] | None, str]:
        try:
            return tuple(self._repository(pod).index(self.index_deadline_s)), ""
        except RepositoryError as exc:
            return None, str(exc)
        except Exception as exc:  # noqa: BLE001 - a pod answers what it likes: never an exception out of a read
            return None, f"{pod.name}: index not read ({type(exc).__name__})"

    def _repository(self, pod: ServerPod) -> Repository:
        return Repository(pod.ip, pod.port, self.headers)

    # --- actions
    def execute(self, plan: ServerPlan) -> list[tuple[str, str, str]]:
        """Start the plan's unloads and loads on the pods last read; those started."""
        started = []
        for pod_name, actions in sorted(plan.actions.items()):
            pod = self._pods.get(pod_name)
            if pod is None or not pod.reachable:
                continue
            for member in actions.unload:
                if self._submit(pod, "unload", member, lambda pod=pod, member=member: self._unload(pod, member)):
                    started.append((pod_name, "unload", member))
            for member in actions.load:
                if member not in plan.configs:
                    continue
                text = plan.configs[member][1]
                digest = config_hash(text)
                with self._lock:
                    ended = self._ended.get((pod_name, member))
                if ended is not None and ended[0] == digest and ended[1] >= self._read_at:
                    continue        # answered after the index was read: that index could not show it
                if self._submit(pod, "load", member, lambda pod=pod, member=member, text=text, digest=digest:
                                self._load(pod, member, text, digest)):
                    started.append((pod_name, "load", member))
        return started

    def round(self, plan: Callable[[list[PodView]], ServerPlan], pods: Sequence[ServerPod],
              members: Sequence[str]) -> ServerPlan:
        """One read -> plan -> execute: `plan` is plan_server with everything but the pods bound."""
        planned = plan(self.read(pods, members))
        self.execute(planned)
        return planned

    def in_flight(self) -> list[tuple[str, str]]:
        return self._work.in_flight()

    def settle(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the actions in flight; for tests and shutdown."""
        self._work.settle(timeout_s)

    def close(self) -> None:
        self._work.close()
        self._metrics_work.close()

    def _submit(self, pod: ServerPod, action: str, member: str, run: Callable[[], None]) -> bool:
        def then_say() -> None:
            try:
                run()
            finally:
                self.on_done()
        if not self._work.start((pod.name, member), then_say):
            return False
        with self._lock:
            self.sent.append((pod.name, action, member))
            if len(self.sent) > MAX_SENT:
                del self.sent[:MAX_SENT // 2]
        return True

    def _new_record(self) -> PodRecord:
        return PodRecord(self.retry_first_s, self.retry_cap_s)

    def _record(self, pod: ServerPod) -> PodRecord:
        if pod.uid not in self._records:
            self._records[pod.uid] = self._new_record()
        return self._records[pod.uid]

    def _load(self, pod: ServerPod, member: str, text: str, digest: str) -> None:
        index = self._indexes.get(pod.name, ())
        error, staging, answered = "", False, True
        try:
            self._repository(pod).load(member, self.load_config(text), deadline_s=self.load_deadline_s)
        except RepositoryError as exc:      # Triton's answer: a refusal
            error, staging = str(exc), not_staged(str(exc), member, index)
        except Exception:  # noqa: BLE001 - no answer (deadline, connection): the index says what became of it
            answered = False
        now = self.clock()
        with self._lock:
            position = self._members.index(member) if member in self._members else len(self._members)
            record = self._record(pod)
            if answered:
                record.after_load(member, digest, now, error, staging, self.staging_wait_s * (position + 1))
                self._ended[(pod.name, member)] = (digest, now)
            else:
                record.unanswered_load(member, digest)

    def _unload(self, pod: ServerPod, member: str) -> None:
        try:
            self._repository(pod).unload(member, deadline_s=UNLOAD_DEADLINE_S)
        except Exception as exc:  # noqa: BLE001 - said in status; the plan asks again while the pod holds it
            with self._lock:
                self.errors[(pod.name, member)] = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self.errors.pop((pod.name, member), None)
            self._record(pod).forget(member)
            self._ended.pop((pod.name, member), None)
