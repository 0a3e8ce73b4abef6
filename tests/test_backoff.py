"""A failing object backs off (issue 39): retried after 2 s, doubling up to 300 s, reset by a
success, and a ReconcileFailed Event says the error and when the next try is."""
from __future__ import annotations

import threading
import time

from rankops.controller import runtime
from rankops.controller.context import OperatorContext
from rankops.controller.workqueue import RETRY_CAP_S, RETRY_FIRST_S, Backoff, WorkQueue


def test_the_delay_doubles_per_object_up_to_the_cap_and_a_success_resets_it():
    backoff = Backoff()
    assert (RETRY_FIRST_S, RETRY_CAP_S) == (2.0, 300.0)
    assert [backoff.failed("a") for _ in range(10)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert backoff.failed("b") == 2, "per object"
    backoff.succeeded("a")
    assert backoff.failures("a") == 0 and backoff.failed("a") == 2
    many = Backoff()
    assert [many.failed("z") for _ in range(200)][-1] == 300, "no overflow after many failures"


def test_the_queue_retries_after_the_backoff_and_says_each_failure():
    runs, said, done = [], [], threading.Event()

    def run(key):
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise RuntimeError("API said 500")
        done.set()

    queue = WorkQueue(run, workers=1, retry_s=0.05, failed=lambda key, exc, retry_in: said.append((key, str(exc),
                                                                                                  retry_in)))
    queue.kick("m")
    assert done.wait(5)
    assert said == [("m", "API said 500", 0.05), ("m", "API said 500", 0.1)]
    assert runs[2] - runs[1] >= 0.09, "the second retry waits twice the first"
    assert queue.backoff.failures("m") == 0, "the success reset it"


def test_a_failed_reconcile_posts_a_reconcile_failed_warning(monkeypatch):
    posted = []
    controller = runtime.ModelController(OperatorContext())
    monkeypatch.setattr(runtime.kopf, "event", lambda body, **kw: posted.append((body["metadata"]["name"], kw)))
    model = {"metadata": {"name": "m", "namespace": "reco", "uid": "u1", "resourceVersion": "1"}}
    controller.watched.observe("RankingModel", model)
    monkeypatch.setattr(controller, "namespace_going", lambda name: False)
    controller.failed(("reco", "m", "u1"), RuntimeError("Kubernetes API said 500"), 8.0)
    assert len(posted) == 1
    name, event = posted[0]
    assert name == "m" and event["type"] == "Warning" and event["reason"] == "ReconcileFailed"
    assert "Kubernetes API said 500" in event["message"] and "again in 8 s" in event["message"]
    controller.failed(("reco", "m", "other-uid"), RuntimeError("x"), 2.0)
    assert len(posted) == 1, "an object not watched (or another of the same name) gets no Event"
