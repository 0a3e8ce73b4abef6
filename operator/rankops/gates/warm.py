"""`rankops warm`: the container beside Triton that keeps its pod un-Ready until Triton is warm.

Every start of the pod (and every return of its Triton after a restart) goes through the same
steps: wait until Triton on the pod's own address reports the model ready, send each sample once
(the cold pass: first requests at a new shape compile kernels, build engines, fill caches), then
replay rounds of warm requests until one round has no error and a client P99 within the bound.
Only then does its readiness endpoint answer 200, so the pod (Ready only when every container
is) joins the Services warm. Triton's own readiness is unchanged.

It fails open on slowness only: a replica that is still not under the bound when the deadline
passes, or whose rounds stopped getting faster above it, goes Ready anyway and says so in its log
(a model that is simply slower than its bound must not lose every replica at once; the warmup
gate judges the canary on the numbers). It never fails open on errors: rounds that see errors
back off (exponential, capped), and once FAILING_ROUNDS rounds in a row failed more than
`max_error_ratio` of their requests (or the deadline passes on such a round) the container
exits 1 with the reason in its termination message: the pod stays un-Ready (the kubelet restarts
the container with its own back-off) and the operator reads why from the pod's status. The
requests and the replay are the warmup gate's (gates/warmup.py); one JSON line per step goes to stdout.
"""
from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence

from rankops.triton import metrics as server_metrics
from rankops.triton.client import Endpoint, GateClientError, InputsMismatch, ModelNotReady, Request, ServerUnreachable
from rankops.triton.samples import Sample, SamplesError
from rankops.gates.warmup import Observations, WarmupConfig, _send, latency_stats, replay

WAITING, WARMING, WARM, FAILING = "WaitingForTriton", "Warming", "Warm", "Failing"
TRITON_GONE = "TritonWentAway"
WARMUP_FAILING = "WarmupFailing"    # the termination message's reason, read by the operator
NOT_WARM_IN_TIME = "NotWarmInTime"  # the log's reason for a pod that went Ready above the bound


@dataclass(frozen=True)
class WarmConfig:
    requests: int = 200           # warm requests per round
    concurrency: int = 2
    max_p99_ms: float = 15.0
    timeout_s: float = 300.0      # fail open after this long warming (on slowness, never on errors)
    max_error_ratio: float = 0.01  # a round failing more of its requests than this is a failing round
    poll_s: float = 1.0           # how often Triton's readiness is asked
    unique: bool = False          # different data per request: a response cache cannot answer
    metrics_url: str = ""         # Triton's metrics HOST:PORT: its own averages are logged per round


@dataclass(frozen=True)
class RoundResult:
    """One round of warm requests, judged against the bound."""
    number: int
    requests: int
    errors: int
    stats: dict[str, float]
    per_batch: dict[str, dict[str, float]]
    server: dict[str, Any]
    first_error: str | None

    @property
    def p99_ms(self) -> float | None:
        return self.stats.get("p99Ms")

    def within(self, bound_ms: float) -> bool:
        return self.errors == 0 and self.p99_ms is not None and self.p99_ms <= bound_ms

    def failing(self, max_error_ratio: float) -> bool:
        """More of its requests failed than the bound allows (a round that sent nothing failed)."""
        return self.requests == 0 or self.errors / self.requests > max_error_ratio

    def record(self, bound_ms: float) -> dict[str, Any]:
        return {"event": "round", "round": self.number, "requests": self.requests, "errors": self.errors,
                **{k: round(v, 3) for k, v in self.stats.items()}, "maxP99Ms": bound_ms,
                "withinBound": self.within(bound_ms), "perBatchSize": self.per_batch,
                **({"server": self.server} if self.server else {}),
                **({"firstError": self.first_error} if self.first_error else {})}


def judge_round(number: int, observations: Observations, server: dict[str, Any] | None = None) -> RoundResult:
    latencies = [v for values in observations.latencies_ms.values() for v in values]
    per_batch = {str(b): {"requests": len(observations.latencies_ms.get(b, [])) + observations.errors.get(b, 0),
                          **{k: round(v, 3) for k, v in latency_stats(observations.latencies_ms.get(b, [])).items()}}
                 for b in sorted(set(observations.latencies_ms) | set(observations.errors))}
    return RoundResult(number=number, requests=observations.sent, errors=observations.error_count,
                       stats=latency_stats(latencies), per_batch=per_batch, server=server or {},
                       first_error=(observations.error_examples or [None])[0])


