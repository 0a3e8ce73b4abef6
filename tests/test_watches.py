"""The operator's own watch streams (controller/watches.py), on a real API server: what the API
server selects by label is listed in pages, then watched in order; a pause stops the stream and a
resume lists again; a stale resourceVersion lists again."""
from __future__ import annotations

import os
import threading
import time

import pytest

from rankops.controller import transport, watches
from rankops.controller.kube import Kube

LABEL = "rankops.io/model"


@pytest.fixture(scope="module")
def kube(plane):
    os.environ["KUBECONFIG"] = str(plane.kubeconfig)
    try:
        t = transport.Transport(transport.login, maxsize=4)
    finally:
        os.environ.pop("KUBECONFIG")
    yield Kube(t)
    t.close()


class Seen:
    def __init__(self):
        self.events: list[tuple[str | None, str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, event: dict) -> None:
        obj = event["object"]
        assert obj["kind"] == "ConfigMap" and obj["apiVersion"] == "v1", obj
        with self.lock:
            self.events.append((event["type"], obj["metadata"]["name"], (obj.get("data") or {}).get("v", "")))

    def until(self, predicate, what: str, timeout: float = 20) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if predicate(self.events):
                    return list(self.events)
            time.sleep(0.05)
        raise AssertionError(f"{what}: {self.events}")


def configmap(name: str, value: str, labelled: bool = True) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": value},
            "metadata": {"name": name, "namespace": "default", "labels": {LABEL: "m"} if labelled else {}}}


def test_a_stream_lists_in_pages_then_watches_in_order_only_what_the_label_selects(kube, monkeypatch):
    monkeypatch.setattr(watches, "LIST_PAGE", 2)
    for i in range(5):
        kube.apply(configmap(f"listed-{i}", "0"))
    kube.apply(configmap("other", "0", labelled=False))
    seen, paused = Seen(), threading.Event()
    watch = watches.Watch(kube, watches.Stream("ConfigMap", LABEL, seen), "default", paused=paused.is_set)
    watch.start()
    try:
        assert watch.listed.wait(20)
        listing = seen.until(lambda e: len(e) >= 5, "the listing")
        assert sorted(listing) == [(None, f"listed-{i}", "0") for i in range(5)], "three pages of two, once each"
        kube.apply(configmap("listed-1", "1"))
        kube.apply(configmap("other", "1", labelled=False))
        kube.apply(configmap("new", "0"))
        kube.delete("ConfigMap", "default", "listed-2")
        events = seen.until(lambda e: len(e) >= 8, "three events")[5:]
        assert events == [("MODIFIED", "listed-1", "1"), ("ADDED", "new", "0"), ("DELETED", "listed-2", "0")]

        # Paused (a peer acts): nothing is handed on; resumed: everything is listed again, as kopf does.
        paused.set()
        time.sleep(watches.PAUSE_POLL_S)
        kube.apply(configmap("listed-3", "2"))    # ends the watch's read: the pause is noticed
        time.sleep(2 * watches.PAUSE_POLL_S)
        count = len(seen.events)
        paused.clear()
        relisted = seen.until(lambda e: len(e) >= count + 5, "listed again on resuming")[count:]
        assert sorted(relisted) == sorted([(None, n, v) for n, v in (("listed-0", "0"), ("listed-1", "1"), ("listed-3", "2"),
                                                                     ("listed-4", "0"), ("new", "0"))])
        assert all(kind != "MODIFIED" or name != "listed-3" for kind, name, _ in seen.events[:count]), \
            "the change made while paused came by the listing, not as an event"
    finally:
        watch.stop()


def test_a_stale_resource_version_lists_again(kube, monkeypatch):
    """A watch from a version the API server no longer has is not an error: list again. A fresh
    API server still has every version (nothing is compacted for minutes), so its answer is given
    here as it comes on the wire: an ERROR event carrying a 410 Status."""
    gone = (b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure",'
            b'"message":"too old resource version: 1 (2345)","reason":"Expired","code":410}}\n')

    class Answer:
        def stream(self, _size):
            yield gone

        def release_conn(self):
            pass

    monkeypatch.setattr(watches, "open_stream", lambda *a, **k: Answer())
    watch = watches.Watch(kube, watches.Stream("ConfigMap", LABEL, Seen()), "default")
    watch.version = "1"
    with pytest.raises(watches.Expired):
        watch._watch()


def test_a_handler_that_fails_does_not_end_the_stream(kube, caplog):
    kube.apply(configmap("fails", "0"))
    seen = Seen()

    def deliver(event: dict) -> None:
        if event["object"]["metadata"]["name"] == "fails":
            raise RuntimeError("a bug in one handler")
        seen(event)

    watch = watches.Watch(kube, watches.Stream("ConfigMap", LABEL, deliver), "default")
    watch.start()
    try:
        assert watch.listed.wait(20)
        kube.apply(configmap("after", "0"))
        seen.until(lambda e: ("ADDED", "after", "0") in e, "the next event")
        assert "a bug in one handler" in caplog.text
    finally:
        watch.stop()


def test_namespace_patterns_are_watched_cluster_wide_and_matched_as_kopf_matches_them(kube):
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-pattern"}})
    for namespace in ("default", "kube-pattern"):
        kube.apply({**configmap("patterned", namespace), "metadata": {
            "name": "patterned", "namespace": namespace, "labels": {LABEL: "m"}}})
    seen = Seen()
    [watch] = watches.start(kube, [watches.Stream("ConfigMap", LABEL, seen)], ["!kube-*"])
    try:
        assert watch.namespace is None and watch.listed.wait(20)
        listed = seen.until(lambda e: any(name == "patterned" for _, name, _ in e), "the listing")
        assert ("ADDED" not in {kind for kind, *_ in listed})
        assert [v for _, name, v in listed if name == "patterned"] == ["default"], "kube-pattern left out"
    finally:
        watch.stop()
