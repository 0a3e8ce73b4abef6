"""Reconciles asked for by watch events on children and inputs, coalesced per object.

A burst of events for one model (its Deployment's status moving pod by pod, four children
applied at once) becomes one reconcile, plus one more if events came while it ran: a reconcile
reads the object as it is, so nothing in between is lost. They run on a pool of their own, not on
kopf's workers that serve spec changes. A reconcile that fails is tried again after `retry_s`.
"""
from __future__ import annotations

import contextvars
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable

log = logging.getLogger("rankops.kicks")


class Kicks:
    def __init__(self, run: Callable[[Hashable], None], workers: int = 8, retry_s: float = 10.0):
        self._run = run
        self._retry_s = retry_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rankops-kick")
        self._lock = threading.Lock()
        self._queued: set[Hashable] = set()
        self._running: set[Hashable] = set()
        self._again: set[Hashable] = set()

    def kick(self, key: Hashable, context: contextvars.Context | None = None) -> None:
        """Reconcile `key` soon. The caller's context (kopf's, in a handler) goes with it: kopf
        posts Events through context variables."""
        context = (context or contextvars.copy_context()).copy()
        with self._lock:
            if key in self._queued:
                return
            if key in self._running:
                self._again.add(key)
                return
            self._queued.add(key)
        self._pool.submit(context.run, self._work, key, context)

    def _work(self, key: Hashable, context: contextvars.Context) -> None:
        with self._lock:
            self._queued.discard(key)
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