PLATEAU_ROUNDS, PLATEAU_GAIN = 2, 0.9
FAILING_ROUNDS = 3                   # failing rounds in a row: the model fails, warming cannot help
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 30.0


def outcome(rounds: Sequence[RoundResult], bound_ms: float, elapsed_s: float, timeout_s: float,
            max_error_ratio: float = 0.01) -> str | None:
    """'warm' once the last round is within the bound; 'failing' once the last FAILING_ROUNDS
    rounds, or the last one at the deadline, failed more than `max_error_ratio` of their requests;
    'plateau' when the last PLATEAU_ROUNDS error-free rounds did not get 10% faster than the best
    before them (as warm as it gets: more rounds would only delay it); 'timeout' past the deadline
    (slow, not failing: it fails open); None: another round."""
    if rounds and rounds[-1].within(bound_ms):
        return "warm"
    failing = [r.failing(max_error_ratio) for r in rounds[-FAILING_ROUNDS:]]
    if len(failing) == FAILING_ROUNDS and all(failing):
        return "failing"
    if elapsed_s >= timeout_s:
        return "failing" if failing and failing[-1] else "timeout"
    earlier, last = rounds[:-PLATEAU_ROUNDS], rounds[-PLATEAU_ROUNDS:]
    if earlier and len(last) == PLATEAU_ROUNDS and all(r.errors == 0 and r.p99_ms is not None for r in rounds):
        if min(r.p99_ms for r in last) >= PLATEAU_GAIN * min(r.p99_ms for r in earlier):
            return "plateau"
    return None


def backoff_s(rounds: Sequence[RoundResult]) -> float:
    """The pause before the next round: none after an error-free round; after n rounds in a row
    with errors, BACKOFF_BASE_S * 2**(n-1), at most BACKOFF_CAP_S (a failing model is not hammered:
    902 rounds back to back once sent it 180,000 requests in 300 s)."""
    streak = 0
    for r in reversed(rounds):
        if not r.errors and r.requests:
            break
        streak += 1
    return 0.0 if not streak else min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (streak - 1))


def failing_message(rounds: Sequence[RoundResult], max_error_ratio: float) -> str:
    """What the failing rounds saw, for the termination message and the operator's condition:
    e.g. "75% of 600 warm requests failed in the last 3 rounds (at most 1% may): <first error>"."""
    last = [r for r in rounds[-FAILING_ROUNDS:] if r.failing(max_error_ratio)] or list(rounds[-1:])
    sent, failed = sum(r.requests for r in last), sum(r.errors for r in last)
    first = next((r.first_error for r in last if r.first_error), None) or "no request could be sent"
    share = f"{failed / sent:.0%} of {sent}" if sent else f"{failed} of 0"
    rounds_said = "the last round" if len(last) == 1 else f"the last {len(last)} rounds"
    bound = f"{max_error_ratio:.2%}".replace(".00%", "%")
    return f"{share} warm requests failed in {rounds_said} (at most {bound} may): {first[:300]}"


