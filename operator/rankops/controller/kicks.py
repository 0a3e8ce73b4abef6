"""Reconciles asked for by watch events on children and inputs, coalesced per object.

A burst of events for one model (its Deployment's status moving pod by pod, four children
applied at once) within `delay_s` becomes one reconcile, plus one more if events came while it ran: a reconcile
reads the object as it is, so nothing in between is lost. They run on a pool of their own, not on
kopf's workers that serve spec changes. A reconcile that fails is tried again after `retry_s`.
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
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable

log = logging.getLogger("rankops.kicks")


class Kicks:
    def __init__(self, run: Callable[[Hashable], None], workers: int = 8, retry_s: float = 10.0,
                 delay_s: float = 0.0, paused: Callable[[], bool] = lambda: False):
        """`delay_s`: how long a kick waits for more events of the same burst before it runs."""
        self._run = run
        self._paused = paused
        self._retry_s = retry_s
        self._delay_s = delay_s
        self._due: list[tuple[float, int, Hashable, contextvars.Context]] = []   # a heap
        self._seq = itertools.count()
        self._wake = threading.Condition()
        if delay_s > 0:
            threading.Thread(target=self._schedule, name="rankops-kick-delay", daemon=True).start()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rankops-kick")
        self._lock = threading.Lock()
        self._queued: set[Hashable] = set()
        self._running: set[Hashable] = set()
        self._again: set[Hashable] = set()

    def kick(self, key: Hashable, context: contextvars.Context | None = None) -> None:
        """Reconcile `key` soon. The caller's context (kopf's, in a handler) goes with it: kopf
        posts Events through context variables."""
        if self._paused():
            return
        context = (context or contextvars.copy_context()).copy()
        with self._lock:
            if key in self._queued:
                return
            if key in self._running:
                self._again.add(key)
                return
            self._queued.add(key)
        if self._delay_s <= 0:
            self._pool.submit(context.run, self._work, key, context)
            return
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + self._delay_s, next(self._seq), key, context))
            self._wake.notify()

    def _schedule(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, key, context = heapq.heappop(self._due)
            self._pool.submit(context.run, self._work, key, context)

    def _work(self, key: Hashable, context: contextvars.Context) -> None:
        with self._lock:
            self._queued.discard(key)
            if self._paused():   # paused since it was asked for
                return
            self._running.add(key)
        try:
            self._run(key)
        except Exception as exc:  # noqa: BLE001 - logged, and tried again
            log.warning(f"reconcile of {key} asked by a watch event failed ({exc}); again in {self._retry_s:.0f} s")
            timer = threading.Timer(self._retry_s, self.kick, (key, context))
            timer.daemon = True
            timer.start()
        finally:
            with self._lock:
                self._running.discard(key)
                again = key in self._again
                self._again.discard(key)
            if again:
                self.kick(key, context)
