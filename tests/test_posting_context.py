"""A reconcile that one of rankops' own threads asks for (the ServiceMonitor drift check) posts its
Events in a kopf handler's context: kopf keeps its settings and Event queue in context variables,
set for its handlers only, and kopf.event() from a bare thread raises LookupError."""
from __future__ import annotations

import asyncio

import contextvars
import threading

import kopf
from kopf._core.engines import posting

from rankops.controller import handlers, runtime
from rankops.controller.context import OperatorContext

BODY = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
        "metadata": {"name": "m", "namespace": "reco", "uid": "u1", "annotations": {}}}


class Loop:
    """kopf's event loop, as far as enqueue() uses it from another thread."""

    def call_soon_threadsafe(self, put, event):
        put(event)


def in_thread(fn):
    out = {}
    thread = threading.Thread(target=lambda: out.update(result=_try(fn)))
    thread.start()
    thread.join(5)
    return out["result"]


def _try(fn):
    try:
        fn()
        return "posted"
    except LookupError as exc:
        return f"LookupError {exc}"


def test_a_thread_of_rankops_own_posts_events_in_a_captured_kopf_context():
    controller = runtime.ModelController(OperatorContext())
    post = lambda: kopf.event(BODY, type="Normal", reason="Ready", message="1/1 Ready")   # noqa: E731
    assert in_thread(post).startswith("LookupError"), "kopf.event outside kopf's context"
    assert controller.posting_context() is None

    queue = []
    kopf_handler = contextvars.copy_context()   # what kopf sets up for a handler of an object
    kopf_handler.run(lambda: (posting.settings_var.set(kopf.OperatorSettings()),
                              posting.event_queue_var.set(type("Q", (), {"put_nowait": queue.append})()),
                              posting.event_queue_loop_var.set(Loop())))
    kopf_handler.run(asyncio.run, handlers.rankingmodel_event({"type": None, "object": BODY},   # async, in its context
                                                              memo=kopf.Memo(models=controller)))
    captured = controller.posting_context()
    assert captured is not None
    assert in_thread(lambda: captured.run(post)) == "posted"
    assert [(e.type, e.reason) for e in queue] == [("Normal", "Ready")]