def termination_message(summary: dict[str, Any]) -> str:
    """The JSON the operator reads from the container's termination message (kept well under the
    kubelet's 4096 bytes)."""
    keep = ("reason", "message", "rounds", "errorRatio", "warmRequests", "warmingS")
    data = {k: summary[k] for k in keep if k in summary}
    if isinstance(data.get("message"), str):
        data["message"] = data["message"][:1000]   # the message is trimmed, never the JSON
    return json.dumps(data, separators=(",", ":"))


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class WarmState:
    """What the readiness endpoint answers: thread-safe, written by the warming loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.phase = WAITING
        self.summary: dict[str, Any] = {}
        self.starts = 0          # how many times Triton came up and was warmed (or is being)

    def set(self, phase: str, summary: dict[str, Any] | None = None) -> None:
        with self._lock:
            self.phase = phase
            if summary is not None:
                self.summary = summary
            if phase == WARMING:
                self.starts += 1

    def answer(self) -> tuple[int, dict[str, Any]]:
        with self._lock:
            body = {"phase": self.phase, "tritonStarts": self.starts, **({"last": self.summary} if self.summary else {})}
            return (200 if self.phase == WARM else 503), body


def triton_ready(endpoint: Endpoint) -> bool:
    """Triton live and the model ready, as the replay needs it (any failure: not ready)."""
    try:
        connection = endpoint.connect()
    except GateClientError:
        return False
    try:
        connection.model_info()
        return True
    except GateClientError:
        return False
    finally:
        connection.close()


class Warmer:
    """The loop: wait for Triton, warm it, watch it; again whenever it goes away."""

    def __init__(self, endpoint: Endpoint, samples: Sequence[Sample], config: WarmConfig, state: WarmState,
                 emit: Callable[[dict[str, Any]], None], stop: threading.Event | None = None):
        self.endpoint, self.samples, self.config, self.state = endpoint, list(samples), config, state
        self.emit, self.stop = emit, stop or threading.Event()

    def _log(self, record: dict[str, Any]) -> None:
        self.emit({"at": now(), **record})

    def run(self) -> dict[str, Any] | None:
        """Until stopped (None), or until the model fails its warm requests: that summary (the
        caller exits with it, so the pod stays un-Ready and its status says why)."""
        while not self.stop.is_set():
            self.state.set(WAITING)
            waited = self._wait_for_triton()
            if waited is None:
                return None
            summary = self.warm(waited)
            summary = {"at": now(), **summary}
            self.emit(summary)
            if summary.get("reason") == TRITON_GONE:
                continue  # it went away while warming: wait for its next start
            if summary.get("reason") == WARMUP_FAILING:
                self.state.set(FAILING, summary)
                return summary
            self.state.set(WARM, summary)
            self._watch()
        return None

    def _wait_for_triton(self) -> float | None:
        start = time.monotonic()
        self._log({"event": "waiting", "triton": self.endpoint.describe()})
        while not self.stop.is_set():
            if triton_ready(self.endpoint):
                return time.monotonic() - start
            self.stop.wait(self.config.poll_s)
        return None

    def _watch(self) -> None:
        """Until Triton stops answering twice in a row (a restart): its next start is cold."""
        misses = 0
        while not self.stop.wait(self.config.poll_s):
            misses = 0 if triton_ready(self.endpoint) else misses + 1
            if misses >= 2:
                self._log({"event": "tritonGone", "message": "Triton stopped answering: warming again when it returns"})
                return

    def warm(self, waited_s: float) -> dict[str, Any]:
        """The cold pass and rounds until warm or the deadline; the summary logged and served."""
        self.state.set(WARMING)
        cfg, start = self.config, time.monotonic()
        base = {"event": "warm", "tritonReadyAfterS": round(waited_s, 2), "maxP99Ms": cfg.max_p99_ms,
                "samples": len(self.samples), "batchSizes": sorted({s.batch_size for s in self.samples})}
        try:
            requests, info = self._requests()
        except (InputsMismatch, SamplesError) as exc:
            # These requests can never be sent: warming cannot help, and must not hold the pod back.
            return {**base, "ready": "notWarmed", "reason": "CannotBuildRequests", "message": str(exc),
                    "warmingS": round(time.monotonic() - start, 2)}
        except (ServerUnreachable, ModelNotReady) as exc:
            return {**base, "ready": "notWarmed", "reason": TRITON_GONE, "message": str(exc),
                    "warmingS": round(time.monotonic() - start, 2)}
        cold = Observations()
        connection = self.endpoint.connect()
        try:
            for request in requests:
                _send(connection, request, cold)
        finally:
            connection.close()
        cold_stats = latency_stats([v for vs in cold.latencies_ms.values() for v in vs])
        self._log({"event": "coldPass", "requests": cold.sent, "errors": cold.error_count,
                   **{k: round(v, 3) for k, v in cold_stats.items()}})
        replay_config = WarmupConfig(requests=cfg.requests, concurrency=cfg.concurrency, max_p99_ms=cfg.max_p99_ms,
                                     processes=1, unique=cfg.unique, max_errors=max(10, cfg.requests))
        rounds: list[RoundResult] = []
        verdict = None
        while verdict is None and not self.stop.is_set():
            before = self._counters()
            observations = replay(self.endpoint, requests, replay_config, info)
            result = judge_round(len(rounds) + 1, observations, self._server_report(before))
            rounds.append(result)
            self._log(result.record(cfg.max_p99_ms))
            if result.errors and not triton_ready(self.endpoint):
                return {**base, "ready": "notWarmed", "reason": TRITON_GONE, "rounds": len(rounds),
                        "message": f"Triton stopped answering while warming: {result.first_error}",
                        "warmingS": round(time.monotonic() - start, 2)}
            verdict = outcome(rounds, cfg.max_p99_ms, time.monotonic() - start, cfg.timeout_s, cfg.max_error_ratio)
            pause = backoff_s(rounds) if verdict is None else 0.0
            if pause:   # not past the deadline: the last round there decides
                self._log({"event": "backoff", "seconds": pause, "afterRounds": len(rounds)})
                self.stop.wait(max(0.0, min(pause, cfg.timeout_s - (time.monotonic() - start))))
        last = rounds[-1] if rounds else None
        summary = {**base, "ready": verdict or "timeout", "rounds": len(rounds),
                   "coldRequests": cold.sent, "coldErrors": cold.error_count, "coldMaxMs": _ms(cold_stats.get("maxMs")),
                   "warmRequests": sum(r.requests for r in rounds), "errors": last.errors if last else 0,
                   "p50Ms": _ms(last.stats.get("p50Ms")) if last else None,
                   "p99Ms": _ms(last.p99_ms) if last else None,
                   "warmingS": round(time.monotonic() - start, 2)}
        if verdict == "failing":
            failed = [r for r in rounds[-FAILING_ROUNDS:] if r.failing(cfg.max_error_ratio)]
            summary.update(reason=WARMUP_FAILING, message=failing_message(rounds, cfg.max_error_ratio),
                           errorRatio=round(sum(r.errors for r in failed) / max(1, sum(r.requests for r in failed)), 4),
                           maxErrorRatio=cfg.max_error_ratio)
        elif verdict == "plateau":
            summary["message"] = (f"P99 stopped improving above the bound ({_ms(last.p99_ms)} ms > "
                                  f"{cfg.max_p99_ms:g} ms after {len(rounds)} rounds): as warm as it gets, taking traffic")
        elif verdict != "warm" and last is not None:
            summary["reason"] = NOT_WARM_IN_TIME
            summary["message"] = (f"still not warm after {cfg.timeout_s:g}s (last round: P99 {_ms(last.p99_ms)} ms, "
                                  f"{last.errors} errors, bound {cfg.max_p99_ms:g} ms): taking traffic anyway")
        return summary

    def _requests(self) -> tuple[list[Request], Any]:
        connection = self.endpoint.connect()
        try:
            info = connection.model_info()
            return [connection.build_request(s, info) for s in self.samples], info
        finally:
            connection.close()

    def _counters(self) -> server_metrics.ModelCounters | None:
        if not self.config.metrics_url:
            return None
        try:
            return server_metrics.scrape(self.config.metrics_url, self.endpoint.model, self.endpoint.version)
        except server_metrics.MetricsUnavailable:
            return None

    def _server_report(self, before: server_metrics.ModelCounters | None) -> dict[str, Any]:
        after = self._counters() if before is not None else None
        if after is None:
            return {}
        report = server_metrics.run_report(before, after)
        # Triton's P99 is a 60 s window that still holds the load-time and cold requests: not this round's.
        report.pop("p99Ms", None)
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in report.items() if v is not None}


class _Handler(BaseHTTPRequestHandler):
    state: WarmState

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?")[0] == "/healthz":
            code, body = 200, {"ok": True}
        elif self.path.split("?")[0] == "/ready":
            code, body = self.state.answer()
        else:
            code, body = 404, {"error": "GET /ready or /healthz"}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # probes every few seconds: not worth a log line
        pass


def serve_readiness(host: str, port: int, state: WarmState) -> ThreadingHTTPServer:
    """GET /ready: 200 once warm, 503 before (with the phase and the last summary); /healthz: 200."""
    handler = type("WarmHandler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="warm-readiness", daemon=True).start()
    return server


def host_port(host: str, port: int) -> str:
    """HOST:PORT, an IPv6 pod IP in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
