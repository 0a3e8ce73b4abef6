"""Live traffic beside a gate's replay on one Triton: what the live requests' latency becomes.

Test and benchmark harness (issue 40). The flood is the warmup gate's own replay
(gates.warmup.replay, its requests built with the Endpoint's priority) in a process of its own,
looping until stopped; the live requests are paced at a steady rate from a few threads, each
request's latency measured from the time it was due (open loop: a late send counts), so the
live P99 says what production would see while a gate runs.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rankops.triton.client import Endpoint
from rankops.triton.samples import Sample


def _sample(items: int) -> Sample:
    return Sample(1, {"x": np.zeros((items, 4), np.float32)})


@dataclass(frozen=True)
class FloodResult:
    sent: int
    errors: int
    seconds: float
    example: str = ""

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


def _flooder_main(commands, stop, started, results) -> None:
    """`started` gets "ok" once a flood runs, or why it cannot."""
    import tritonclient.http  # noqa: F401 - imported while the server starts, not in the first flood

    from rankops.gates.warmup import WarmupConfig, replay

    while (command := commands.get()) is not None:
        endpoint, concurrency, items = command
        try:
            connection = endpoint.connect()
            info = connection.model_info()
            requests = [connection.build_request(_sample(items), info)]
            connection.close()
        except Exception as exc:   # noqa: BLE001 - handed to the caller, who raises it
            started.put(f"the flood cannot start: {type(exc).__name__}: {exc}")
            continue
        # in chunks, so that a stop is seen within about a second; a chunk's tail is a short dip
        config = WarmupConfig(requests=6 * concurrency, concurrency=concurrency, max_p99_ms=1e9, processes=1)
        sent = errors = 0
        example = ""
        start = time.perf_counter()
        started.put("ok")
        while not stop.is_set():
            seen = replay(endpoint, requests, config, info)
            sent, errors = sent + seen.sent, errors + seen.error_count
            example = example or next(iter(seen.error_examples), "")
        results.put(FloodResult(sent, errors, time.perf_counter() - start, example))


class Flooder:
    """A process that floods with the warmup replay on demand: `with flooder.flood(endpoint, n):`
    replays at `endpoint.priority`, `n` in flight, for the block. Started once (spawned: a
    forked child of a process whose threads used tritonclient hangs in its first call), so that
    its interpreter's start overlaps the server's."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._commands, self._results = context.Queue(), context.Queue()
        self._stop, self._started = context.Event(), context.Queue()
        self._process = context.Process(target=_flooder_main, daemon=True, args=(
            self._commands, self._stop, self._started, self._results))
        self._process.start()

    @contextlib.contextmanager
    def flood(self, endpoint: Endpoint, concurrency: int, items: int = 1) -> Iterator[list[FloodResult]]:
        """Yields a list that holds the flood's FloodResult once the block has ended."""
        self._stop.clear()
        self._commands.put((endpoint, concurrency, items))
        status = self._started.get(timeout=60)
        if status != "ok":
            raise RuntimeError(status)
        time.sleep(0.3)     # the replay's connections opened and Triton's queue filled
        result: list[FloodResult] = []
        try:
            yield result
        finally:
            self._stop.set()
            result.append(self._results.get(timeout=60))

    def close(self) -> None:
        self._commands.put(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def live(endpoint: Endpoint, rate: float, seconds: float, threads: int = 16, items: int = 1) -> list[float]:
    """Latencies (ms) of requests due at a steady `rate` for `seconds`, each thread taking every
    `threads`-th one on its own kept-alive connection; a failed request raises."""
    total = int(rate * seconds)
    latencies = [0.0] * total
    failures: list[str] = []
    connections = [endpoint.connect() for _ in range(threads)]
    request = connections[0].build_request(_sample(items), connections[0].model_info())
    clock: list[float] = []
    # each thread's socket opened by a first request, all at once, before the clock starts
    ready = threading.Barrier(threads, action=lambda: clock.append(time.perf_counter() + 0.05))

    def worker(rank: int) -> None:
        connection = connections[rank]
        connection.send(request)
        ready.wait()
        for i in range(rank, total, threads):
            due = clock[0] + i / rate
            time.sleep(max(0.0, due - time.perf_counter()))
            try:
                connection.send(request)
            except Exception as exc:   # noqa: BLE001 - said below, with the others
                failures.append(str(exc))
            latencies[i] = (time.perf_counter() - due) * 1000.0

    workers = [threading.Thread(target=worker, args=(rank,), daemon=True) for rank in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for connection in connections:
        connection.close()
    if failures:
        raise AssertionError(f"{len(failures)} of {total} live requests failed, e.g. {failures[0]}")
    return latencies


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


def p50(values: list[float]) -> float:
    return float(np.percentile(values, 50))
