"""Misbehaving endpoints and a stall meter, shared by the hostile-metrics tests (tests/core,
e2e) and benchmarks/metrics_bench.py."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable


class Endpoint:
    """A TCP server on (address, port) whose every connection is answered by `behave(conn, stop)`
    after the request is read; port 0 picks a free one (`.port`)."""

    def __init__(self, behave: Callable[[socket.socket, threading.Event], None], address: str = "127.0.0.1",
                 port: int = 0):
        self.behave = behave
        self.stop = threading.Event()
        self.connections = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, port))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.recv(4096)
            self.behave(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def timed_with_stall(work: Callable[[], object]) -> tuple[float, float]:
    """(seconds `work` took, the longest gap a thread ticking every millisecond saw meanwhile): how
    long the process stood still, e.g. a regex holding the GIL."""
    gaps, done = [0.0], threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.02)
    started = time.perf_counter()
    try:
        work()
    finally:
        took = time.perf_counter() - started
        done.set()
        ticker.join()
    return took, max(gaps)
