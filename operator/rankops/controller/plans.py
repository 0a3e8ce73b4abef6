"""Plans made on a thread of their own, so planning one model never holds a thread that serves others.

A reconcile that needs a plan it does not have (controller.models) asks for it here and ends at
once, changing nothing; when the plan is made, each model that asked is reconciled again (`done`,
the watch-event kicks), and finds it. One plan per digest of its inputs is made at a time, however
many models or reconciles ask for it.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable

log = logging.getLogger("rankops.plans")


class PlanPending(Exception):
    """The plan is being made; the model is reconciled again when it is."""


class Plans:
    def __init__(self, done: Callable[[Hashable], None], workers: int = 1):
        self._done = done
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rankops-plan")
        self._lock = threading.Lock()
        # digest -> the models that asked for it, in the order they asked (`done` runs each in
        # the context its reconciles need: the kicks' own)
        self._waiting: dict[str, dict[Hashable, None]] = {}

    def ask(self, digest: str, make: Callable[[], None], who: Hashable) -> None:
        """Make the plan `digest` with `make` (which keeps its result where the next reconcile finds
        it, a failure included) unless it is being made already; then reconcile `who` again."""
        with self._lock:
            waiting = self._waiting.get(digest)
            if waiting is not None:
                waiting.setdefault(who, None)
                return
            self._waiting[digest] = {who: None}
        self._pool.submit(self._make, digest, make)

    def pending(self, digest: str) -> bool:
        with self._lock:
            return digest in self._waiting

    def _make(self, digest: str, make: Callable[[], None]) -> None:
        try:
            make()
        except Exception as exc:  # noqa: BLE001 - the reconcile plans again, in its own thread, and says why
            log.warning(f"planning {digest[:12]} failed: {exc}")
        finally:
            with self._lock:
                waiting = self._waiting.pop(digest, {})
        for who in sorted(waiting, key=repr):
            self._done(who)
