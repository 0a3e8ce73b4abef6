"""The warmup gate: replay requests against the candidate until it is warm, then measure its P99.

One untimed pass sends every sample once (first requests at a new shape compile kernels, build
TensorRT engines, fill caches: that is the cold cost Triton's own model_warmup does not fully
pay). Then `requests` requests are replayed, cycling through the samples, from `concurrency`
threads; the gate passes when none fails and the P99 of those warm requests is within the bound.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from rankops.gates.client import (BINARY_HINT, Connection, Endpoint, GateClientError, InferenceFailed,
                                  InputsMismatch, ModelNotReady, Request, ServerUnreachable,
                                  rejects_binary_data)
from rankops.gates.samples import Sample, SamplesError
from rankops.gates.verdict import Verdict, error_verdict

GATE = "warmup"
ERROR_EXAMPLES = 3


@dataclass(frozen=True)
class WarmupConfig:
    requests: int
    concurrency: int
    max_p99_ms: float
    cold_passes: int = 1       # untimed passes over the samples before measuring
    max_errors: int = 10       # stop sending once this many requests failed: the gate has failed


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


def run_warmup(endpoint: Endpoint, samples: Sequence[Sample], config: WarmupConfig) -> Verdict:
    problem = _check_config(config)
    if problem:
        return error_verdict(GATE, "BadArguments", problem)
    if not samples:
        return error_verdict(GATE, "BadSamples", "no samples to replay; record some or use --generate-samples")
    try:
        connection = endpoint.connect()
        info = connection.model_info()
        requests = [connection.build_request(s, info) for s in samples]
    except ServerUnreachable as exc:
        return error_verdict(GATE, "ServerUnreachable", str(exc))
    except ModelNotReady as exc:
        return Verdict(GATE, "fail", "ModelNotReady", str(exc), {"requests": 0, "errors": 0})
    except InputsMismatch as exc:
        return Verdict(GATE, "fail", "InputsMismatch", str(exc), {"requests": 0, "errors": 0})
    except SamplesError as exc:
        return error_verdict(GATE, "BadSamples", str(exc))

    cold = Observations()
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
    warm = replay(endpoint, requests, config)
    return _verdict(cold, warm, config, len(samples))


def replay(endpoint: Endpoint, requests: Sequence[Request], config: WarmupConfig) -> Observations:
    """Send `config.requests` requests, cycling `requests`, from `config.concurrency` threads."""
    observations = Observations()
    lock = threading.Lock()
    order = iter(range(config.requests))

    def worker() -> None:
        try:
            connection = endpoint.connect()
        except GateClientError as exc:
            with lock:
                observations.record(0, None, str(exc))
            return
        try:
            while True:
                with lock:
                    index = next(order, None)
                    if index is None or observations.error_count >= config.max_errors:
                        return
                request = requests[index % len(requests)]
                latency, error = _timed(connection, request)
                with lock:
                    observations.record(request.sample.batch_size, latency, error)
        finally:
            connection.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="warmup") as pool:
        for future in [pool.submit(worker) for _ in range(config.concurrency)]:
            future.result()
    observations.elapsed_s = time.perf_counter() - start
    return observations


def _send(connection: Connection, request: Request, observations: Observations) -> None:
    latency, error = _timed(connection, request)
    observations.record(request.sample.batch_size, latency, error)


def _timed(connection: Connection, request: Request) -> tuple[float | None, str | None]:
    start = time.perf_counter()
    try:
        connection.infer(request)
    except InferenceFailed as exc:
        return None, str(exc)
    return (time.perf_counter() - start) * 1000.0, None


def _check_config(config: WarmupConfig) -> str | None:
    if config.requests < 1:
        return f"--requests must be at least 1, got {config.requests}"
    if config.concurrency < 1:
        return f"--concurrency must be at least 1, got {config.concurrency}"
    if not config.max_p99_ms > 0:
        return f"--max-p99-ms must be positive, got {config.max_p99_ms}"
    if config.cold_passes < 0:
        return f"--cold-passes must be 0 or more, got {config.cold_passes}"
    if config.max_errors < 1:
        return f"--max-errors must be at least 1, got {config.max_errors}"
    return None


def latency_stats(latencies_ms: Sequence[float]) -> dict[str, float]:
    if not latencies_ms:
        return {}
    values = np.asarray(latencies_ms, dtype=np.float64)
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50Ms": float(p50), "p95Ms": float(p95), "p99Ms": float(p99), "maxMs": float(values.max())}


def _verdict(cold: Observations, warm: Observations, config: WarmupConfig, distinct: int) -> Verdict:
    all_latencies = [v for values in warm.latencies_ms.values() for v in values]
    errors = cold.error_count + warm.error_count
    per_batch = {}
    for batch in sorted(set(warm.latencies_ms) | set(warm.errors)):
        per_batch[str(batch)] = {"requests": len(warm.latencies_ms.get(batch, [])) + warm.errors.get(batch, 0),
                                 "errors": warm.errors.get(batch, 0),
                                 **latency_stats(warm.latencies_ms.get(batch, []))}
    stats = latency_stats(all_latencies)
    metrics = {
        "requests": warm.sent,
        "errors": errors,
        **stats,
        "maxP99Ms": config.max_p99_ms,
        "concurrency": config.concurrency,
        "throughputRps": (len(all_latencies) / warm.elapsed_s) if warm.elapsed_s > 0 else 0.0,
        "distinctSamples": distinct,
        "coldRequests": cold.sent,
        "coldErrors": cold.error_count,
        "coldMaxMs": latency_stats([v for vs in cold.latencies_ms.values() for v in vs]).get("maxMs"),
        "perBatchSize": per_batch,
        "errorExamples": (cold.error_examples + warm.error_examples)[:ERROR_EXAMPLES],
    }
    if errors:
        sent = cold.sent + warm.sent
        stopped = " (stopped early)" if warm.sent < config.requests else ""
        first = (cold.error_examples + warm.error_examples or ["unknown error"])[0]
        return Verdict(GATE, "fail", "RequestsFailed",
                       f"{errors} of {sent} requests failed{stopped}; first error: {first}", metrics)
    p99 = stats["p99Ms"]
    if p99 > config.max_p99_ms:
        return Verdict(GATE, "fail", "P99AboveBound",
                       f"warm p99 {p99:.2f}ms > {config.max_p99_ms:g}ms over {warm.sent} requests "
                       f"(concurrency {config.concurrency}), 0 errors", metrics)
    return Verdict(GATE, "pass", "WarmP99WithinBound",
                   f"warm p99 {p99:.2f}ms <= {config.max_p99_ms:g}ms over {warm.sent} requests "
                   f"(concurrency {config.concurrency}), 0 errors", metrics)
