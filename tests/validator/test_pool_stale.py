"""Issue 37, item 4: a node whose validator stopped reporting is not counted ready by its pool.

The validator writes its report every interval (spec.validator.intervalSeconds) with the time it
was made (generatedAt); a report older than three intervals is stale, whatever it said."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from rankops.api.gpunodepool import GpuNodePool, GpuNodePoolStatus
from rankops.nodelabels import ANNOTATION_REPORT, LABEL_POOL, LABEL_READY
from rankops.pool_status import STALE_INTERVALS, aggregate_pool_status, pool_status
from rankops.validator.report import requirements_digest

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
INTERVAL = 120


def _pool() -> GpuNodePool:
    return GpuNodePool.model_validate({"metadata": {"name": "t4-pool", "generation": 2},
                                       "spec": {"nodeSelector": {"pool": "t4"},
                                                "validator": {"intervalSeconds": INTERVAL}}})


def _node(name: str, age_s: float | None, ready: bool = True) -> dict:
    report = {"version": 1, "ready": ready, "requirementsDigest": requirements_digest(_pool().spec.requirements),
              "blocking": [] if ready else ["nouveau"], "checks": []}
    if age_s is not None:
        report["generatedAt"] = (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": name, "labels": {"pool": "t4", LABEL_POOL: "t4-pool",
                                                  LABEL_READY: "true" if ready else "false"},
                         "annotations": {ANNOTATION_REPORT: json.dumps(report)}}}


def test_a_report_older_than_three_intervals_is_stale_not_ready():
    limit = STALE_INTERVALS * INTERVAL
    nodes = [_node("fresh", 10), _node("late-but-in-time", limit - 1), _node("hung", limit + 1),
             _node("hung-failing", 10 * limit, ready=False), _node("no-time", None)]
    summary = aggregate_pool_status(_pool(), nodes, now=NOW)
    assert {k: summary[k] for k in ("nodes", "ready", "failing", "pending")} == \
        {"nodes": 5, "ready": 2, "failing": 3, "pending": 0}
    assert {"check": "stale", "count": 3, "nodes": ["hung", "hung-failing", "no-time"]} in summary["failingByCheck"]


def test_the_pools_status_says_which_nodes_are_stale():
    status = pool_status(_pool(), [_node("hung", STALE_INTERVALS * INTERVAL + 60)], None, GpuNodePoolStatus(), 2,
                         NOW.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert (status.ready, status.failing) == (0, 1)
    conditions = {c.type: c for c in status.conditions}
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", "NoReadyNodes")
    assert conditions["Degraded"].status == "True" and "stale (1)" in conditions["Degraded"].message


def test_a_fresh_report_is_judged_by_what_it_says():
    status = pool_status(_pool(), [_node("a", 5), _node("b", 5, ready=False)], None, GpuNodePoolStatus(), 2,
                         NOW.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert (status.ready, status.failing) == (1, 1)
    assert [f.check for f in status.failing_by_check] == ["nouveau"]


def test_the_pool_comes_back_when_its_first_fresh_report_turns_stale_not_at_resync():
    from rankops.controller.clock import Clock
    from rankops.pool_status import seconds_until_stale

    limit = STALE_INTERVALS * INTERVAL
    nodes = [_node("fresh", 10), _node("older", 100), _node("hung", limit + 1), _node("no-time", None)]
    # The older fresh report goes stale first; the stale ones need no wake-up.
    assert seconds_until_stale(_pool(), nodes, NOW) == limit - 100
    assert seconds_until_stale(_pool(), [_node("hung", limit + 1)], NOW) is None
    now = {"t": 0.0}
    clock = Clock(lambda key: None, interval_s=10, resync_s=600, clock=lambda: now["t"], start=False)
    clock.reconciled("pool", False, seconds_until_stale(_pool(), nodes, NOW))
    now["t"] = limit - 100
    assert clock.take_due() == ["pool"], "reconciled when the report turns stale, not at --resync"
    clock.reconciled("pool", False, 10_000.0)   # a deadline later than --resync: resync comes first
    now["t"] += 599
    assert clock.take_due() == []
    now["t"] += 1
    assert clock.take_due() == ["pool"]
