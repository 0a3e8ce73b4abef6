"""A latency profile measured on a live Triton model, from the server's own statistics.

Compute time per batch size is what Triton's statistics extension records per executed batch
(`GET /v2/models/<m>/stats`, `batch_stats[]`: compute_input + compute_infer + compute_output,
count and ns): the server's view, without the client's network and (de)serialisation. Requests
are sent one at a time, so the dynamic batcher has nothing to join and every execution has the
batch size sent; the statistics are read after each request, so each execution is timed on its
own and the profile is the median (a scheduler hiccup on a busy node moves a mean, not a median).
An execution of another size, or more than one, between two reads is other traffic: not counted.

The slowdown when two instances share a device (planning.sharedGpuSlowdown) is measured when the
model runs two or more instances: two clients send requests of a size no two of which fit one
batch (2b > max_batch_size), so both instances execute at once; slowdown = paired mean / solo
mean - 1, the simulator's compute x (1 + slowdown x others running).
"""
from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rankops.api.planning import MAX_PROFILE_BATCH


class MeasureError(RuntimeError):
    """The profile could not be measured; the message says what was wrong and the fix."""


# --- the statistics extension (pure) ------------------------------------------------------------

@dataclass(frozen=True)
class StatsSnapshot:
    batches: dict[int, tuple[int, int]]   # executed batch size -> (executions, ns of input+infer+output)
    success: int
    fail: int


def parse_stats(doc: dict[str, Any], model: str, version: str = "") -> StatsSnapshot:
    """Triton's /v2/models/<m>/stats answer, summed over the model's versions unless one is named."""
    batches: dict[int, tuple[int, int]] = {}
    success = fail = 0
    for entry in doc.get("model_stats") or []:
        if entry.get("name") != model or (version and str(entry.get("version")) != version):
            continue
        stats = entry.get("inference_stats") or {}
        success += int((stats.get("success") or {}).get("count", 0))
        fail += int((stats.get("fail") or {}).get("count", 0))
        for batch in entry.get("batch_stats") or []:
            size = int(batch.get("batch_size", 0))
            count = int((batch.get("compute_infer") or {}).get("count", 0))
            ns = sum(int((batch.get(part) or {}).get("ns", 0))
                     for part in ("compute_input", "compute_infer", "compute_output"))
            old_count, old_ns = batches.get(size, (0, 0))
            batches[size] = (old_count + count, old_ns + ns)
    return StatsSnapshot(batches, success, fail)


def executions_between(before: StatsSnapshot, after: StatsSnapshot) -> dict[int, tuple[int, float]]:
    """Executions per batch size between two snapshots: {size: (count, total ms)}."""
    out = {}
    for size, (count, ns) in after.batches.items():
        old_count, old_ns = before.batches.get(size, (0, 0))
        if count > old_count:
            out[size] = (count - old_count, (ns - old_ns) / 1e6)
    return out


def default_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to max_batch_size, and max_batch_size itself."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch_size]


def shared_batch_size(max_batch_size: int, sizes: list[int]) -> int:
    """The smallest measured size no two requests of which fit one batch, else max_batch_size."""
    return min((b for b in sizes if 2 * b > max_batch_size), default=max_batch_size)


# --- what was measured ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchTiming:
    batch_size: int
    executions: int            # timed executions (one per request sent, other traffic excluded)
    median_ms: float
    p90_ms: float
    mean_ms: float
    client_median_ms: float    # request round trip at the client, for comparison


