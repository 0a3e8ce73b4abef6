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

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from rankops.triton import bounded_http

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
_NAMES = {v: k for k, v in COUNTERS.items()}
# Requests Triton shed: nv_inference_request_failure{reason="REJECTED"}, still counted in "failure"
# too. Triton counts a queue-policy timeout there; a max_queue_size rejection it counts nowhere
# (measured on 2.51). Older Tritons write no reason label: nothing is shed as far as they say.
SHED_REASON = "REJECTED"
KEYS = (*COUNTERS, "rejected")

# What a pod answers on its metrics port is the tenant's: every read is bounded. A real Triton's
# page is 7 KB with one model version loaded (tests/triton/test_gates_on_triton.py measures it),
# a few KB more per version: 1 MiB holds a shared server of a hundred versions and more; a
# bigger page is not a Triton this operator serves.
MAX_BODY_BYTES = 1 << 20
READ_DEADLINE_S = 2.0          # connect, headers and body together
MAX_HEADER_BYTES, MAX_HEADERS = bounded_http.MAX_HEADER_BYTES, bounded_http.MAX_HEADERS
# Triton's counters are 64-bit: a larger value is not one of its counters.
MAX_COUNTER = float(2 ** 64)
MAX_LABELS = 16
MAX_MODEL_SERIES = 256     # series of one model version: Triton writes about 15
QUANTILES = (0.5, 0.9, 0.95, 0.99)   # the latency summary's, as Triton writes them

# What no Triton pod can have served, whatever its model: more requests per second than this over
# HTTP or gRPC, or an average queue time per request over ten minutes. A pod's counters that moved
# more in its window are not a reading (forged, or not Triton's): the pod counts as not read. The
# same bound holds the request and compute time per request (the capacity correction reads them).
MAX_POD_RPS = 100_000.0
MAX_QUEUE_US_PER_REQUEST = 600e6

# Linear-time pieces only: each is one character class, anchored, with nothing after it to
# backtrack into. Labels and values are scanned with str.find (tests/triton/test_metrics_hostile.py
# times them on megabyte lines).
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# NaN and Inf in any case: Prometheus writes NaN, Triton's exporter (prometheus-cpp) writes Nan.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|(?i:nan|inf))")


class MetricsUnavailable(Exception):
    """The metrics endpoint did not answer in full, in time and within bounds; the message says
    which (the gates fall back to their client's numbers, the operator counts the pod unread)."""


class MetricsRejected(MetricsUnavailable):
    """The endpoint answered, but not with numbers Triton could have written for the model
    (malformed line, duplicate series, a value no counter holds): nothing of it is used."""


@dataclass(frozen=True)
class ModelCounters:
    values: dict[str, float]
    quantiles_us: dict[float, float]     # the latency summary's quantiles, when Triton reports it
    seen: bool = True                    # some series of the model was there (False: none at all)
    note: str = ""                       # when not seen: what the body held instead

    def minus(self, before: "ModelCounters") -> dict[str, float]:
        return {k: self.values.get(k, 0.0) - before.values.get(k, 0.0) for k in KEYS}


def _labels(line: str, start: int, where: str) -> tuple[dict[str, str], int]:
    """The label set from `line[start]` (just after "{") and the index after "}"; linear in the line."""
    labels: dict[str, str] = {}
    i, n = start, len(line)
    while True:
        while i < n and line[i] == " ":
            i += 1
        if i < n and line[i] == "}":
            return labels, i + 1
        key = _LABEL_NAME.match(line, i)
        if key is None:
            raise MetricsRejected(f"{where}: malformed label at column {i + 1}")
        i = key.end()
        if line[i:i + 2] != '="':
            raise MetricsRejected(f"{where}: label {key.group()[:40]!r} has no quoted value")
        k = line.find('"', i + 2)
        if k < 0:
            raise MetricsRejected(f"{where}: unterminated label value")
        value = line[i + 2:k]
        # Triton writes model, version, reason and quantile values that need no escape: a series
        # of its names with an escaped value is not Triton's (and no escape is ever scanned).
        if "\\" in value:
            raise MetricsRejected(f"{where}: escaped label value {_printable(value)}: not written by Triton")
        if key.group() in labels:
            raise MetricsRejected(f"{where}: label {key.group()[:40]!r} given twice")
        labels[key.group()] = value
        if len(labels) > MAX_LABELS:
            raise MetricsRejected(f"{where}: more than {MAX_LABELS} labels")
        i = k + 1
        while i < n and line[i] == " ":
            i += 1
        if i < n and line[i] == ",":
            i += 1
        elif not (i < n and line[i] == "}"):
            raise MetricsRejected(f"{where}: expected ',' or '}}' at column {i + 1}")


