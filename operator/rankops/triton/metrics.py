"""What Triton itself saw: its per-model Prometheus metrics, read before and after a gate's run.

The warmup gate reads the candidate's metrics port (8002) around the warm replay. Counters give
the run's own numbers as differences: requests, failures, executions (batches), inference count
(batch items), queue and compute time, response-cache hits. The latency summary
(`nv_inference_request_summary_us`, on with `--metrics-config=summary_latencies=true`) gives
Triton's server-side P99: request arrival to response, queueing included, the client's network
and (de)serialisation excluded. It is a sliding window over the last minute or so, not the run
alone, and Triton leaves it out for models with the response cache on.
"""
from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import dataclass

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

COUNTERS = {
    "success": "nv_inference_request_success",
    "failure": "nv_inference_request_failure",
    "inferences": "nv_inference_count",
    "executions": "nv_inference_exec_count",
    "queue_us": "nv_inference_queue_duration_us",
    "compute_us": "nv_inference_compute_infer_duration_us",
    "request_us": "nv_inference_request_duration_us",
    "cache_hits": "nv_cache_num_hits_per_model",
    "cache_misses": "nv_cache_num_misses_per_model",
}
SUMMARY = "nv_inference_request_summary_us"


class MetricsUnavailable(Exception):
    """The metrics endpoint did not answer; the gate falls back to its client's numbers."""


@dataclass(frozen=True)
class ModelCounters:
    values: dict[str, float]
    quantiles_us: dict[float, float]     # the latency summary's quantiles, when Triton reports it
    seen: bool = True                    # some series of the model was there (False: none at all)

    def minus(self, before: "ModelCounters") -> dict[str, float]:
        return {k: self.values.get(k, 0.0) - before.values.get(k, 0.0) for k in COUNTERS}


def parse(text: str, model: str, version: str = "") -> ModelCounters:
    """The model's counters (summed over its versions unless `version` is given) and summary."""
    values = {k: 0.0 for k in COUNTERS}
    names = {v: k for k, v in COUNTERS.items()}
    quantiles: dict[float, float] = {}
    seen = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        if labels.get("model") != model or (version and labels.get("version", version) != version):
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        name = match.group("name")
        seen = seen or name in names or name == SUMMARY
        if name in names:
            values[names[name]] += value
        elif name == SUMMARY and "quantile" in labels and value == value:   # NaN when empty
            quantiles[float(labels["quantile"])] = value
    return ModelCounters(values, quantiles, seen)


def scrape(url: str, model: str, version: str = "", timeout_s: float = 5.0) -> ModelCounters:
    """`url`: HOST:PORT of Triton's metrics endpoint."""
    target = url if url.startswith("http") else f"http://{url}"
    try:
        with urllib.request.urlopen(f"{target.rstrip('/')}/metrics", timeout=timeout_s) as resp:
            return parse(resp.read().decode("utf-8", errors="replace"), model, version)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise MetricsUnavailable(f"Triton's metrics at {url} did not answer: {getattr(exc, 'reason', exc)}") from None


def run_report(before: ModelCounters, after: ModelCounters) -> dict[str, float | None]:
    """Triton's view of the run: batch sizes, queue time, P99, cache hits."""
    delta = after.minus(before)
    executions, success = delta["executions"], delta["success"]
    lookups = delta["cache_hits"] + delta["cache_misses"]
    p99 = after.quantiles_us.get(0.99)
    return {
        "requests": success + delta["failure"],
        "failures": delta["failure"],
        "executions": executions,
        # Batch items per execution (Triton's "average batch size") and requests per execution:
        # they differ when a request carries several items (candidates as the batch dimension).
        "avgBatchSize": delta["inferences"] / executions if executions else None,
        "requestsPerExecution": success / executions if executions else None,
        "avgQueueMs": delta["queue_us"] / success / 1000 if success else None,
        "avgComputeMs": delta["compute_us"] / success / 1000 if success else None,
        "avgRequestMs": delta["request_us"] / success / 1000 if success else None,
        "p99Ms": p99 / 1000 if p99 is not None else None,
        "cacheHitRatio": delta["cache_hits"] / lookups if lookups else None,
    }