@dataclass(frozen=True)
class GpuMemory:
    """Triton's nv_gpu_memory_used_bytes on the GPU that moved most, in MiB, each reading settled
    (settled_gpu_memory): with the model unloaded (None without --reload), loaded, and after the
    profile's requests up to `largest_batch`."""
    gpu: str
    unloaded_mib: float | None
    loaded_mib: float
    at_max_batch_mib: float
    largest_batch: int                 # the largest batch the profile sent

    def planning(self, instances: int) -> dict[str, float]:
        """spec.planning.memory from the readings. Weights: what the load added, per instance (each
        loads its own copy; embeddings held on the GPU are in it). Activations: what max-batch requests
        added, per item, as one instance's (requests sent one at a time run on one instance). The runtime
        reserve is the unloaded reading only when the model was the server's only one (the caller says).
        CUDA's allocator may keep memory after an unload: the weights are then a floor."""
        out = {"activationMiBPerItem": round(max(0.0, self.at_max_batch_mib - self.loaded_mib) / self.largest_batch, 3)}
        if self.unloaded_mib is not None:
            out["weightsMiB"] = round(max(0.0, self.loaded_mib - self.unloaded_mib) / instances, 1)
        return out

    def describe(self, instances: int) -> str:
        figures = ", ".join(f"{k} {v:g}" for k, v in self.planning(instances).items())
        unloaded = f"unloaded {self.unloaded_mib:.0f} MiB, " if self.unloaded_mib is not None else ""
        return (f"{self.gpu}: {unloaded}loaded {self.loaded_mib:.0f} MiB, after batch {self.largest_batch} "
                f"{self.at_max_batch_mib:.0f} MiB -> {figures}"
                + ("" if self.unloaded_mib is not None else " (weights: measure with --reload)"))


def gpu_memory(unloaded: dict[str, float] | None, loaded: dict[str, float], at_max: dict[str, float],
               largest_batch: int) -> GpuMemory:
    """The readings (bytes by gpu_uuid) of the GPU whose use moved most between the first and the last."""
    first = unloaded if unloaded is not None else loaded
    common = sorted(set(first) & set(loaded) & set(at_max))
    if not common:
        raise MeasureError("the GPUs in Triton's nv_gpu_memory_used_bytes changed between readings")
    gpu = max(common, key=lambda g: (at_max[g] - first[g], g))
    mib = lambda b: b / (1 << 20)  # noqa: E731
    return GpuMemory(gpu, mib(unloaded[gpu]) if unloaded is not None else None, mib(loaded[gpu]), mib(at_max[gpu]),
                     largest_batch)