def _value(token: str, where: str, name: str) -> float:
    if len(token) > 64 or _NUMBER.fullmatch(token) is None:
        raise MetricsRejected(f"{where}: {name} value {token[:40]!r} is not a number")
    return float(token)


def _printable(text: str, limit: int = 60) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def parse(text: str, model: str, version: str = "") -> ModelCounters:
    """The counters and latency summary of `model` (of `version` only, when given; summed over its
    versions otherwise), and of its failures those Triton shed ("rejected"), strictly: a series of the model that Triton could not have written
    (malformed, repeated, a counter not finite, negative or over 64 bits) rejects the whole
    reading (MetricsRejected) rather than be guessed at. Lines of other names are not parsed
    beyond their name. Linear in the text."""
    return parse_models(text, (model,), version)[model]


def parse_models(text: str, models: Sequence[str], version: str = "") -> dict[str, ModelCounters]:
    """parse() of each of `models` in one pass over the text (a shared server's page holds every
    member's series): linear in the text whatever the count."""
    wanted = set(models)
    values = {m: {k: 0.0 for k in KEYS} for m in wanted}
    quantiles: dict[str, dict[float, float]] = {m: {} for m in wanted}
    seen: set[str] = set()
    series: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = {m: set() for m in wanted}
    other_versions: dict[str, set[str]] = {m: set() for m in wanted}
    other_models = 0
    sample_lines = 0
    garbage = ""
    for number, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line or line[0] == "#":
            continue
        name_match = _NAME.match(line)
        if name_match is None:
            garbage = garbage or f"line {number}: {_printable(line)}"
            continue
        name = name_match.group()
        after = name_match.end()
        if after < len(line) and line[after] not in "{ \t":
            garbage = garbage or f"line {number}: {_printable(line)}"
            continue
        sample_lines += 1
        if name not in _NAMES and name != SUMMARY:
            continue
        where = f"line {number} ({name})"
        labels: dict[str, str] = {}
        if after < len(line) and line[after] == "{":
            labels, after = _labels(line, after + 1, where)
        rest = line[after:].split()
        if not 1 <= len(rest) <= 2:
            raise MetricsRejected(f"{where}: expected a value (and a timestamp) after the labels")
        model = labels.get("model")
        if model not in wanted:
            other_models += 1
            continue
        if version and labels.get("version") != version:
            other_versions[model].add(labels.get("version", "none")[:20])
            continue
        key = (name, tuple(sorted(labels.items())))
        if key in series[model]:
            raise MetricsRejected(f"{where}: duplicate series {_printable(str(dict(key[1])), 120)}: "
                                  "two exporters, or not Triton")
        series[model].add(key)
        if len(series[model]) > MAX_MODEL_SERIES:
            raise MetricsRejected(f"{where}: more than {MAX_MODEL_SERIES} series of model {model}: not Triton's page")
        value = _value(rest[0], where, name)
        seen.add(model)
        if name == SUMMARY:
            if "quantile" not in labels:
                raise MetricsRejected(f"{where}: a summary quantile line without a quantile label")
            q = _value(labels["quantile"], where, "quantile")
            if not 0.0 <= q <= 1.0:
                raise MetricsRejected(f"{where}: quantile {labels['quantile'][:20]!r} is not within 0..1")
            if math.isnan(value) or q not in QUANTILES:   # Triton's empty window; quantiles nobody reads
                continue
            if not 0.0 <= value <= MAX_COUNTER:
                raise MetricsRejected(f"{where}: latency {rest[0][:40]} us is not a latency")
            quantiles[model][q] = value
            continue
        if not (value == value and 0.0 <= value <= MAX_COUNTER):
            raise MetricsRejected(f"{where}: counter value {rest[0][:40]} is not a 64-bit counter "
                                  "(NaN, infinite, negative or too large)")
        values[model][_NAMES[name]] += value
        if name == COUNTERS["failure"] and labels.get("reason") == SHED_REASON:
            values[model]["rejected"] += value
    out = {}
    for model in wanted:
        note = ""
        if model not in seen:
            if other_versions[model]:
                note = (f"series of model {model} only for version(s) "
                        f"{', '.join(sorted(other_versions[model])[:5])}, not {version}")
            elif sample_lines:
                note = f"{sample_lines} series, {other_models} of them of other models, none of model {model}"
            elif garbage:
                note = f"not Prometheus text ({garbage})"
            else:
                note = "an empty metrics page"
        out[model] = ModelCounters(values[model], quantiles[model], model in seen, note)
    return out


GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
MAX_GPUS = 64
MAX_GPU_BYTES = float(2 ** 50)       # 1 PiB: no card holds more


