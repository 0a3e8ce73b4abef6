"""The work queue: reconciles asked for (kicks) by watch events, the clock and the plan pool,
coalesced per object.

A burst of events for one model (its Deployment's status moving pod by pod, four children
applied at once) within `delay_s` becomes one reconcile, plus one more if events came while it ran: a reconcile
reads the object as it is, so nothing in between is lost. They run on a pool of their own, not on
kopf's workers that serve spec changes. A reconcile that fails is tried again with a per-object
exponential backoff (Backoff: `retry_s`, doubling up to `retry_cap_s`, reset by a success), as
controller-runtime's rate limiter does; `failed` is told each failure and when the next try is.
Each runs in a copy of one context (`context()`: kopf's, which kopf.event() needs), never in the
caller's: a kick asked in a kopf handler would keep that handler's event (its body, its patch)
alive for as long as it waits, and at N=1000 ~3,000 waiting kicks held ~30 MB so.
While `paused()` says so (a standby replica: kopf peering), kicks do nothing, the queued and
the retried ones included: the replica that acts reconciles those objects.
"""
from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import threading
import time
from typing import Callable, Hashable

log = logging.getLogger("rankops.kicks")


URGENT, NORMAL = 0, 1
RETRY_FIRST_S, RETRY_CAP_S = 2.0, 300.0


class Backoff:
    """Per object: how long until a failing reconcile is tried again. The first failure waits
    `first_s`, each one after doubles it up to `cap_s`; a success starts it over."""

    def __init__(self, first_s: float = RETRY_FIRST_S, cap_s: float = RETRY_CAP_S):
        self.first_s, self.cap_s = first_s, cap_s
        self._failures: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def failed(self, key: Hashable) -> float:
        """One more failure of `key`: the seconds until its next try."""
        with self._lock:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
        return min(self.cap_s, self.first_s * 2 ** min(failures - 1, 62))

    def succeeded(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class WorkQueue:
    def __init__(self, run: Callable[[Hashable], None], workers: int = 8, retry_s: float = RETRY_FIRST_S,
                 delay_s: float = 0.0, paused: Callable[[], bool] = lambda: False, start: bool = True,
                 context: Callable[[], contextvars.Context | None] = lambda: None,
                 retry_cap_s: float = RETRY_CAP_S,
                 failed: Callable[[Hashable, Exception, float], None] = lambda key, exc, retry_in: None):
        """`delay_s`: how long a kick waits for more events of the same burst before it runs.
        `start`: start its threads now (False: at `start()`; kicks queue until then).
        `context`: the context each reconcile runs in a copy of (None: the worker thread's own).
        `retry_s`, `retry_cap_s`: a failing object's first retry, and the most it waits (Backoff).
        `failed`: told (key, error, seconds to the next try) when a reconcile fails, in its context."""
        self._run = run
        self._context = context
        self._paused = paused
        self.backoff = Backoff(retry_s, retry_cap_s)
        self._failed = failed
        self._delay_s = delay_s
        self._due: list[tuple[float, int, int, Hashable]] = []   # a heap, by time
        self._ready: list[tuple[int, int, Hashable]] = []        # a heap, by priority
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._lock = threading.Lock()
        self._queued: dict[Hashable, tuple[int, int]] = {}   # key -> (priority, seq) of its live entry
        self._running: set[Hashable] = set()
        self._again: dict[Hashable, int] = {}                # key -> the most urgent priority asked meanwhile
        self._workers = workers
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self._delay_s > 0:
            threading.Thread(target=self._schedule, name="rankops-kick-delay", daemon=True).start()
        for i in range(self._workers):
            threading.Thread(target=self._worker, name=f"rankops-kick_{i}", daemon=True).start()

    def kick(self, key: Hashable, urgent: bool = False) -> None:
        """Reconcile `key` soon. `urgent` runs it before the other queued kicks:
        a model whose children moved (a Deployment now Available) is told before new models are
        built, so it says Ready when its pods are, not after the whole burst."""
        if self._paused():
            return
        priority = URGENT if urgent else NORMAL
        with self._lock:
            queued = self._queued.get(key)
            if queued is not None and queued[0] <= priority:
                return
            if key in self._running:
                self._again[key] = min(priority, self._again.get(key, NORMAL))
                return
            seq = next(self._seq)
            self._queued[key] = (priority, seq)   # an entry already queued at a lower priority is skipped
        with self._wake:
            if self._delay_s > 0 and queued is None:
                heapq.heappush(self._due, (time.monotonic() + self._delay_s, seq, priority, key))
            else:
                heapq.heappush(self._ready, (priority, seq, key))
            self._wake.notify_all()

    def _schedule(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, seq, priority, key = heapq.heappop(self._due)
                heapq.heappush(self._ready, (priority, seq, key))
                self._wake.notify_all()

    def _worker(self) -> None:
        while True:
            with self._wake:
                while not self._ready:
                    self._wake.wait()
                _, seq, key = heapq.heappop(self._ready)
            with self._lock:
                if self._queued.get(key, (None, None))[1] != seq:
                    continue   # superseded by a more urgent entry of the same key
            base = self._context()
            (base.copy() if base is not None else contextvars.copy_context()).run(self._work, key)

    def _work(self, key: Hashable) -> None:
        with self._lock:
            self._queued.pop(key, None)
            if self._paused():   # paused since it was asked for
                return
            self._running.add(key)
        try:
            self._run(key)
        except Exception as exc:  # noqa: BLE001 - logged, said, and tried again after a backoff
            retry_in = self.backoff.failed(key)
            log.warning(f"reconcile of {key} failed ({exc}); again in {retry_in:.0f} s")
            timer = threading.Timer(retry_in, self.kick, (key,))
            timer.daemon = True
            timer.start()
            try:
                self._failed(key, exc, retry_in)
            except Exception as said:  # noqa: BLE001 - saying it must not stop the retry
                log.debug(f"could not say that {key} failed: {said}")
        else:
            self.backoff.succeeded(key)
        finally:
            with self._lock:
                self._running.discard(key)
                again = self._again.pop(key, None)
            if again is not None:
                self.kick(key, urgent=again == URGENT)
