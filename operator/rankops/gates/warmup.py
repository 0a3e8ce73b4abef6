"""The warmup gate: replay requests against the candidate until it is warm, then measure its P99.

One untimed pass sends every sample once (first requests at a new shape compile kernels, build
TensorRT engines, fill caches: that is the cold cost Triton's own model_warmup does not fully
pay). Then `requests` requests are replayed, cycling through the samples, `concurrency` at a
time; the gate passes when none fails and the P99 of those warm requests is within the bound.
"""
from __future__ import annotations

import multiprocessing
import os
import selectors
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rankops.triton.client import (BINARY_HINT, Connection, Endpoint, GateClientError, InferenceFailed,
                                  InputsMismatch, ModelInfo, ModelNotReady, Request, ServerUnreachable,
                                  rejects_binary_data)
from rankops.triton import metrics as server_metrics
from rankops.triton.samples import Sample, SamplesError
from rankops.gates.verdict import Verdict, error_verdict
from rankops.progress import Progress

GATE = "warmup"
JUDGED_ON = ("server", "client")   # whose P99 the gate judges: Triton's own (after its window clears), or its own
ERROR_EXAMPLES = 3


@dataclass(frozen=True)
class WarmupConfig:
    requests: int
    concurrency: int
    max_p99_ms: float
    cold_passes: int = 1       # untimed passes over the samples before measuring
    max_errors: int = 10       # stop sending once this many requests failed: the gate has failed
    processes: int = 0         # worker processes sending requests; 0: one per core (<= concurrency)
    unique: bool = False       # different data in every request, so a response cache cannot answer
    metrics_url: str = ""      # Triton's metrics endpoint HOST:PORT: judge on its server-side P99
    window_wait_s: float = 70  # wait for Triton's latency window (60 s) to hold only warm requests
    judge_on: str = "server"   # "client": judge on the client's P99 at once, Triton's numbers reported only


@dataclass
class Observations:
    """What the replay saw: one latency per successful request, keyed by batch size."""
    latencies_ms: dict[int, list[float]] = field(default_factory=dict)
    errors: dict[int, int] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)
    sent: int = 0
    elapsed_s: float = 0.0

    def record(self, batch: int, latency_ms: float | None, error: str | None) -> None:
        self.sent += 1
        if error is None:
            self.latencies_ms.setdefault(batch, []).append(latency_ms)
        else:
            self.errors[batch] = self.errors.get(batch, 0) + 1
            if len(self.error_examples) < ERROR_EXAMPLES and error not in self.error_examples:
                self.error_examples.append(error)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def merge(self, other: "Observations") -> None:
        for batch, values in other.latencies_ms.items():
            self.latencies_ms.setdefault(batch, []).extend(values)
        for batch, count in other.errors.items():
            self.errors[batch] = self.errors.get(batch, 0) + count
        for example in other.error_examples:
            if len(self.error_examples) < ERROR_EXAMPLES and example not in self.error_examples:
                self.error_examples.append(example)
        self.sent += other.sent


def run_warmup(endpoint: Endpoint, samples: Sequence[Sample], config: WarmupConfig,
               progress: Progress | None = None) -> Verdict:
    progress = progress or Progress("warmup")
    problem = _check_config(config)
    if problem:
        return error_verdict(GATE, "BadArguments", problem)
    if not samples:
        return error_verdict(GATE, "BadSamples", "no samples to replay; record some or use --generate-samples")
    try:
        progress.step(f"connecting to {endpoint.describe()}")
        connection = endpoint.connect()
        info = connection.model_info()
        requests = [connection.build_request(s, info) for s in samples]
    except ServerUnreachable as exc:
        return error_verdict(GATE, "ServerUnreachable", str(exc))
    except ModelNotReady as exc:
        return Verdict(GATE, "fail", "ModelNotReady", str(exc), Counts(0, 0, 0, 0).metrics())
    except InputsMismatch as exc:
        return Verdict(GATE, "fail", "InputsMismatch", str(exc), Counts(0, 0, 0, 0).metrics())
    except SamplesError as exc:
        return error_verdict(GATE, "BadSamples", str(exc))

    cold = Observations()
    progress.step(f"{config.cold_passes} cold pass(es) over {len(requests)} samples")
    try:
        for _ in range(config.cold_passes):
            for request in requests:
                _send(connection, request, cold)
    finally:
        connection.close()
    if cold.sent and cold.error_count == cold.sent:
        if rejects_binary_data(endpoint, samples[0], info):
            return error_verdict(GATE, "BinaryDataUnsupported", f"{endpoint.describe()}: {BINARY_HINT}")
        return _verdict(cold, Observations(), config, len(samples))
    server = ServerView(config, endpoint)
    if config.metrics_url and config.judge_on == "server":
        progress.step(f"waiting up to {config.window_wait_s:.0f}s for Triton's latency window to hold no cold requests")
    server.before_run()
    progress.step(f"replaying {config.requests} warm requests, {config.concurrency} in flight")
    warm = replay(endpoint, requests, config, info)
    progress.step(f"{warm.sent} sent, {warm.error_count} failed; judging")
    return _verdict(cold, warm, config, len(samples), server.after_run())


