"""When an object is reconciled with no event to say so: at the deadline its last reconcile's plan
gave (`after_s`: a RankingModel's rollout.deadlines, a pool's next stale report), `interval` after
its last reconcile while it polls what no watch reports (`needs_clock`: a model's pods' readings),
and `resync` after it otherwise (the level-based catch-all for anything a watch missed).

kopf's timers did this, but kopf puts a finalizer on every object that has a timer: one more write
per new model, and a model that cannot be deleted while the operator is down. Each timer was also
an asyncio task per object, ticking whether or not a reconcile had just run; this clock counts from
the last reconcile, so a model reconciled by an event is not reconciled again by the clock.
"""
from __future__ import annotations

import heapq
import threading
import time
from typing import Callable, Hashable


class Clock:
    def __init__(self, kick: Callable[[Hashable], None], interval_s: float, resync_s: float,
                 clock: Callable[[], float] = time.monotonic, start: bool = True):
        self._kick = kick
        self.interval_s, self.resync_s = interval_s, resync_s
        self._clock = clock
        self._due: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []   # (due, seq, key); stale entries skipped
        self._seq = 0
        self._wake = threading.Condition()
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        if not self._started:
            self._started = True
            threading.Thread(target=self._loop, name="rankops-clock", daemon=True).start()

    def reconciled(self, key: Hashable, needs_clock: bool, after_s: float | None = None) -> None:
        """`key` was reconciled just now; `needs_clock`: it polls (again at `interval`); `after_s`: it has a
        deadline of its own sooner than that (a model's requeue_after, a pool's next stale report)."""
        wait = self.interval_s if needs_clock else self.resync_s
        due = self._clock() + (min(wait, after_s) if after_s is not None else wait)
        with self._wake:
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, key))
            self._wake.notify()

    def forget(self, key: Hashable) -> None:
        with self._wake:
            self._due.pop(key, None)

    def take_due(self) -> list[Hashable]:
        """The keys due by now, each once (the reconcile they get schedules them again)."""
        now, found = self._clock(), []
        with self._wake:
            while self._heap and self._heap[0][0] <= now:
                due, _, key = heapq.heappop(self._heap)
                if self._due.get(key) == due:
                    del self._due[key]
                    found.append(key)
        return found

    def _next_in_locked(self) -> float | None:
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)   # superseded by a later reconcile, or forgotten
        return self._heap[0][0] - self._clock() if self._heap else None

    def _loop(self) -> None:
        while True:
            with self._wake:   # computed and waited on under one hold: no notify is missed
                wait = self._next_in_locked()
                if wait is None or wait > 0:
                    self._wake.wait(min(wait, 60.0) if wait is not None else 60.0)
                    continue
            for key in self.take_due():
                self._kick(key)
