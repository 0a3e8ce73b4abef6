"""A reconcile reads its RankingModel from the watch (handlers.MODELS), not with a GET, unless
the watch has not yet brought back the status this process last wrote (issue 13)."""
from __future__ import annotations

import pytest

from rankops.controller import cache, handlers


class CountingKube:
    def __init__(self, answer: dict):
        self.answer, self.gets = answer, 0

    def get(self, kind, namespace, name):
        self.gets += 1
        return self.answer


def _model(rv: int, uid: str = "uid-m") -> dict:
    return {"metadata": {"name": "m", "namespace": "ns", "uid": uid, "resourceVersion": str(rv)},
            "spec": {}, "status": {"phase": f"seen-at-{rv}"}}


@pytest.fixture
def reads(monkeypatch):
    monkeypatch.setattr(handlers, "MODELS", cache.Children())
    monkeypatch.setattr(handlers, "_status_written", {})
    kube = CountingKube(_model(99))
    monkeypatch.setattr(handlers.OPERATOR, "kube", kube)
    return kube


def test_a_watched_model_is_read_without_a_request(reads):
    handlers.MODELS.observe("RankingModel", _model(10))
    assert handlers._current("RankingModel", _model(10)["metadata"])["status"]["phase"] == "seen-at-10"
    assert reads.gets == 0


def test_a_watch_behind_this_processs_own_status_write_is_not_trusted(reads):
    handlers.MODELS.observe("RankingModel", _model(10))
    handlers._status_written["uid-m"] = "12"
    assert handlers._current("RankingModel", _model(10)["metadata"])["status"]["phase"] == "seen-at-99"
    assert reads.gets == 1
    handlers.MODELS.observe("RankingModel", _model(12))   # the write's answer, or its watch event
    assert handlers._current("RankingModel", _model(12)["metadata"])["status"]["phase"] == "seen-at-12"
    assert reads.gets == 1


def test_an_unseen_or_recreated_model_is_read_from_the_api(reads):
    assert handlers._current("RankingModel", _model(1)["metadata"])["status"]["phase"] == "seen-at-99"
    handlers.MODELS.observe("RankingModel", _model(20, uid="uid-old"))   # the same name, another object
    assert handlers._current("RankingModel", _model(21)["metadata"])["status"]["phase"] == "seen-at-99"
    handlers.MODELS.observe("RankingModel", _model(30), deleted=True)
    handlers._current("RankingModel", _model(31)["metadata"])
    assert reads.gets == 3


def test_a_namespace_is_asked_whether_it_goes_at_most_every_few_seconds(monkeypatch):
    asked = []
    now = {"t": 100.0}

    class Namespaces:
        def get(self, kind, namespace, name):
            asked.append(name)
            return {"metadata": {"name": name, **({"deletionTimestamp": "x"} if name == "going" else {})}}

    monkeypatch.setattr(handlers.OPERATOR, "kube", Namespaces())
    monkeypatch.setattr(handlers, "_namespaces_seen", {})
    monkeypatch.setattr(handlers.time, "monotonic", lambda: now["t"])
    assert [handlers._namespace_going("reco") for _ in range(3)] == [False] * 3
    assert handlers._namespace_going("going") is True
    assert asked == ["reco", "going"], "one GET per namespace for a burst of Events"
    now["t"] += handlers.NAMESPACE_ALIVE_S
    assert handlers._namespace_going("reco") is False and handlers._namespace_going("going") is True
    assert asked == ["reco", "going", "reco"], "a namespace alive is asked again soon: it may begin to go"
