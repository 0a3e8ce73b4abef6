"""The watch cache of the operator's children (issue 13): reads without requests, never older
than what was seen, and a full listing corrects what a watch missed."""
from __future__ import annotations

import threading
import time

import pytest

from rankops.controller.cache import CachedKube, WatchCache
from rankops.controller.workqueue import WorkQueue
from tests.fakecluster import FakeCluster


def obj(name: str, rv: int, model: str = "m", **data) -> dict:
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "reco", "resourceVersion": str(rv),
                                              "labels": {"rankops.io/model": model}}, "data": data}


def requests(api: FakeCluster) -> list[tuple]:
    return [(c.method, c.kind, c.namespace, c.options.get("label_selector")) if c.method.startswith("list")
            else (c.method, c.kind, c.name) for c in api.calls]


def test_reads_list_a_namespace_once_then_come_from_the_watch():
    api = FakeCluster(obj("a", 5))
    kube = CachedKube(api, WatchCache())
    assert kube.get("ConfigMap", "reco", "a")["metadata"]["resourceVersion"] == \
        api.stored("ConfigMap", "reco", "a")["metadata"]["resourceVersion"]
    assert kube.get("ConfigMap", "reco", "b") is None
    assert [o["metadata"]["name"] for o in kube.list("ConfigMap", "reco", labels={"rankops.io/model": "m"})] == ["a"]
    assert requests(api) == [("list_versioned", "ConfigMap", "reco", "rankops.io/model")]
    kube.get("Secret", "reco", "s")   # not a child kind: straight to the API
    assert requests(api)[-1] == ("get", "Secret", "s")


def test_an_older_event_or_listing_never_replaces_what_is_newer():
    children = WatchCache()
    children.observe("ConfigMap", obj("a", 8, v="new"))
    children.observe("ConfigMap", obj("a", 6, v="old"))
    assert children.get("ConfigMap", "reco", "a")["data"] == {"v": "new"}
    children.observe("ConfigMap", obj("a", 9), deleted=True)
    children.listed("ConfigMap", "reco", [obj("a", 8, v="new")], 8)   # a listing from before the deletion
    assert children.get("ConfigMap", "reco", "a") is None


def test_a_listing_drops_what_it_no_longer_has_and_relists_after_the_resync():
    now = [0.0]
    children = WatchCache(relist_s=600, clock=lambda: now[0])
    api = FakeCluster(obj("missed", 3))
    children.observe("ConfigMap", api.get("ConfigMap", "reco", "missed"))
    api.delete("ConfigMap", "reco", "missed")
    api.calls.clear()
    kube = CachedKube(api, children)
    assert kube.get("ConfigMap", "reco", "missed") is None, "deleted while the watch was down"
    now[0] = 599
    kube.get("ConfigMap", "reco", "x")
    now[0] = 600
    kube.get("ConfigMap", "reco", "x")
    assert [r[0] for r in requests(api)] == ["list_versioned", "list_versioned"]