def gpu_memory_used(text: str) -> dict[str, float]:
    """Triton's nv_gpu_memory_used_bytes by gpu_uuid: {} when the page has none (a server without a
    GPU, or started with --allow-gpu-metrics=false). Strict as `parse`: a series Triton could not
    have written rejects the reading."""
    used: dict[str, float] = {}
    for number, line in enumerate(text.split("\n"), 1):
        if not line.startswith(GPU_MEMORY_USED) or line[len(GPU_MEMORY_USED):len(GPU_MEMORY_USED) + 1] not in ("{", " "):
            continue
        where = f"line {number} ({GPU_MEMORY_USED})"
        labels, after = ({}, len(GPU_MEMORY_USED))
        if line[after] == "{":
            labels, after = _labels(line.rstrip("\r"), after + 1, where)
        rest = line[after:].split()
        if not 1 <= len(rest) <= 2:
            raise MetricsRejected(f"{where}: expected a value after the labels")
        gpu = labels.get("gpu_uuid", "")
        value = _value(rest[0], where, GPU_MEMORY_USED)
        if not gpu or gpu in used:
            raise MetricsRejected(f"{where}: {'no' if not gpu else 'a repeated'} gpu_uuid label")
        if not 0.0 <= value <= MAX_GPU_BYTES:
            raise MetricsRejected(f"{where}: {rest[0][:40]} bytes is not a GPU's memory")
        used[gpu] = value
        if len(used) > MAX_GPUS:
            raise MetricsRejected(f"{where}: more than {MAX_GPUS} GPUs")
    return used


def implausible(moved: Mapping[str, float], seconds: float | None) -> str | None:
    """Why counter differences over `seconds` cannot be a Triton pod's (None: they can). Without
    the window's length only the queue time per request is checked."""
    done = moved.get("success", 0.0) + moved.get("failure", 0.0)
    if seconds is not None and done > MAX_POD_RPS * max(seconds, 1.0):
        return f"{done:.3g} requests in {seconds:.0f}s, over {MAX_POD_RPS:g}/s: not a reading"
    for key, what in (("queue_us", "queue"), ("request_us", "request"), ("compute_us", "compute")):
        if moved.get(key, 0.0) > MAX_QUEUE_US_PER_REQUEST * max(done, 1.0):
            return f"{moved[key]:.3g} us of {what} time for {done:.0f} requests: not a reading"
    return None


def _split(url: str) -> tuple[str, int]:
    target = url if "://" in url else f"http://{url}"
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise MetricsUnavailable(f"{url}: not an http HOST:PORT")
    try:
        return parts.hostname, parts.port or 80
    except ValueError:
        raise MetricsUnavailable(f"{url}: not an http HOST:PORT") from None


def fetch(host: str, port: int, deadline_s: float = READ_DEADLINE_S, max_bytes: int = MAX_BODY_BYTES,
          path: str = "/metrics") -> str:
    """The body of GET http://host:port/path, within one deadline for connect, headers and body
    together, at most `max_bytes` of body, 200 only (no redirect is followed). MetricsUnavailable
    says what went wrong; nothing else is raised."""
    try:
        _, body = bounded_http.exchange(host, port, "GET", path, deadline_s=deadline_s, max_bytes=max_bytes,
                                        accept="text/plain", redirect_note="metrics are read from the pod itself")
    except bounded_http.AnswerRefused as exc:
        raise MetricsUnavailable(str(exc)) from None
    return body.decode("utf-8", errors="replace")


def scrape(url: str, model: str, version: str = "", timeout_s: float = READ_DEADLINE_S,
           max_bytes: int = MAX_BODY_BYTES) -> ModelCounters:
    """`url`: HOST:PORT of Triton's metrics endpoint; `timeout_s` bounds the whole read."""
    host, port = _split(url)
    return parse(fetch(host, port, timeout_s, max_bytes), model, version)


def read_gpu_memory(url: str, timeout_s: float = READ_DEADLINE_S) -> dict[str, float]:
    """`url`: HOST:PORT of Triton's metrics endpoint; nv_gpu_memory_used_bytes by gpu_uuid."""
    host, port = _split(url)
    return gpu_memory_used(fetch(host, port, timeout_s))


def run_report(before: ModelCounters, after: ModelCounters) -> dict[str, float | None]:
    """Triton's view of the run: batch sizes, queue time, P99, cache hits, requests it shed."""
    delta = after.minus(before)
    executions, success = delta["executions"], delta["success"]
    lookups = delta["cache_hits"] + delta["cache_misses"]
    p99 = after.quantiles_us.get(0.99)
    requests = success + delta["failure"]
    return {
        "requests": requests,
        "failures": delta["failure"],
        # Of the failures, those Triton shed (queue timeout): load, not a broken model.
        "rejected": delta["rejected"],
        "shedRatio": delta["rejected"] / requests if requests else None,
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
