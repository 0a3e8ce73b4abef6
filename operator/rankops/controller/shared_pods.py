"""A shared server's shell for its pods (issue 42): reads each pod's repository index for
serverplan.plan_server, remembers per pod what the plan must be told, and sends the plan's loads
and unloads.

What it remembers, per pod (by uid: a pod replaced under the same name starts afresh):
- each member's last load refusal, and what kind: a refusal because the pod's stager has not
  fetched the member's files yet (serverplan.not_staged) is a wait, bounded by `staging_wait_s`
  from the first such refusal (then the plan says Failed with Triton's words); any other is a
  failure, loaded again after the work queue's backoff (doubling per failure in a row, capped);
- the digest of the config each member was loaded with, so an edited config is loaded again.

Every request to a pod is bounded (the repository client's deadlines) and runs on a worker thread
(controller/pod_work.py), at most one action per pod and member at once: a pod that accepts and
never answers costs a worker its deadline, never the caller. An action asked again while it is in flight is not sent
twice, nor is a load that ended after the index it was planned from was read (that index could not
show it), unless its config changed since.

`round` is one read -> plan -> execute; the controller calls it per reconcile with what it read
from its caches, and applies the plan's objects itself.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankops.controller.pod_work import PodWork
from rankops.controller.workqueue import RETRY_CAP_S, RETRY_FIRST_S, Backoff
from rankops.render.serving import HTTP_PORT, config_hash
from rankops.serverplan import PodView, ServerPlan, not_staged
from rankops.triton.repository import INDEX_DEADLINE_S, IndexEntry, Repository, RepositoryError, config_json

LOAD_DEADLINE_S = 600.0
UNLOAD_DEADLINE_S = 60.0

# The override a load sends, from the member's rendered config.pbtxt (a test image on a CPU edits it).
LoadConfig = Callable[[str], dict[str, Any]]


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

    @property
    def reachable(self) -> bool:
        """Worth asking: ready, not draining, with an address."""
        return self.ready and not self.terminating and bool(self.ip)


class PodRecord:
    """What one pod's loads taught: the plan's `load_errors`, `retry`, `staging_over` and `loaded`.
    A failed member is loaded again after the queue's Backoff (doubling per failure in a row)."""

    def __init__(self, retry_first_s: float = RETRY_FIRST_S, retry_cap_s: float = RETRY_CAP_S):
        self.load_errors: dict[str, str] = {}       # member -> its last load's refusal
        self.retry_at: dict[str, float] = {}        # failed member -> when its backoff is over
        self.waiting_since: dict[str, float] = {}   # member -> its first not-staged refusal
        self.loaded: dict[str, str] = {}            # member -> digest of the config it was loaded with
        self._backoff = Backoff(retry_first_s, retry_cap_s)

    def after_load(self, member: str, digest: str, now: float, error: str = "", staging: bool = False,
                   staging_wait_s: float = float("inf")) -> None:
        """Note a load's answer: `error` its refusal, `staging` when only its files were missing
        (a wait until `staging_wait_s` after the first such refusal, a failure after)."""
        if not error:
            self.forget(member)
            self.loaded[member] = digest
            return
        self.load_errors[member] = error
        if staging:
            if now - self.waiting_since.setdefault(member, now) < staging_wait_s:
                return
        else:
            self.waiting_since.pop(member, None)
        self.retry_at[member] = now + self._backoff.failed(member)

    def forget(self, member: str) -> None:
        for record in (self.load_errors, self.retry_at, self.waiting_since, self.loaded):
            record.pop(member, None)
        self._backoff.succeeded(member)

    def retry(self, members: Collection[str], now: float) -> frozenset[str]:
        """The members a failed load may be sent again for: none failed here, or their backoff is over."""
        return frozenset(m for m in members if now >= self.retry_at.get(m, now))

    def staging_over(self, now: float, wait_s: float) -> frozenset[str]:
        return frozenset(m for m, since in self.waiting_since.items() if now - since >= wait_s)


