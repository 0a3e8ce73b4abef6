"""Reconciles asked for by watch events on children and inputs, coalesced per object.

A burst of events for one model (its Deployment's status moving pod by pod, four children
applied at once) within `delay_s` becomes one reconcile, plus one more if events came while it ran: a reconcile
reads the object as it is, so nothing in between is lost. They run on a pool of their own, not on
kopf's workers that serve spec changes. A reconcile that fails is tried again after `retry_s`.
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


class Kicks:
    def __init__(self, run: Callable[[Hashable], None], workers: int = 8, retry_s: float = 10.0,
                 delay_s: float = 0.0, paused: Callable[[], bool] = lambda: False, start: bool = True,
                 context: Callable[[], contextvars.Context | None] = lambda: None):
        """`delay_s`: how long a kick waits for more events of the same burst before it runs.
        `start`: start its threads now (False: at `start()`; kicks queue until then).
        `context`: the context each reconcile runs in a copy of (None: the worker thread's own)."""
        self._run = run
        self._context = context
        self._paused = paused
        self._retry_s = retry_s
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
        except Exception as exc:  # noqa: BLE001 - logged, and tried again
            log.warning(f"reconcile of {key} asked by a watch event failed ({exc}); again in {self._retry_s:.0f} s")
            timer = threading.Timer(self._retry_s, self.kick, (key,))
            timer.daemon = True
            timer.start()
        finally:
            with self._lock:
                self._running.discard(key)
                again = self._again.pop(key, None)
            if again is not None:
                self.kick(key, urgent=again == URGENT)
