"""Requests to Triton pods off the caller's thread, for the shells that drive running pods (the
in-place switch's controller/inplace_pods.py, a shared server's controller/shared_pods.py).

Actions run on worker threads, at most one per key at once: one asked again while it is in
flight is not started twice. Reads run on threads of their own, so a load (up to its deadline)
never holds a read up. Every request is bounded by its client's deadline: a pod that accepts and
never answers costs a worker that deadline, never the caller.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")


class PodWork:
    def __init__(self, workers: int, name: str):
        self._actions = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._reads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-read")
        self._lock = threading.Lock()
        self._in_flight: dict[Hashable, Future] = {}
        self.closed = False

    def start(self, key: Hashable, run: Callable[[], Any]) -> bool:
        """Run `run` on a worker unless an action of `key` is in flight; whether it was started."""
        with self._lock:
            if key in self._in_flight:
                return False
            self._in_flight[key] = future = self._actions.submit(run)
        future.add_done_callback(lambda _f: self._done(key))
        return True

    def read_all(self, read: Callable[[Any], T], items: Iterable[Any], timeout_s: float | None = None,
                 unread: Any = None) -> list[T]:
        """`read(item)` for every item at once, in their order; with `timeout_s`, those not done by
        then are `unread` (more items than workers queue: the bound is the caller's, whatever the count)."""
        futures = [self._reads.submit(read, item) for item in items]
        if timeout_s is None:
            return [future.result() for future in futures]
        wait(futures, timeout=timeout_s)
        for future in futures:      # still queued behind stalled pods: never started late for nobody
            future.cancel()
        return [future.result() if future.done() and not future.cancelled() else unread for future in futures]

    def in_flight(self) -> list:
        with self._lock:
            return sorted(self._in_flight)

    def settle(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the actions in flight; for tests and shutdown."""
        with self._lock:
            futures = list(self._in_flight.values())
        wait(futures, timeout=timeout_s)

    def close(self) -> None:
        self.closed = True
        self._actions.shutdown(wait=False, cancel_futures=True)
        self._reads.shutdown(wait=False, cancel_futures=True)

    def _done(self, key: Hashable) -> None:
        with self._lock:
            self._in_flight.pop(key, None)