def test_own_writes_are_read_back_and_deletes_forgotten():
    api = FakeCluster(obj("a", 5))
    kube = CachedKube(api, WatchCache())
    written = kube.apply(obj("b", 0, v="1"))
    assert kube.get("ConfigMap", "reco", "b")["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    kube.delete("ConfigMap", "reco", "a")
    assert kube.get("ConfigMap", "reco", "a") is None


def test_kicks_coalesce_a_burst_and_run_once_more_for_events_during_a_run():
    started, release, runs = threading.Event(), threading.Event(), []

    def run(key):
        runs.append(key)
        started.set()
        release.wait(5)

    kicks = WorkQueue(run, workers=2)
    kicks.kick("m")
    assert started.wait(5)
    for _ in range(10):   # while it runs: one more run, not ten
        kicks.kick("m")
    release.set()
    deadline = time.monotonic() + 5
    while len(runs) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert runs == ["m", "m"]


def test_a_delayed_kick_gathers_a_burst_into_one_run():
    runs = []
    kicks = WorkQueue(runs.append, workers=2, delay_s=0.2)
    for _ in range(20):
        kicks.kick("m")
    kicks.kick("n")
    deadline = time.monotonic() + 5
    while len(runs) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert sorted(runs) == ["m", "n"]


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_an_urgent_kick_runs_before_the_queued_ones_and_a_queued_key_is_run_once(delay):
    # A model whose Deployment became Available is told before the models still to build, at N=1000
    # the difference between saying Ready with its pods and after the whole burst.
    started, release, runs = threading.Event(), threading.Event(), []

    def run(key):
        runs.append(key)
        if key == "busy":
            started.set()
            release.wait(5)

    kicks = WorkQueue(run, workers=1, delay_s=delay)
    kicks.kick("busy")
    assert started.wait(5)
    for key in ("new-1", "new-2", "new-3"):
        kicks.kick(key)
    kicks.kick("ready", urgent=True)
    kicks.kick("new-2", urgent=True)      # already queued: moved ahead, not run twice
    time.sleep(delay + 0.05)
    release.set()
    deadline = time.monotonic() + 5
    while len(runs) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert runs == ["busy", "ready", "new-2", "new-1", "new-3"]


def test_a_read_is_a_copy_without_managed_fields():
    children = WatchCache()
    kept = obj("a", 5, v="1")
    kept["metadata"]["managedFields"] = [{"manager": "rankops", "fieldsV1": {"f:data": {}}}]
    children.observe("ConfigMap", kept)
    read = children.get("ConfigMap", "reco", "a")
    assert "managedFields" not in read["metadata"] and read["data"] == {"v": "1"}
    read["data"]["v"] = "changed by a caller"
    kept["data"]["v"] = "changed by the watch's dict"
    assert children.get("ConfigMap", "reco", "a")["data"] == {"v": "1"}
    assert children.select("ConfigMap", "reco", {"rankops.io/model": "m"})[0]["data"] == {"v": "1"}
    assert children.select("ConfigMap", "reco", {"rankops.io/model": "other"}) == []


def test_select_finds_a_model_s_children_through_relabels_deletions_and_listings():
    children = WatchCache()
    children.observe("ConfigMap", obj("a", 1, model="m"))
    children.observe("ConfigMap", obj("b", 2, model="m"))
    children.observe("ConfigMap", obj("c", 3, model="other"))
    names_of = lambda model: [o["metadata"]["name"] for o in children.select("ConfigMap", "reco", {"rankops.io/model": model})]  # noqa: E731
    assert names_of("m") == ["a", "b"] and names_of("other") == ["c"]
    children.observe("ConfigMap", obj("b", 4, model="other"))   # relabelled: it moves
    assert names_of("m") == ["a"] and names_of("other") == ["b", "c"]
    children.observe("ConfigMap", obj("a", 5, model="m"), deleted=True)
    assert names_of("m") == [] and [o["metadata"]["name"] for o in children.select("ConfigMap", "reco", {})] == ["b", "c"]
    children.listed("ConfigMap", "reco", [obj("c", 3, model="other")], 6)   # b is gone by then
    assert names_of("other") == ["c"] and children.get("ConfigMap", "reco", "b") is None
    assert children.select("ConfigMap", "elsewhere", {}) == []


def test_a_waiting_kick_keeps_nothing_of_the_handler_that_asked_and_runs_in_the_kept_context():
    # kopf puts each handler's event (its body and patch) in context variables: a kick that kept
    # its caller's context held that body for as long as it waited (N=1000: ~3,000 of them).
    import contextvars
    import gc
    import weakref

    cause_var = contextvars.ContextVar("cause")
    settings_var = contextvars.ContextVar("settings")

    class Cause:   # stands in for kopf's cause: a body, a patch
        pass

    kept = contextvars.copy_context()
    kept.run(settings_var.set, "kopf's settings")
    seen = []
    kicks = WorkQueue(lambda key: seen.append((key, settings_var.get(None), cause_var.get(None))),
                  workers=1, start=False, context=lambda: kept)

    def handler(cause):
        cause_var.set(cause)
        kicks.kick("m")

    cause = Cause()
    gone = weakref.ref(cause)
    contextvars.copy_context().run(handler, cause)
    del cause
    gc.collect()
    assert gone() is None, "the queued kick keeps the handler's event alive"
    kicks.start()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [("m", "kopf's settings", None)]
