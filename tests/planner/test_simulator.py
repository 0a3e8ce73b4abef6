"""The simulator against queueing theory and hand-traced batcher decisions."""
import numpy as np
import pytest

from rankops.planner.profile import LatencyProfile
from rankops.planner.simulator import (
    BatcherConfig, md1_mean_latency_ms, run_batcher, run_batcher_prefetch, saturation_qps, simulate,
)

PROFILE = LatencyProfile.from_mapping({1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6})


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.85])
def test_batch_one_matches_md1_mean(rho):
    service = 2.0
    rate = rho * 1000 / service
    sim = simulate(LatencyProfile.from_mapping({1: service}), BatcherConfig(1), rate_qps=rate,
                   requests=80_000, seed=3)
    assert sim.mean_ms == pytest.approx(md1_mean_latency_ms(service, rate), rel=0.05)
    assert sim.gpu_busy_fraction == pytest.approx(rho, rel=0.03)
    assert sim.avg_batch_size == 1.0


@pytest.mark.parametrize("config", [BatcherConfig(8), BatcherConfig(16, (), 500), BatcherConfig(16, (), 0, 2)])
def test_overload_throughput_reaches_the_saturation_bound(config):
    bound = saturation_qps(PROFILE, config)
    sim = simulate(PROFILE, config, rate_qps=bound * 2, requests=20_000)
    assert sim.throughput_qps == pytest.approx(bound, rel=0.03)
    assert sim.avg_batch_size == pytest.approx(config.max_batch_size, rel=0.03)
    assert sim.gpu_busy_fraction > 0.99


def test_light_load_waits_the_full_queue_delay():
    # alone in the queue, a request waits max_queue_delay for company that never comes
    sim = simulate(PROFILE, BatcherConfig(16, (), 1500), rate_qps=5, requests=2000)
    assert sim.p50_ms == pytest.approx(1.5 + 2.0, abs=0.01)
    assert sim.avg_batch_size == pytest.approx(1.0, abs=0.02)  # a rare second arrival joins


def test_no_delay_at_light_load_is_pure_compute_plus_overhead():
    sim = simulate(PROFILE, BatcherConfig(16), rate_qps=5, requests=2000, overhead_ms=0.7)
    assert sim.p50_ms == pytest.approx(2.7, abs=0.01)


def _trace(config, arrivals, slowdown=0.75, profile=PROFILE):
    return run_batcher(arrivals, profile.table(config.max_batch_size), config, slowdown)


def test_preferred_size_is_sent_as_soon_as_it_forms():
    # arrivals every 0.1 ms; preferred 2 goes at the 2nd arrival, not after the 1 ms delay
    starts, ends, sizes = _trace(BatcherConfig(8, (2,), 1000), [0.0, 0.1, 0.2, 0.3])
    assert sizes[0] == 2 and starts[0] == pytest.approx(0.1)


def test_without_preferred_the_batcher_waits_for_max_or_delay():
    starts, _, sizes = _trace(BatcherConfig(8, (), 1000), [0.0, 0.1, 0.2, 0.3, 5.0])
    assert sizes[0] == 4 and starts[0] == pytest.approx(1.0)
    starts, _, sizes = _trace(BatcherConfig(3, (), 1000), [0.0, 0.1, 0.2, 0.3])
    assert sizes == [3, 1] and starts[0] == pytest.approx(0.2)


def test_busy_instance_lets_the_queue_grow_into_a_full_batch():
    # the first request occupies the instance for 2 ms; 8 arrive meanwhile and go as one batch
    arrivals = [0.0] + [0.1 * i for i in range(1, 9)]
    starts, ends, sizes = _trace(BatcherConfig(8), arrivals)
    assert sizes == [1, 8]
    assert starts[1] == pytest.approx(2.0) and ends[1] == pytest.approx(5.0)


