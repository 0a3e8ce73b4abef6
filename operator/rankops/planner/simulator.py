"""Discrete-event simulation of Triton's dynamic batcher on one GPU, plus closed-form bounds.

Model (one GPU, one model, one request = one batch item):
* Requests join one FIFO queue. When a model instance is free and requests wait, the batcher
  sends at once a batch of max_batch_size if that many wait, else the largest preferred size
  that can be formed; otherwise it holds the oldest request up to max_queue_delay for the queue
  to reach the next preferred size (or max_batch_size), then sends what it has.
* An execution of b items takes the profile's compute time for b. N instances share the GPU:
  an execution that starts while k other instances are running takes
  compute(b) * (1 + slowdown * k). slowdown = 1 is pure time-slicing (more instances add no
  throughput), 0 perfect overlap. It is fixed at dispatch (later starts do not re-slow a running
  execution): cheap, and close on average. Real overlap depends on the model; measure it with
  perf_analyzer at instance counts 1 and 2 and set planning.sharedGpuSlowdown.
* Latency = completion - arrival + overhead_ms (network, serialisation: outside the GPU).
* Requests that carry several candidates (spec.candidates layout batch: a request of N candidates
  is a batch of N) are simulated with `items=(lo, hi)`: each request brings a number of items
  drawn uniformly from lo..hi, max_batch_size and preferred sizes count items, and the batcher
  follows Triton's rules for them (`run_batcher_items`): a request that would overflow
  max_batch_size waits for the next batch, a preferred size is an exact item count, and with
  preferred sizes the batch is also cut before the request that would pass the largest one.

The event loop steps per batch, not per request, with bisect on a plain list: a few µs per batch.
Arrivals for a rate are one fixed unit-rate Poisson trace scaled by 1/rate (common random
numbers), so results are deterministic and move smoothly with the rate, which keeps the
planner's bisection honest.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rankops.planner.profile import LatencyProfile


@dataclass(frozen=True)
class BatcherConfig:
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    instances: int = 1

    def describe(self) -> str:
        pref = ",".join(map(str, self.preferred_batch_sizes)) or "-"
        return (f"maxBatch={self.max_batch_size} preferred=[{pref}] "
                f"delay={self.max_queue_delay_us}us instances={self.instances}")


@dataclass(frozen=True)
class SimResult:
    offered_qps: float
    throughput_qps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    avg_batch_size: float
    gpu_busy_fraction: float
    requests: int
    largest_batch: int


@lru_cache(maxsize=16)
def _unit_poisson(requests: int, seed: int) -> np.ndarray:
    """Arrival times (in units of the mean gap) of a unit-rate Poisson process."""
    gaps = np.random.default_rng(seed).exponential(1.0, requests)
    arrivals = np.cumsum(gaps)
    arrivals.flags.writeable = False
    return arrivals


def poisson_arrivals_ms(rate_qps: float, requests: int, seed: int = 0) -> np.ndarray:
    return _unit_poisson(requests, seed) * (1000.0 / rate_qps)


@lru_cache(maxsize=16)
def request_items(requests: int, seed: int, lo: int, hi: int) -> tuple[int, ...]:
    """Items (candidates) per request, uniform on lo..hi: fixed per seed, like the arrivals."""
    return tuple(np.random.default_rng(seed + 7919).integers(lo, hi + 1, requests).tolist())


def mean_items(items: tuple[int, int] | None) -> float:
    return 1.0 if items is None else (items[0] + items[1]) / 2.0


def simulate(
    profile: LatencyProfile,
    config: BatcherConfig,
    *,
    rate_qps: float | None = None,
    arrivals_ms: np.ndarray | None = None,
    requests: int = 4000,
    seed: int = 0,
    slowdown: float = 0.75,
    overhead_ms: float = 0.0,
    warmup_fraction: float = 0.1,
    items: tuple[int, int] | None = None,
    prefetch: bool = True,
) -> SimResult:
    """Simulate Poisson arrivals at rate_qps, or the recorded arrival times arrivals_ms; `items`:
    (fewest, most) items per request, None for one. Rates count requests; batch sizes items.
    prefetch: with a queue delay, model Triton forming the next batch while instances are busy
    (run_batcher_prefetch, as measured); False for the idealised batcher that forms it when an
    instance frees."""
    if arrivals_ms is None:
        if not rate_qps or rate_qps <= 0:
            raise ValueError("simulate needs rate_qps > 0 or arrivals_ms")
        arrivals = poisson_arrivals_ms(rate_qps, requests, seed)
    else:
        arrivals = np.sort(np.asarray(arrivals_ms, dtype=float))
        if arrivals.size == 0:
            raise ValueError("arrivals_ms is empty")
    max_b = config.max_batch_size
    cost = profile.table(max_b)
    single = items is None or items == (1, 1)
    if single:
        weights = (1,) * len(arrivals)
    else:
        weights = request_items(len(arrivals), seed, *items)
        if items[1] > max_b:
            raise ValueError(f"a request of {items[1]} items cannot fit max_batch_size {max_b}")
    if config.max_queue_delay_us > 0 and prefetch:
        starts, ends, counts, sizes = run_batcher_prefetch(arrivals.tolist(), weights, cost, config, slowdown)
    elif single:
        starts, ends, sizes = run_batcher(arrivals.tolist(), cost, config, slowdown)
        counts = sizes
    else:
        starts, ends, counts, sizes = run_batcher_items(arrivals.tolist(), weights, cost, config, slowdown)

    sizes_a = np.asarray(sizes)
    ends_a = np.asarray(ends)
    done = np.repeat(ends_a, np.asarray(counts))
    latency = done - arrivals + overhead_ms
    skip = int(len(latency) * warmup_fraction)
    measured = latency[skip:] if len(latency) - skip >= 10 else latency
    p50, p99 = np.percentile(measured, [50, 99])
    span = max(ends_a[-1] - arrivals[0], 1e-9)
    starts_a = np.asarray(starts)
    prev_end = np.maximum.accumulate(np.concatenate(([starts_a[0]], ends_a[:-1])))
    busy = np.clip(ends_a - np.maximum(starts_a, prev_end), 0, None).sum()
    offered = rate_qps if arrivals_ms is None else len(arrivals) / max(arrivals[-1] - arrivals[0], 1e-9) * 1000
    return SimResult(
        offered_qps=float(offered),
        throughput_qps=float(len(arrivals) / span * 1000.0),
        p50_ms=float(p50),
        p99_ms=float(p99),
        mean_ms=float(measured.mean()),
        avg_batch_size=float(sizes_a.sum() / len(sizes)),
        gpu_busy_fraction=float(min(1.0, busy / span)),
        requests=len(arrivals),
        largest_batch=int(sizes_a.max()),
    )


def run_batcher(t: list[float], cost: list[float], config: BatcherConfig, slowdown: float):
    """The batcher's event loop, one iteration per executed batch. t: sorted arrival times (ms);
    cost[b]: compute ms for a batch of b. Returns per-batch (starts, ends, sizes); batches take
    requests in arrival order."""
    n = len(t)
    big = config.max_batch_size
    preferred = sorted(p for p in set(config.preferred_batch_sizes) if 1 <= p <= big)
    delay = config.max_queue_delay_us / 1000.0
    free = [t[0]] * config.instances
    starts: list[float] = []
    ends: list[float] = []
    sizes: list[int] = []
    head = 0
    while head < n:
        k = free.index(min(free))
        oldest = t[head]
        s = free[k] if free[k] > oldest else oldest
        limit = head + big if head + big < n else n
        waiting = bisect_right(t, s, head, limit) - head
        if waiting >= big:
            size = big
        else:
            size = 0
            for p in reversed(preferred):
                if p <= waiting:
                    size = p
                    break
            if not size:
                deadline = oldest + delay
                if s >= deadline:
                    size = waiting
                else:
                    target = next((p for p in preferred if p > waiting), big)
                    j = head + target - 1
                    if j < n and t[j] <= deadline:
                        s, size = t[j], target
                    else:
                        s = deadline
                        size = bisect_right(t, deadline, head, limit) - head
        running = sum(1 for f in free if f > s)
        end = s + cost[size] * (1.0 + slowdown * running)
        free[k] = end
        starts.append(s)
        ends.append(end)
        sizes.append(size)
        head += size
    return starts, ends, sizes


def _form_batch(t: list[float], w: tuple[int, ...], head: int, s: float, deadline: float,
                preferred: set[int], top: int, big: int) -> tuple[int, int, float]:
    """One batch of Triton's dynamic batcher formed from request `head` on, starting to form at `s`:
    (the first request left out, the batch's items, when it closed). Requests join while they fit
    in `big` items; a preferred size (the largest, `top`) closes it at once; otherwise it waits for
    the next arrival or the oldest request's `deadline`, whichever comes first."""
    n = len(t)
    j, pending, full = head, 0, False
    best_j = best_items = 0          # the preferred cut: requests up to best_j, best_items items
    while True:
        while j < n and t[j] <= s and not full:
            wj = w[j]
            if pending and preferred and pending + wj > top and not best_j:
                best_j, best_items = j, pending
            if pending + wj > big:
                full = True
                break
            pending += wj
            j += 1
            if pending in preferred:
                best_j, best_items = j, pending
        exceeded = s >= deadline
        if best_j and not exceeded:
            return best_j, best_items, s
        if full or pending >= big or exceeded:
            return j, pending, s
        s = t[j] if j < n and t[j] < deadline else deadline


def run_batcher_items(t: list[float], w: tuple[int, ...], cost: list[float], config: BatcherConfig,
                      slowdown: float):
    """run_batcher for requests of w[i] items each, with the rules of Triton's dynamic batcher
    (dynamic_batch_scheduler.cc GetDynamicBatch), re-evaluated at each arrival while it waits.
    Returns per-batch (starts, ends, requests, items)."""
    n = len(t)
    big = config.max_batch_size
    preferred = set(p for p in config.preferred_batch_sizes if 1 <= p <= big)
    top = max(preferred) if preferred else big
    delay = config.max_queue_delay_us / 1000.0
    free = [t[0]] * config.instances
    starts: list[float] = []
    ends: list[float] = []
    counts: list[int] = []
    items: list[int] = []
    head = 0
    while head < n:
        k = free.index(min(free))
        oldest = t[head]
        s = free[k] if free[k] > oldest else oldest
        deadline = oldest + delay
        take_j, take, s = _form_batch(t, w, head, s, deadline, preferred, top, big)
        running = sum(1 for f in free if f > s)
        end = s + cost[take] * (1.0 + slowdown * running)
        free[k] = end
        starts.append(s)
        ends.append(end)
        counts.append(take_j - head)
        items.append(take)
        head = take_j
    return starts, ends, counts, items


def run_batcher_prefetch(t: list[float], w: tuple[int, ...], cost: list[float], config: BatcherConfig,
                         slowdown: float):
    """Triton's batcher with max_queue_delay > 0, as measured on tritonserver 2.51: it forms the next
    batch while every instance is busy (one prefetched payload, whatever the instance count) and
    closes it when its oldest request's delay runs out, so requests that come later wait for the
    batch after it.
    Measured (1 instance, 24 ms executions, 2 ms delay; arrivals at 0, 5, 10 ms): the request at 5
    ran alone after the first, the one at 10 alone after that; with delay 0 both ran together.

    Once the prefetched payload starts, the batcher forms again at the next arrival (or when an
    instance goes idle), not at once: requests waiting meanwhile join that arrival's batch. Batch
    rules within a formation are run_batcher_items'. Returns per-batch (starts, ends, requests, items).
    """
    n = len(t)
    big = config.max_batch_size
    preferred = set(p for p in config.preferred_batch_sizes if 1 <= p <= big)
    top = max(preferred) if preferred else big
    delay = config.max_queue_delay_us / 1000.0
    slots = config.instances
    free = [t[0]] * slots
    starts: list[float] = []
    ends: list[float] = []
    counts: list[int] = []
    items: list[int] = []
    head = 0
    closed = float("-inf")     # when the previous batch was closed
    while head < n:
        first = t[head]
        # batches closed but not started when the previous one closed: a slot is free below N
        # one batch may wait for an instance (measured with 1 and 2 instances): while it waits the
        # batcher does not form another
        if not starts or starts[-1] <= closed:
            e = closed if closed > first else first      # the batcher carries on
        else:
            freed = starts[-1]                           # the waiting batch starts: asleep until woken
            if first > freed:
                e = first
            else:
                j = bisect_right(t, freed, head)
                nxt = t[j] if j < n else float("inf")
                soonest = min(free)
                idle = soonest if soonest > freed else freed   # an instance with nothing queued
                e = min(nxt, idle)
        s, deadline = e, first + delay
        take_j, take, s = _form_batch(t, w, head, s, deadline, preferred, top, big)
        closed = s
        soonest = min(free)
        k = free.index(soonest)
        start = soonest if soonest > s else s
        running = sum(1 for f in free if f > start) if slots > 1 else 0
        end = start + cost[take] * (1.0 + slowdown * running)
        free[k] = end
        starts.append(start)
        ends.append(end)
        counts.append(take_j - head)
        items.append(take)
        head = take_j
    return starts, ends, counts, items


# --- closed forms the simulation must agree with ------------------------------------------------

def saturation_qps(profile: LatencyProfile, config: BatcherConfig, slowdown: float = 0.75,
                   items: tuple[int, int] | None = None) -> float:
    """Requests/s when every instance always runs full batches: an upper bound for any load (with
    several items per request, a full batch holds max_batch_size / mean items requests at most)."""
    n = config.instances
    per_batch_ms = profile.compute_ms(config.max_batch_size) * (1.0 + slowdown * (n - 1))
    return n * config.max_batch_size / mean_items(items) / per_batch_ms * 1000.0


def md1_mean_latency_ms(service_ms: float, rate_qps: float) -> float:
    """M/D/1 (Poisson arrivals, one server, fixed service time): service + Pollaczek-Khinchine
    mean wait rho*S / (2(1-rho)). Matches max_batch_size 1, no delay, one instance."""
    rho = rate_qps * service_ms / 1000.0
    if rho >= 1:
        return float("inf")
    return service_ms + rho * service_ms / (2.0 * (1.0 - rho))