@dataclass
class Measurement:
    url: str
    model: str
    version: str
    max_batch_size: int
    instances: int
    timings: list[BatchTiming]
    slowdown: float | None = None
    slowdown_detail: str = ""
    notes: list[str] = field(default_factory=list)
    gpu_memory: GpuMemory | None = None
    gpu_memory_detail: str = "not measured (--no-memory)"

    def profile(self) -> dict[int, float]:
        return {t.batch_size: round(t.median_ms, 3) for t in self.timings}

    def planning(self) -> dict[str, Any]:
        """The spec.planning fields this measurement gives."""
        out: dict[str, Any] = {"latencyProfile": self.profile()}
        if self.slowdown is not None:
            out["sharedGpuSlowdown"] = self.slowdown
        if self.gpu_memory is not None:
            out["memory"] = self.gpu_memory.planning(self.instances)
        return out

    def config_map(self, name: str, namespace: str | None, key: str) -> dict[str, Any]:
        """The profile ConfigMap planning.latencyProfileConfigMap {name, key} reads."""
        import yaml

        metadata: dict[str, Any] = {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "rankops", "rankops.io/profile-of": self.model},
            "annotations": {
                "rankops.io/measured-from": f"{self.model}{':' + self.version if self.version else ''} at {self.url}",
                "rankops.io/measured-at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "rankops.io/executions-per-size": str(min((t.executions for t in self.timings), default=0)),
            },
        }
        if self.slowdown is not None:
            # not part of the profile key: it is spec.planning.sharedGpuSlowdown
            metadata["annotations"]["rankops.io/shared-gpu-slowdown"] = f"{self.slowdown:g}"
        if namespace:
            metadata["namespace"] = namespace
        text = yaml.safe_dump(self.profile(), sort_keys=False)
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {key: text}}

    def report(self) -> str:
        """The measurement as a table, for stderr."""
        lines = [f"{self.model}{':' + self.version if self.version else ''} at {self.url}: "
                 f"max_batch_size {self.max_batch_size}, {self.instances} instance(s); server-side "
                 "compute (input+infer+output) per execution:",
                 f"  {'batch':>6}  {'median ms':>9}  {'p90 ms':>7}  {'mean ms':>7}  {'client ms':>9}  {'runs':>4}"]
        for t in self.timings:
            lines.append(f"  {t.batch_size:6d}  {t.median_ms:9.3f}  {t.p90_ms:7.3f}  {t.mean_ms:7.3f}  "
                         f"{t.client_median_ms:9.3f}  {t.executions:4d}")
        lines.append(f"  shared device: {self.slowdown_detail}")
        lines.append(f"  GPU memory: {self.gpu_memory_detail}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# --- talking to the server ------------------------------------------------------------------------

def _base(url: str) -> str:
    return f"http://{url}"


def _get_json(url: str, path: str, timeout_s: float, body: bytes | None = None) -> Any:
    request = urllib.request.Request(_base(url) + path, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", errors="replace")
        try:
            text = json.loads(text).get("error", text)
        except (ValueError, AttributeError):
            pass
        raise MeasureError(f"{url}{path}: HTTP {exc.code}: {' '.join(str(text).split())[:300]}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise MeasureError(_unreachable(url, getattr(exc, "reason", exc))) from None


def _unreachable(url: str, why: Any) -> str:
    return (f"the Triton server at {url} does not answer ({why}): pass --url HOST:PORT of its HTTP port "
            "(8000), e.g. after `kubectl port-forward deploy/<model>-stable 8000`")


def _version_path(model: str, version: str) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")


def _check_model(url: str, model: str, version: str, timeout_s: float) -> dict[str, Any]:
    """The model's config; an unknown or unloaded model is refused naming what the server has."""
    try:
        with urllib.request.urlopen(_base(url) + "/v2/health/live", timeout=timeout_s):
            pass
    except urllib.error.HTTPError as exc:
        raise MeasureError(f"the Triton server at {url} is not live (HTTP {exc.code}): wait for it to start, "
                           "or check its log") from None
    except (urllib.error.URLError, OSError) as exc:
        raise MeasureError(_unreachable(url, getattr(exc, "reason", exc))) from None
    try:
        with urllib.request.urlopen(_base(url) + _version_path(model, version) + "/ready", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        raise MeasureError(_not_ready(url, model, version, timeout_s)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise MeasureError(_unreachable(url, getattr(exc, "reason", exc))) from None
    return _get_json(url, _version_path(model, version) + "/config", timeout_s)


def _not_ready(url: str, model: str, version: str, timeout_s: float) -> str:
    name = f"{model}{':' + version if version else ''}"
    try:
        index = _get_json(url, "/v2/repository/index", timeout_s, body=b"{}")
    except MeasureError:
        index = []
    mine = [e for e in index if e.get("name") == model]
    failed = [e for e in mine if e.get("state") not in (None, "READY") and e.get("reason")]
    if failed:
        return (f"model {name} at {url} is not ready: {failed[0].get('state')}: {failed[0]['reason']}; "
                "fix the model so it loads (the server's log says more), then profile it")
    if mine and version:
        ready = sorted(str(e.get("version")) for e in mine if e.get("state") == "READY")
        return (f"model {model} at {url} has no ready version {version} (ready: {', '.join(ready) or 'none'}): "
                f"pass --model {model}:<version> with one of them, or {model} for the server's choice")
    loaded = sorted({str(e.get("name")) for e in index if e.get("state") == "READY"})
    return (f"model {name} is not loaded at {url}; models ready there: {', '.join(loaded) or 'none'}: "
            "pass --model with one of them (the RankingModel's name is the Triton model name)")


def _snapshot(url: str, model: str, version: str, timeout_s: float) -> StatsSnapshot:
    doc = _get_json(url, _version_path(model, version) + "/stats", timeout_s)
    return parse_stats(doc, model, version)


# --- requests ---------------------------------------------------------------------------------------

STATS_WAIT_S = 1.0


def _recorded(url: str, model: str, version: str, timeout_s: float,
              before: StatsSnapshot) -> tuple[StatsSnapshot, dict[int, tuple[int, float]]]:
    """The statistics once the execution of the request just answered shows in them: Triton answers
    a request before it records the execution (a loaded machine read 0, then 2 executions)."""
    deadline = time.monotonic() + STATS_WAIT_S
    while True:
        after = _snapshot(url, model, version, timeout_s)
        seen = executions_between(before, after)
        if seen or time.monotonic() > deadline:
            return after, seen
        time.sleep(0.005)


def _instances(config: dict[str, Any]) -> int:
    groups = config.get("instance_group") or []
    return sum(int(g.get("count", 1) or 1) for g in groups) or 1


def request_builder(config: dict[str, Any], samples_path: str | None, fill_dim: int) -> Callable[[int], dict]:
    """inputs for a request of batch b: a recorded sample's rows repeated to b, or generated (zero
    ids are valid in any embedding table; floats standard normal)."""
    from rankops.triton.samples import InputSpec, SamplesError, generate_samples, load_samples

    if samples_path:
        try:
            sample = load_samples(samples_path)[0]
        except SamplesError as exc:
            raise MeasureError(f"--samples: {exc}") from None
        return lambda b: {name: np.resize(a, (b, *a.shape[1:])) for name, a in sample.inputs.items()}
    specs = []
    for tensor in config.get("input") or []:
        dtype = str(tensor.get("data_type", "")).removeprefix("TYPE_")
        if dtype in ("STRING", "BYTES"):
            raise MeasureError(f"input {tensor.get('name')!r} is {dtype}, which cannot be generated: pass a "
                               "recorded request with --samples FILE (one {\"inputs\": {...}} JSON line)")
        dims = tuple(int(d) for d in tensor.get("dims") or [])
        specs.append(InputSpec(name=tensor["name"], data_type=dtype, dims=dims,
                               max_dims=tuple(fill_dim if d == -1 else d for d in dims)))
    if not specs:
        raise MeasureError("the model's config declares no inputs: pass a recorded request with --samples FILE")

    def build(b: int) -> dict:
        try:
            return generate_samples(specs, 1, [b], int_high=1)[0].inputs
        except SamplesError as exc:
            raise MeasureError(f"cannot generate a request: {exc}") from None
    return build


# --- the measurement ------------------------------------------------------------------------------

def measure(url: str, model: str, version: str = "", *, batch_sizes: list[int] | None = None,
            requests: int = 20, warmup: int = 3, samples_path: str | None = None, fill_dim: int = 1,
            shared: bool = True, timeout_s: float = 30.0, memory: bool = True, metrics_url: str | None = None,
            reload: bool = False, api_headers: dict[str, str] | None = None,
            say: Callable[[str], None] = lambda _: None) -> Measurement:
    """`memory`: read Triton's nv_gpu_memory_used_bytes from `metrics_url` (default: the same host, port
    8002) loaded and after the max-batch requests; `reload`: also unload and load the model first (its
    weights), through the repository API (`api_headers`: the restricted API's key header)."""
    from rankops.triton.client import Endpoint, GateClientError, InferenceFailed, normalize_url
    from rankops.triton.samples import Sample

    try:
        url = normalize_url(url)
    except ValueError as exc:
        raise MeasureError(str(exc)) from None
    if requests < 3:
        raise MeasureError(f"--requests {requests}: at least 3 per batch size (the profile is their median)")
    config = _check_model(url, model, version, timeout_s)
    readings, memory_detail = _first_gpu_readings(url, model, version, timeout_s, memory, metrics_url, reload,
                                                  api_headers)
    max_batch = int(config.get("max_batch_size") or 0)
    if max_batch < 1:
        raise MeasureError(f"model {model} has max_batch_size 0 (no batch dimension): a profile is compute "
                           "time per batch size; give the model a batch dimension (max_batch_size > 0)")
    sizes = sorted(set(batch_sizes or default_batch_sizes(min(max_batch, MAX_PROFILE_BATCH))))
    too_big = [b for b in sizes if b > max_batch or b < 1]
    if too_big:
        raise MeasureError(f"--batch-sizes {too_big}: model {model} takes batches of 1..{max_batch} "
                           "(its max_batch_size)")
    instances = _instances(config)
    shared_size = shared_batch_size(max_batch, sizes) if shared and instances >= 2 else None
    if shared_size is not None and shared_size not in sizes:
        sizes.append(shared_size)
        sizes.sort()
    build = request_builder(config, samples_path, fill_dim)
    endpoint = Endpoint(url, model, version, timeout_s=timeout_s)

    def connect():
        try:
            connection = endpoint.connect()
            return connection, connection.model_info()
        except GateClientError as exc:
            raise MeasureError(str(exc)) from None

    def prepared(connection, info, b):
        try:
            return connection.build_request(Sample(line=1, inputs=build(b)), info)
        except (GateClientError, ValueError) as exc:
            raise MeasureError(f"a request of batch {b} does not fit model {model}: {exc}; pass a recorded "
                               "request with --samples FILE") from None

    def send(connection, request, b):
        try:
            connection.infer(request)
        except InferenceFailed as exc:
            raise MeasureError(
                f"model {model} at {url} fails requests (batch {b}): {exc}; check that it serves a request "
                "at all (the server's log says why), or pass a recorded request it accepts with --samples "
                "FILE if the generated inputs are invalid for it") from None
        except GateClientError as exc:
            raise MeasureError(str(exc)) from None

    connection, info = connect()
    timings, notes, solo_means = [], [], {}
    try:
        prepared_requests = {b: prepared(connection, info, b) for b in sizes}
        for b in sizes:
            for _ in range(warmup):
                send(connection, prepared_requests[b], b)
        # Round robin over the sizes: a burst of load on the node slows every size alike, which
        # keeps the profile's shape (what the planner uses) even when its level wobbles.
        runs: dict[int, list[float]] = {b: [] for b in sizes}
        client: dict[int, list[float]] = {b: [] for b in sizes}
        other = dict.fromkeys(sizes, 0)
        before = _snapshot(url, model, version, timeout_s)
        for _ in range(requests):
            for b in sizes:
                start = time.perf_counter()
                send(connection, prepared_requests[b], b)
                client[b].append((time.perf_counter() - start) * 1000)
                after, seen = _recorded(url, model, version, timeout_s, before)
                if set(seen) == {b} and seen[b][0] == 1:
                    runs[b].append(seen[b][1])
                else:
                    other[b] += 1
                before = after
        for b in sizes:
            timed = sorted(runs[b])
            if len(timed) < max(3, requests // 2):
                raise MeasureError(
                    f"other traffic on model {model} at {url}: only {len(timed)} of {requests} executions of batch "
                    f"{b} ran alone; profile a replica that serves no other clients")
            if other[b]:
                notes.append(f"batch {b}: {other[b]} execution(s) overlapped other traffic, not counted")
            timing = BatchTiming(b, len(timed), statistics.median(timed), timed[int(0.9 * (len(timed) - 1))],
                                 statistics.fmean(timed), statistics.median(client[b]))
            timings.append(timing)
            solo_means[b] = timing.mean_ms
            say(f"profile: batch {b}: {timing.median_ms:.3f} ms (median of {len(timed)})")
        for small, large in zip(timings, timings[1:]):
            if large.median_ms < 0.9 * small.median_ms:
                notes.append(f"batch {large.batch_size} measured faster than batch {small.batch_size} "
                             f"({large.median_ms:.3f} < {small.median_ms:.3f} ms): noisy, or the backend picks "
                             "other kernels there; rerun with more --requests if unexpected")
    finally:
        connection.close()

    measurement = Measurement(url=url, model=model, version=version, max_batch_size=max_batch,
                              instances=instances, timings=timings, notes=notes, gpu_memory_detail=memory_detail)
    if readings is not None:
        from rankops.triton.metrics import MetricsUnavailable, read_gpu_memory
        try:
            at_max = settled_gpu_memory(lambda: read_gpu_memory(readings[2], timeout_s))
            measurement.gpu_memory = gpu_memory(readings[0], readings[1], at_max, largest_batch=max(sizes))
            measurement.gpu_memory_detail = measurement.gpu_memory.describe(instances)
        except (MetricsUnavailable, MeasureError) as exc:
            measurement.gpu_memory_detail = f"not measured: {exc}"
    if not shared:
        measurement.slowdown_detail = "not measured (--no-shared)"
    elif shared_size is None:
        measurement.slowdown_detail = (f"not measured: the model runs {instances} instance; load it with "
                                       "instance_group count 2 (spec.instancesPerGpu: 2) to measure it")
    else:
        _measure_shared(measurement, shared_size, solo_means[shared_size], requests,
                        lambda: connect(), prepared, send, lambda: _snapshot(url, model, version, timeout_s))
        say(f"profile: shared device: {measurement.slowdown_detail}")
    return measurement


def _first_gpu_readings(url: str, model: str, version: str, timeout_s: float, memory: bool, metrics_url: str | None,
                        reload: bool, api_headers: dict[str, str] | None):
    """((unloaded or None, loaded, metrics_url), "") or (None, why GPU memory is not measured)."""
    from rankops.triton.metrics import MetricsUnavailable, read_gpu_memory
    from rankops.triton.repository import Repository, RepositoryError

    if not memory:
        return None, "not measured (--no-memory)"
    metrics_url = metrics_url or f"{url.rsplit(':', 1)[0]}:8002"
    try:
        first = read_gpu_memory(metrics_url, timeout_s)
    except MetricsUnavailable as exc:
        return None, f"not measured: {exc} (--metrics-url HOST:PORT of Triton's metrics port, or --no-memory)"
    if not first:
        return None, (f"not measured: Triton at {metrics_url} exports no nv_gpu_memory_used_bytes (a server "
                      "without a GPU, or started with --allow-gpu-metrics=false)")
    if not reload:
        return (None, first, metrics_url), ""
    host, port = url.rsplit(":", 1)
    repository = Repository(host, int(port), api_headers)
    try:
        repository.unload(model)
        try:
            _until(lambda: not any(e.name == model for e in repository.index() if e.state != "UNAVAILABLE"),
                   timeout_s, f"model {model} to unload")
            unloaded = settled_gpu_memory(lambda: read_gpu_memory(metrics_url, timeout_s))
        finally:
            repository.load(model)       # the replica gets its model back whatever was read
        _check_model(url, model, version, timeout_s)
        return (unloaded, settled_gpu_memory(lambda: read_gpu_memory(metrics_url, timeout_s)), metrics_url), ""
    except (RepositoryError, MetricsUnavailable) as exc:
        raise MeasureError(f"--reload: {exc}; give the restricted API's key in RANKOPS_TRITON_API_KEY, or drop "
                           "--reload") from None


# Triton refreshes its GPU metrics every --metrics-interval-ms (2000 by default): a reading straight
# after a load or an unload may still be the one before.
METRICS_INTERVAL_S = 2.0
SETTLE_READINGS = 5


def settled_gpu_memory(read: Callable[[], dict[str, float]], interval_s: float = METRICS_INTERVAL_S,
                       sleep: Callable[[float], None] = time.sleep) -> dict[str, float]:
    """A reading that two metrics intervals apart has not moved (at most SETTLE_READINGS tries: the last)."""
    last = read()
    for _ in range(SETTLE_READINGS):
        sleep(interval_s)
        now = read()
        if now == last:
            return now
        last = now
    return last


def _until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise MeasureError(f"--reload: waited {timeout_s:g}s for {what}")
        time.sleep(0.1)


def _measure_shared(measurement: Measurement, b: int, solo_ms: float, requests: int, connect, prepared, send,
                    snapshot) -> None:
    """Two clients at once, each sending `requests` requests of batch b back to back."""
    pairs = [connect() for _ in range(2)]
    prepared_requests = [prepared(c, i, b) for c, i in pairs]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def client(index: int) -> None:
        connection, _ = pairs[index]
        try:
            barrier.wait(timeout=30)
            for _ in range(requests):
                send(connection, prepared_requests[index], b)
        except BaseException as exc:   # re-raised in the caller's thread
            errors.append(exc)

    before = snapshot()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = snapshot()
    for connection, _ in pairs:
        connection.close()
    if errors:
        raise errors[0]
    seen = executions_between(before, after)
    count, total_ms = seen.get(b, (0, 0.0))
    if count < requests:
        measurement.slowdown_detail = (f"not measured: only {count} of {2 * requests} paired requests of batch "
                                       f"{b} executed at that size (other traffic, or requests were joined)")
        return
    paired = total_ms / count
    raw = paired / solo_ms - 1.0
    clamped = min(1.0, max(0.0, raw))
    measurement.slowdown = round(clamped, 3)
    measurement.slowdown_detail = (f"two instances at batch {b}: {paired:.3f} ms per execution vs {solo_ms:.3f} ms "
                                   f"alone -> sharedGpuSlowdown {measurement.slowdown:g}"
                                   + (f" (measured {raw:.3f}, clamped to 0..1)" if raw != clamped else ""))