def test_concurrent_instances_slow_each_other():
    arrivals = [0.0, 0.0]
    _, ends, _ = _trace(BatcherConfig(1, (), 0, 2), arrivals, slowdown=0.5)
    assert ends == [pytest.approx(2.0), pytest.approx(3.0)]   # second starts while first runs


def test_time_slicing_instances_add_no_throughput():
    one = simulate(PROFILE, BatcherConfig(8), rate_qps=6000, requests=20_000)
    sliced = simulate(PROFILE, BatcherConfig(8, (), 0, 2), rate_qps=6000, requests=20_000, slowdown=1.0)
    overlapped = simulate(PROFILE, BatcherConfig(8, (), 0, 2), rate_qps=6000, requests=20_000, slowdown=0.0)
    assert sliced.throughput_qps <= one.throughput_qps * 1.03
    assert overlapped.throughput_qps > one.throughput_qps * 1.8


def test_recorded_arrivals_burst():
    sim = simulate(PROFILE, BatcherConfig(8), arrivals_ms=np.zeros(8), warmup_fraction=0)
    assert sim.avg_batch_size == 8 and sim.p99_ms == pytest.approx(3.0)


def test_deterministic_for_a_seed():
    a = simulate(PROFILE, BatcherConfig(16, (), 500), rate_qps=2500, seed=7)
    b = simulate(PROFILE, BatcherConfig(16, (), 500), rate_qps=2500, seed=7)
    c = simulate(PROFILE, BatcherConfig(16, (), 500), rate_qps=2500, seed=8)
    assert a == b and a != c


def test_latency_grows_with_load():
    p99 = [simulate(PROFILE, BatcherConfig(16), rate_qps=r).p99_ms for r in (500, 1500, 2500, 3300)]
    assert p99 == sorted(p99)


def test_needs_a_rate_or_arrivals():
    with pytest.raises(ValueError, match="rate_qps"):
        simulate(PROFILE, BatcherConfig(8))


# Triton 2.51, measured on the timed stand-in (20 + 2·items ms, 1 instance, max batch 8): which
# requests ran together, for arrivals (ms) and a queue delay. tests/triton shows the same live.
TIMED = LatencyProfile.from_mapping({1: 23.7, 2: 25.7, 4: 29.8, 8: 38.2})
MEASURED_BATCHES = [
    (2000, [0, 5, 10], [1, 1, 1], 1),
    (2000, [0, 5, 6], [1, 2], 1),
    (2000, [0, 5, 10, 15, 40], [1, 1, 3], 1),
    (2000, [0, 5, 10, 15, 40, 45, 60], [1, 1, 3, 2], 1),
    (8000, [0, 5, 10], [2, 1], 1),
    (8000, [0, 5, 6], [3], 1),
    (8000, [0, 5, 10, 15, 40], [2, 2, 1], 1),
    (8000, [0, 5, 10, 15, 40, 45, 60], [2, 2, 2, 1], 1),
    (0, [0, 5, 10, 15, 30], [1, 3, 1], 1),
    # two instances: still one batch waits for an instance, not one per instance
    (2000, [0, 5, 10, 15, 20, 40], [1, 1, 1, 2, 1], 2),
    (2000, [0, 5, 10, 15, 20, 22, 24, 40], [1, 1, 1, 4, 1], 2),
]


@pytest.mark.parametrize("delay,arrivals,batches,instances", MEASURED_BATCHES)
def test_batches_form_as_tritons_did(delay, arrivals, batches, instances):
    config = BatcherConfig(8, (), delay, instances)
    sim = simulate(TIMED, config, arrivals_ms=np.array(arrivals, float), warmup_fraction=0, slowdown=0.0)
    cost = TIMED.table(8)
    if delay:
        _, _, counts, _ = run_batcher_prefetch([float(a) for a in arrivals], (1,) * len(arrivals), cost, config, 0.0)
    else:
        _, _, counts = run_batcher([float(a) for a in arrivals], cost, config, 0.0)
    assert counts == batches
    assert sim.avg_batch_size == pytest.approx(len(arrivals) / len(batches))
