"""benchmarks/autoscale_bench.py's run (issue 26 item 6): a day-shaped ramp on real Triton, each
phase's numbers written to $RANKOPS_AUTOSCALE_BENCH. Not a test: `pytest e2e` does not collect
this file (its name is not test_*.py); the benchmark names it explicitly, so the e2e fixtures
serve it: conftest's `real` (two real nodes, the chart's operator pod at --interval 2, the S3
server), as for e2e/test_autoscale_real.py, whose module settings and helpers these are.
"""
from __future__ import annotations

from e2e.test_autoscale_real import (  # noqa: F401 (the run's helpers; the real cluster's settings)
    DEVICE_MS, DRIVERS, REAL_CHART_VALUES, REAL_NODES, SPEC, Replicas, p99, run_phases, serve, server_p99_ms)

BENCH_ENV = "RANKOPS_AUTOSCALE_BENCH"   # a path: the benchmark's report is written there
# a path: JSON {"spec": ..., "day": [[rate, s, replicas], ...], "device_ms": [a, b]} for
# test_bench_planned_capacity (benchmarks/autoscale_bench.py --optimistic-profile)
PLANNED_ENV = "RANKOPS_AUTOSCALE_BENCH_PLANNED"
# (req/s, at least s, replicas): a night, the morning, the peak, the evening, the night again. A
# day spends longer in its trough than at its peak: the nights are the longest phases (a perfect
# follower pays 50% of static peak provisioning on this shape; the ramps are what it costs).
DAY = [(5, 80, 1), (15, 20, 2), (25, 40, 3), (15, 20, 2), (5, 80, 1)]


def test_bench_day_shaped_load(real, real_k8s, real_namespace_in, tmp_path):
    """benchmarks/autoscale_bench.py: a day-shaped ramp; each phase's numbers go to $RANKOPS_AUTOSCALE_BENCH."""
    import json
    import os

    out = os.environ.get(BENCH_ENV)
    assert out, f"run by benchmarks/autoscale_bench.py, which sets ${BENCH_ENV}"
    k8s, ns = real_k8s, real_namespace_in
    serve(k8s, ns, real.store, tmp_path, device_ms=DEVICE_MS, tritonImage=real.refs["rankops-triton-test"])
    replicas = Replicas(k8s, ns)
    replicas.start()
    try:
        phases = run_phases(k8s, ns, DAY, replicas, real.netns, settle_timeout=90, drivers=DRIVERS)
    finally:
        replicas.stop.set()
        replicas.join(5)
    rows = []
    for p in phases:
        decided = next((t for t, d, _ in replicas.samples if t >= p.started and d == p.wanted), None)
        rows.append({"rate": p.rate, "wanted": p.wanted, "seconds": round(p.ended - p.started, 1),
                     "decided_s": None if decided is None else round(decided - p.started, 1),
                     "ready_s": None if p.reached is None else round(p.reached - p.started, 1),
                     "sent": p.sent, "failed": p.failed, "p99_ms": p99(p.ms),
                     # the load step's window (until the replicas are Ready and warm) and after it
                     "p99_step_ms": p99([ms for at, ms in p.answers if p.reached is None or at < p.reached]),
                     "p99_after_ms": p99([ms for at, ms in p.answers if p.reached is not None and at >= p.reached])})
    start, end = phases[0].started, phases[-1].ended
    peak = max(w for _, _, w in DAY)
    report = {"phases": rows, "replica_seconds": round(replicas.replica_seconds(start, end), 1),
              "static_peak_replica_seconds": round(peak * (end - start), 1),
              # what replicas that followed each phase at once, as long as it lasted, would have paid
              "ideal_replica_seconds": round(sum(p.wanted * (p.ended - p.started) for p in phases), 1),
              "budget_p99_ms": SPEC["slo"]["p99LatencyMs"]}
    with open(out, "w") as f:
        json.dump(report, f)
    assert all(p.reached is not None for p in phases), report


def test_bench_planned_capacity(real, real_k8s, real_namespace_in, tmp_path):
    """benchmarks/autoscale_bench.py --optimistic-profile: the capacity from the plan (no
    capacityPerReplicaQps), the stand-in's device time as given; per phase also the replicas'
    status.autoscaling.capacityCorrection at its end."""
    import json
    import os

    from e2e import models
    from e2e.test_autoscale_real import NAME

    out, given = os.environ.get(BENCH_ENV), os.environ.get(PLANNED_ENV)
    assert out and given, f"run by benchmarks/autoscale_bench.py, which sets ${BENCH_ENV} and ${PLANNED_ENV}"
    run = json.loads(open(given).read())
    k8s, ns = real_k8s, real_namespace_in
    serve(k8s, ns, real.store, tmp_path, spec_doc=run["spec"], device_ms=tuple(run["device_ms"]),
          tritonImage=real.refs["rankops-triton-test"])
    replicas = Replicas(k8s, ns)
    replicas.start()
    phases, corrections = [], []
    try:
        for rate, seconds, wanted in run["day"]:
            phases += run_phases(k8s, ns, [(rate, seconds, wanted)], replicas, real.netns, settle_timeout=30,
                                 drivers=run.get("drivers", 1))
            scaling = (models.get(k8s, ns, NAME).get("status") or {}).get("autoscaling") or {}
            corrections.append({"server_p99_ms": server_p99_ms(k8s, ns, NAME, real.netns),
                                "capacity": scaling.get("capacityPerReplicaQps"),
                                "source": scaling.get("capacitySource"),
                                "correction": scaling.get("capacityCorrection")})
    finally:
        replicas.stop.set()
        replicas.join(5)
    rows = []
    for p, seen in zip(phases, corrections):
        decided = next((t for t, d, _ in replicas.samples if t >= p.started and d == p.wanted), None)
        served = [d for t, d, _ in replicas.samples if p.started <= t <= p.ended]
        rows.append({"rate": p.rate, "wanted": p.wanted, "seconds": round(p.ended - p.started, 1),
                     "replicas_seen": sorted(set(served)), "replicas_end": served[-1] if served else None,
                     "decided_s": None if decided is None else round(decided - p.started, 1),
                     "ready_s": None if p.reached is None else round(p.reached - p.started, 1),
                     "sent": p.sent, "failed": p.failed, "p99_ms": p99(p.ms),
                     "p99_step_ms": p99([ms for at, ms in p.answers if p.reached is None or at < p.reached]),
                     "p99_after_ms": p99([ms for at, ms in p.answers if p.reached is not None and at >= p.reached]),
                     # the last half of the phase: where the replicas settled
                     "p99_late_ms": p99([ms for at, ms in p.answers if at >= (p.started + p.ended) / 2]),
                     **seen})
    start, end = phases[0].started, phases[-1].ended
    report = {"phases": rows, "replica_seconds": round(replicas.replica_seconds(start, end), 1),
              "budget_p99_ms": run["spec"]["slo"]["p99LatencyMs"]}
    with open(out, "w") as f:
        json.dump(report, f)
