"""The shared server's shell for its pods (controller/shared_pods.py): what it remembers per pod
for the plan (a load refused for missing files is a bounded wait, any other refusal a failure with
a backoff), and reads bounded against a pod that accepts and never answers."""
from __future__ import annotations

import time

from hostile import Endpoint

from rankops.controller.shared_pods import PodRecord, ServerPod, ServerPods
from rankops.controller.workqueue import RETRY_FIRST_S

NOT_STAGED = "load of ghost refused: failed to poll from model repository"
REFUSED = "load of bad refused: unexpected inference output 'score'"


def test_a_load_refused_for_missing_files_waits_then_fails_and_backs_off():
    record = PodRecord()
    record.after_load("ghost", "d1", now=0.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    record.after_load("ghost", "d1", now=20.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    assert record.staging_over(20.0, 30) == frozenset() and record.retry(["ghost"], 20.0) == {"ghost"}
    assert record.load_errors == {"ghost": NOT_STAGED}
    # the wait counts from the first refusal, not the last: over at 30 s, then a failure like any
    assert record.staging_over(30.0, 30) == {"ghost"}
    record.after_load("ghost", "d1", now=31.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    assert record.retry(["ghost"], 31.0 + RETRY_FIRST_S - 0.1) == frozenset()
    assert record.retry(["ghost"], 31.0 + RETRY_FIRST_S) == {"ghost"}


def test_failures_in_a_row_double_the_wait_and_a_load_that_takes_starts_over():
    record = PodRecord(retry_first_s=1.0, retry_cap_s=4.0)
    waits = []
    for now in (0.0, 10.0, 20.0, 30.0):
        record.after_load("bad", "d1", now=now, error=REFUSED)
        waits.append(record.retry_at["bad"] - now)
    assert waits == [1.0, 2.0, 4.0, 4.0]
    assert record.retry(["bad", "good"], 31.0) == {"good"}, "per member"
    record.after_load("bad", "d2", now=40.0)
    assert record.load_errors == {} and record.loaded == {"bad": "d2"} and record.retry(["bad"], 40.0) == {"bad"}
    record.after_load("bad", "d2", now=50.0, error=REFUSED)
    assert record.retry_at["bad"] - 50.0 == 1.0, "a success starts the backoff over"
    # a refusal that is not for missing files ends any wait for them
    record.after_load("bad", "d2", now=60.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    record.after_load("bad", "d2", now=61.0, error=REFUSED)
    assert record.waiting_since == {}


def test_an_unloaded_member_is_forgotten():
    record = PodRecord()
    record.after_load("m", "d1", now=0.0)
    record.after_load("m", "d1", now=1.0, error=REFUSED)
    record.forget("m")
    assert (record.load_errors, record.retry_at, record.loaded) == ({}, {}, {})


def test_a_pod_that_never_answers_costs_its_read_deadline_and_is_said_unread():
    def stall(conn, stop):
        stop.wait(30)
    stalled = Endpoint(stall)
    shell = ServerPods(None, staging_wait_s=30, index_deadline_s=0.5)
    try:
        pods = [ServerPod("p0", "u0", "127.0.0.1", True, port=stalled.port),
                ServerPod("p1", "u1", "127.0.0.1", False, port=stalled.port),        # not ready: not asked
                ServerPod("p2", "u2", "", True, port=stalled.port)]                    # no address yet
        began = time.monotonic()
        views = shell.read(pods, ["m"])
        took = time.monotonic() - began
    finally:
        stalled.stop.set()
        shell.close()
    assert took < 3.0, took
    assert [(v.name, v.index) for v in views] == [("p0", None), ("p1", None), ("p2", None)]
    assert views[0].index_error and not views[1].index_error and not views[2].index_error
    assert stalled.connections == 1