class ServerPods:
    """Reads and loads for one shared server's pods (see the module's docstring). `headers`: the
    server's API key header; `staging_wait_s`: how long a member's files may take to arrive (the
    server's fetch deadline); `load_config`: the override sent for a member's config text."""

    def __init__(self, headers: Mapping[str, str] | None, staging_wait_s: float,
                 load_config: LoadConfig = config_json, index_deadline_s: float = INDEX_DEADLINE_S,
                 load_deadline_s: float = LOAD_DEADLINE_S, retry_first_s: float = RETRY_FIRST_S,
                 retry_cap_s: float = RETRY_CAP_S, workers: int = 8, clock: Callable[[], float] = time.monotonic):
        self.headers, self.staging_wait_s, self.load_config = headers, staging_wait_s, load_config
        self.index_deadline_s, self.load_deadline_s = index_deadline_s, load_deadline_s
        self.retry_first_s, self.retry_cap_s, self.clock = retry_first_s, retry_cap_s, clock
        self._work = PodWork(workers, "shared")
        self._lock = threading.Lock()
        self._records: dict[str, PodRecord] = {}                   # pod uid -> its record
        self._pods: dict[str, ServerPod] = {}                      # pod name -> as last read
        self._indexes: dict[str, tuple[IndexEntry, ...]] = {}      # pod name -> its index as last read
        self._ended: dict[tuple[str, str], tuple[str, float]] = {}   # (pod, member) -> (digest, when it loaded)
        self._read_at = 0.0
        self.errors: dict[tuple[str, str], str] = {}               # (pod, member) -> its last unload's failure
        self.sent: list[tuple[str, str, str]] = []                 # (pod, action, member), in order

    # --- reads
    def read(self, pods: Sequence[ServerPod], members: Collection[str]) -> list[PodView]:
        """The plan's view of `pods`: each reachable pod's index (read at once, each within its
        deadline) with what this shell remembers of it. `members`: those the plan is asked about."""
        now = self._read_at = self.clock()
        reachable = [p for p in pods if p.reachable]
        indexes = dict(zip([p.name for p in reachable], self._work.read_all(self._index, reachable)))
        with self._lock:
            self._pods = {p.name: p for p in pods}
            self._records = {p.uid: self._records.get(p.uid) or self._new_record() for p in pods}
            self._indexes = {name: index for name, (index, _) in indexes.items() if index is not None}
            views = []
            for pod in pods:
                record = self._records[pod.uid]
                index, error = indexes.get(pod.name, (None, ""))
                views.append(PodView(pod.name, pod.ready, pod.ip, pod.node, index, error,
                                     load_errors=dict(record.load_errors),
                                     retry=record.retry(members, now),
                                     staging_over=record.staging_over(now, self.staging_wait_s),
                                     loaded=dict(record.loaded), terminating=pod.terminating))
        return views

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
                    continue        # loaded after the index was read: that index could not show it
                if self._submit(pod, "load", member, lambda pod=pod, member=member, text=text, digest=digest:
                                self._load(pod, member, text, digest)):
                    started.append((pod_name, "load", member))
        return started

    def round(self, plan: Callable[[list[PodView]], ServerPlan], pods: Sequence[ServerPod],
              members: Collection[str]) -> ServerPlan:
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

    def _submit(self, pod: ServerPod, action: str, member: str, run: Callable[[], None]) -> bool:
        if not self._work.start((pod.name, member), run):
            return False
        with self._lock:
            self.sent.append((pod.name, action, member))
        return True

    def _new_record(self) -> PodRecord:
        return PodRecord(self.retry_first_s, self.retry_cap_s)

    def _record(self, pod: ServerPod) -> PodRecord:
        if pod.uid not in self._records:
            self._records[pod.uid] = self._new_record()
        return self._records[pod.uid]

    def _load(self, pod: ServerPod, member: str, text: str, digest: str) -> None:
        index = self._indexes.get(pod.name, ())
        error, staging = "", False
        try:
            self._repository(pod).load(member, self.load_config(text), deadline_s=self.load_deadline_s)
        except RepositoryError as exc:
            error, staging = str(exc), not_staged(str(exc), member, index)
        except Exception as exc:  # noqa: BLE001 - a worker's failure is an answer for status, not a dead thread
            error = f"{pod.name}: load of {member} not sent or not answered ({type(exc).__name__}: {exc})"
        now = self.clock()
        with self._lock:
            self._record(pod).after_load(member, digest, now, error, staging, self.staging_wait_s)
            if not error:
                self._ended[(pod.name, member)] = (digest, now)

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
