"""The controller tests' one fake API server (tests/fakecluster.py) behaves as the API server does
where the operator could tell: a test passing on it says something."""
from __future__ import annotations

import pytest

from rankops.controller.kube import ApiError, InvalidName
from tests.fakecluster import FakeCluster


def _cm(name="a", namespace="reco", **labels):
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": {"k": "v"}}


def test_versions_uids_and_generations():
    cluster = FakeCluster()
    first = cluster.apply({"kind": "Deployment", "metadata": {"name": "d", "namespace": "reco"},
                           "spec": {"replicas": 1}})
    other = cluster.apply(_cm())
    assert int(other["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert first["metadata"]["uid"] != other["metadata"]["uid"] and first["metadata"]["generation"] == 1
    same = cluster.apply({"kind": "Deployment", "metadata": {"name": "d", "namespace": "reco"},
                          "spec": {"replicas": 1}})
    assert same["metadata"]["generation"] == 1 and same["metadata"]["uid"] == first["metadata"]["uid"]
    labelled = cluster.merge_patch("Deployment", "reco", "d", {"metadata": {"labels": {"x": "1"}}})
    assert labelled["metadata"]["generation"] == 1, "metadata is no spec change"
    scaled = cluster.merge_patch("Deployment", "reco", "d", {"spec": {"replicas": 2}, "status": {"replicas": 9}})
    assert scaled["metadata"]["generation"] == 2 and "status" not in scaled, "the main resource ignores status"
    items, version = cluster.list_versioned("Deployment", "reco")
    assert version == int(scaled["metadata"]["resourceVersion"]) and items[0]["kind"] == "Deployment"
    assert "kind" not in cluster.list("Deployment", "reco")[0], "a list's items carry no kind"


def test_merge_patches_are_rfc_7386_and_status_goes_through_its_subresource():
    cluster = FakeCluster({**_cm(), "metadata": {**_cm()["metadata"], "annotations": {"a": "1", "b": "2"}}})
    patched = cluster.merge_patch("ConfigMap", "reco", "a", {"metadata": {"annotations": {"a": None, "c": "3"}},
                                                             "data": {"k": None, "l": ["x"]}})
    assert patched["metadata"]["annotations"] == {"b": "2", "c": "3"} and patched["data"] == {"l": ["x"]}
    assert cluster.merge_patch("ConfigMap", "reco", "a", {"data": {"l": ["y"]}})["data"]["l"] == ["y"], "replaced"
    cluster.put({"kind": "RankingModel", "metadata": {"name": "m", "namespace": "reco"}, "spec": {"replicas": 1}})
    written = cluster.merge_patch("RankingModel", "reco", "m", {"status": {"phase": "Ready"}, "spec": {"replicas": 5}},
                                  subresource="status")
    assert written["status"] == {"phase": "Ready"} and written["spec"] == {"replicas": 1}
    assert cluster.merge_patch("ConfigMap", "reco", "gone", {"data": {}}) is None


def test_a_stale_resource_version_is_a_conflict():
    cluster = FakeCluster(_cm())
    seen = cluster.get("ConfigMap", "reco", "a")
    cluster.merge_patch("ConfigMap", "reco", "a", {"data": {"k": "w"}})
    with pytest.raises(ApiError) as caught:
        cluster.merge_patch("ConfigMap", "reco", "a", {
            "metadata": {"resourceVersion": seen["metadata"]["resourceVersion"]}, "data": {"k": "mine"}})
    assert caught.value.status == 409 and cluster.stored("ConfigMap", "reco", "a")["data"] == {"k": "w"}
    assert [c.status for c in cluster.requests("merge_patch")] == [200, 409]


def test_finalizers_hold_a_deleted_object_until_they_are_emptied():
    cluster = FakeCluster({**_cm(), "metadata": {**_cm()["metadata"], "finalizers": ["x/y"]}})
    assert cluster.delete("ConfigMap", "reco", "a") is True
    held = cluster.get("ConfigMap", "reco", "a")
    assert held["metadata"]["deletionTimestamp"]
    cluster.merge_patch("ConfigMap", "reco", "a", {"metadata": {"finalizers": None}})
    assert cluster.get("ConfigMap", "reco", "a") is None
    assert cluster.delete("ConfigMap", "reco", "a") is False


def test_a_namespace_being_deleted_takes_no_new_objects():
    from rankops.controller.kube import namespace_terminating

    cluster = FakeCluster({"kind": "Namespace", "metadata": {"name": "reco", "finalizers": ["kubernetes"]}})
    cluster.delete("Namespace", None, "reco")
    with pytest.raises(ApiError) as caught:
        cluster.apply(_cm())
    assert namespace_terminating(caught.value)


def test_label_selectors_and_failures():
    cluster = FakeCluster(_cm("a", app="x", track="stable"), _cm("b", app="x"), _cm("c", namespace="other", app="y"))
    names = lambda items: [o["metadata"]["name"] for o in items]
    assert names(cluster.list("ConfigMap", "reco", labels={"app": "x"})) == ["a", "b"]
    assert names(cluster.list("ConfigMap", "reco", label_selector="app=x,track")) == ["a"]
    assert names(cluster.list("ConfigMap", "reco", label_selector="app=x,!track")) == ["b"]
    assert names(cluster.list("ConfigMap", None, label_selector="app")) == ["c", "a", "b"], "all namespaces"
    cluster.fail("apply", "ConfigMap", 422, times=1)
    with pytest.raises(ApiError) as caught:
        cluster.apply(_cm("d"), dry_run=True)
    assert caught.value.status == 422
    assert cluster.apply(_cm("d"), dry_run=True)
    assert cluster.get("ConfigMap", "reco", "d") is None, "a dry run stores nothing"
    with pytest.raises(InvalidName):
        cluster.get("ConfigMap", "reco", "../x")