class ServerView:
    """Triton's own numbers for the warm run, read from its metrics port around it.

    Triton's latency summary is a sliding window of about 60 s that also holds the load-time
    model_warmup requests (counted once per batch item, at their cold latency) and the gate's
    cold pass: before the warm run the gate waits, up to `window_wait_s`, for that window to
    empty, so that the P99 it reads afterwards is of warm requests only.
    """

    def __init__(self, config: WarmupConfig, endpoint: Endpoint):
        self.config, self.endpoint = config, endpoint
        self.before: server_metrics.ModelCounters | None = None
        self.note = "" if config.metrics_url else "no --metrics-url: judged on the client's P99"
        if config.judge_on == "client":
            self.note = "judged on the client's P99, as asked (judge on client): no wait for Triton's latency window"
        self.waited_s = 0.0

    def _scrape(self) -> server_metrics.ModelCounters:
        return server_metrics.scrape(self.config.metrics_url, self.endpoint.model, self.endpoint.version)

    def before_run(self) -> None:
        if not self.config.metrics_url:
            return
        start = time.monotonic()
        try:
            counters = self._scrape()
            wait_s = self.config.window_wait_s if self.config.judge_on == "server" else 0.0
            while counters.quantiles_us and time.monotonic() - start < wait_s:
                time.sleep(1.0)
                counters = self._scrape()
            self.before = counters
        except server_metrics.MetricsUnavailable as exc:
            self.note = f"{exc}: judged on the client's P99"
        self.waited_s = time.monotonic() - start
        if self.before is not None and self.before.quantiles_us and not self.note:
            self.note = (f"Triton's latency window still held earlier requests after {self.waited_s:.0f}s: "
                         "its P99 is reported, the client's judged")

    def after_run(self) -> dict[str, Any]:
        if self.before is None:
            return {"note": self.note} if self.note else {}
        try:
            report = server_metrics.run_report(self.before, self._scrape())
        except server_metrics.MetricsUnavailable as exc:
            return {"note": f"{exc}: judged on the client's P99"}
        report["windowWaitS"] = round(self.waited_s, 1)
        if report["p99Ms"] is None:
            self.note = self.note or ("Triton reports no latency summary for this model (the response cache "
                                      "leaves it out): judged on the client's P99")
        report["judged"] = report["p99Ms"] is not None and not self.note
        if self.note:
            report["note"] = self.note
        return report


def replay(endpoint: Endpoint, requests: Sequence[Request], config: WarmupConfig,
           info: ModelInfo | None = None) -> Observations:
    """Send `config.requests` requests, cycling `requests`, `config.concurrency` at a time.

    The in-flight requests are spread over worker processes (one per core, at most one per
    request in flight), each waiting on its own connections in one thread: a single Python
    process timing eight requests from eight threads measures its own GIL, not the server
    (23 ms client P99 against Triton's 6.4 ms, measured). With `config.unique` every request gets different data (its
    first float nudged), so a response cache cannot answer it; that needs the model's `info`.
    """
    processes = max(1, min(config.concurrency, config.processes or os.cpu_count() or 1))
    if processes == 1:
        return _replay_share(endpoint, requests, config, info, 0, 1)
    context = multiprocessing.get_context("fork")
    pipes, workers = [], []
    start = time.perf_counter()
    for rank in range(processes):
        receive, send = context.Pipe(duplex=False)
        worker = context.Process(target=_worker_main, args=(send, endpoint, requests, config, info, rank, processes),
                                 daemon=True)
        worker.start()
        send.close()
        pipes.append(receive)
        workers.append(worker)
    merged = Observations()
    for rank, (receive, worker) in enumerate(zip(pipes, workers)):
        try:
            part = receive.recv()
        except EOFError:
            part = Observations()
            part.record(0, None, f"warmup worker {rank} exited with {worker.exitcode} before reporting")
        merged.merge(part)
        worker.join(timeout=30)
    merged.elapsed_s = time.perf_counter() - start
    return merged


def _worker_main(send, endpoint, requests, config, info, rank, processes) -> None:
    try:
        send.send(_replay_share(endpoint, requests, config, info, rank, processes))
    finally:
        send.close()


def _replay_share(endpoint: Endpoint, requests: Sequence[Request], config: WarmupConfig,
                  info: ModelInfo | None, rank: int, processes: int) -> Observations:
    """This process's share: requests rank, rank + processes, ...; its share of the concurrency.

    One thread waits on all of its connections with a selector; each answer's latency ends at
    the kernel's receive timestamp where there is one (Connection.latency_ms). With a thread per
    connection an answered thread waited for the GIL behind the others, and the gate measured
    that too.
    """
    observations = Observations()
    order = iter(range(rank, config.requests, processes))
    slots = len(range(rank, config.concurrency, processes))
    max_errors = max(1, config.max_errors // processes)
    selector = selectors.DefaultSelector()
    in_flight: dict[Connection, tuple[Request, float]] = {}

    def launch(connection: Connection) -> None:
        """Send this connection's next request (none once all are sent or too many failed)."""
        while observations.error_count < max_errors and (index := next(order, None)) is not None:
            request = requests[index % len(requests)]
            if config.unique and info is not None:
                request = connection.build_request(vary(request.sample, index + 1), info)
            start = time.perf_counter()
            try:
                connection.begin(request)
            except InferenceFailed as exc:
                observations.record(request.sample.batch_size, None, str(exc))
                continue
            selector.register(connection.socket, selectors.EVENT_READ, connection)
            in_flight[connection] = (request, start)
            return

    def answered(connection: Connection, error: str | None = None) -> None:
        selector.unregister(connection.socket)
        request, start = in_flight.pop(connection)
        latency = None
        if error is None:
            try:
                headers, body = connection.finish()
                latency = connection.latency_ms or (time.perf_counter() - start) * 1000.0
                connection.decode(headers, body)   # after the clock: a response that cannot be read still fails
            except InferenceFailed as exc:
                latency, error = None, str(exc)
        else:
            connection.abandon()
        observations.record(request.sample.batch_size, latency, error)
        launch(connection)

    connections: list[Connection] = []
    start = time.perf_counter()
    try:
        for _ in range(slots):
            try:
                connections.append(endpoint.connect())
            except GateClientError as exc:
                observations.record(0, None, str(exc))
                continue
            launch(connections[-1])
        while in_flight:
            for key, _ in selector.select(timeout=1.0):
                answered(key.data)
            now = time.perf_counter()
            for connection, (_, sent) in list(in_flight.items()):
                if now - sent > endpoint.timeout_s:
                    answered(connection, f"{endpoint.url}: no answer within {endpoint.timeout_s:g}s")
    finally:
        for connection in connections:
            connection.close()
        selector.close()
    observations.elapsed_s = time.perf_counter() - start
    return observations


def vary(sample: Sample, salt: int) -> Sample:
    """The sample with its first float (or, lacking one, integer) value changed by `salt`."""
    inputs = dict(sample.inputs)
    name = next((n for n, a in inputs.items() if a.dtype.kind == "f"), None) or \
        next((n for n, a in inputs.items() if a.dtype.kind in "iu"), None)
    if name is None:
        return sample
    array = inputs[name].copy()
    flat = array.reshape(-1)
    flat[0] = flat[0] + np.asarray(salt * 1e-3 if array.dtype.kind == "f" else salt, dtype=array.dtype)
    inputs[name] = array
    return Sample(line=sample.line, inputs=inputs)


def _send(connection: Connection, request: Request, observations: Observations) -> None:
    latency, error = _timed(connection, request)
    observations.record(request.sample.batch_size, latency, error)


def _timed(connection: Connection, request: Request) -> tuple[float | None, str | None]:
    """The request's latency: from its first byte sent to its response's last received (the
    outputs are decoded after the clock stops: a response that cannot be read still fails)."""
    start = time.perf_counter()
    try:
        headers, body = connection.send(request)
        latency = connection.latency_ms or (time.perf_counter() - start) * 1000.0
        connection.decode(headers, body)
    except InferenceFailed as exc:
        return None, str(exc)
    return latency, None


def check_load(requests: int, concurrency: int, max_p99_ms: float) -> str | None:
    """What is wrong with a replay's size and bound (the warmup gate's, a warm container's)."""
    if requests < 1:
        return f"--requests must be at least 1, got {requests}"
    if concurrency < 1:
        return f"--concurrency must be at least 1, got {concurrency}"
    if not max_p99_ms > 0:
        return f"--max-p99-ms must be positive, got {max_p99_ms}"
    return None


def _check_config(config: WarmupConfig) -> str | None:
    problem = check_load(config.requests, config.concurrency, config.max_p99_ms)
    if problem:
        return problem
    if config.cold_passes < 0:
        return f"--cold-passes must be 0 or more, got {config.cold_passes}"
    if config.max_errors < 1:
        return f"--max-errors must be at least 1, got {config.max_errors}"
    if config.processes < 0:
        return f"--processes must be 0 (one per core) or more, got {config.processes}"
    if config.window_wait_s < 0:
        return f"--window-wait-s must be 0 or more, got {config.window_wait_s}"
    if config.judge_on not in JUDGED_ON:
        return f"--judge-on must be one of {', '.join(JUDGED_ON)}, got {config.judge_on!r}"
    return None


def latency_stats(latencies_ms: Sequence[float]) -> dict[str, float]:
    if not latencies_ms:
        return {}
    values = np.asarray(latencies_ms, dtype=np.float64)
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50Ms": float(p50), "p95Ms": float(p95), "p99Ms": float(p99), "maxMs": float(values.max())}


@dataclass(frozen=True)
class Counts:
    """One count of what the gate sent and what failed: its summary and its metrics both say
    these numbers (they once disagreed: "18 of 30 requests failed" beside `requests: 14, errors: 18`,
    the summary counting the cold pass and the metrics' requests not)."""
    requests: int         # warm requests sent (what rollout.warmup.requests asks for)
    errors: int           # of them, failed
    cold_requests: int    # the cold pass's
    cold_errors: int

    @classmethod
    def of(cls, cold: Observations, warm: Observations) -> "Counts":
        return cls(warm.sent, warm.error_count, cold.sent, cold.error_count)

    def metrics(self) -> dict[str, int]:
        return {"requests": self.requests, "errors": self.errors,
                "coldRequests": self.cold_requests, "coldErrors": self.cold_errors}

    def failed(self) -> str:
        """What failed, in the metrics' own numbers: warm requests, then the cold pass."""
        return (f"{self.errors} of {self.requests} warm requests failed "
                f"({self.cold_errors} of {self.cold_requests} in the cold pass)")


def _verdict(cold: Observations, warm: Observations, config: WarmupConfig, distinct: int,
             server: dict[str, Any] | None = None) -> Verdict:
    all_latencies = [v for values in warm.latencies_ms.values() for v in values]
    counts = Counts.of(cold, warm)
    errors = counts.errors + counts.cold_errors
    per_batch = {}
    for batch in sorted(set(warm.latencies_ms) | set(warm.errors)):
        per_batch[str(batch)] = {"requests": len(warm.latencies_ms.get(batch, [])) + warm.errors.get(batch, 0),
                                 "errors": warm.errors.get(batch, 0),
                                 **latency_stats(warm.latencies_ms.get(batch, []))}
    stats = latency_stats(all_latencies)
    server = server or {}
    metrics = {
        **counts.metrics(),
        **stats,
        "maxP99Ms": config.max_p99_ms,
        "concurrency": config.concurrency,
        "throughputRps": (len(all_latencies) / warm.elapsed_s) if warm.elapsed_s > 0 else 0.0,
        "distinctSamples": warm.sent if config.unique else distinct,
        "coldMaxMs": latency_stats([v for vs in cold.latencies_ms.values() for v in vs]).get("maxMs"),
        "server": server,
        "perBatchSize": per_batch,
        "errorExamples": (cold.error_examples + warm.error_examples)[:ERROR_EXAMPLES],
    }
    if errors:
        stopped = f" (stopped early, of {config.requests})" if warm.sent < config.requests else ""
        first = (cold.error_examples + warm.error_examples or ["unknown error"])[0]
        return Verdict(GATE, "fail", "RequestsFailed", f"{counts.failed()}{stopped}; first error: {first}", metrics)
    judged_on_server = bool(server.get("judged"))
    p99 = server["p99Ms"] if judged_on_server else stats["p99Ms"]
    metrics["judgedP99Ms"], metrics["judgedOn"] = p99, "server" if judged_on_server else "client"
    seen = (f"Triton P99 {p99:.2f}ms (client {stats['p99Ms']:.2f}ms)" if judged_on_server
            else f"client P99 {p99:.2f}ms")
    if server.get("requestsPerExecution") is not None:
        seen += f"; {server['requestsPerExecution']:.1f} requests/execution, batch {server['avgBatchSize']:.0f}"
    if server.get("cacheHitRatio") is not None:
        seen += f", cache hits {server['cacheHitRatio']:.0%}"
    over = f"over {warm.sent} requests (concurrency {config.concurrency}), 0 errors"
    if p99 > config.max_p99_ms:
        return Verdict(GATE, "fail", "P99AboveBound", f"warm {seen} > {config.max_p99_ms:g}ms {over}", metrics)
    return Verdict(GATE, "pass", "WarmP99WithinBound", f"warm {seen} <= {config.max_p99_ms:g}ms {over}", metrics)
