"""kopf's diff base stays small whatever the spec's size (issue 12, finding 6): a copy of a large
spec in an annotation made every kopf patch fail, the finalizer's removal included."""
from __future__ import annotations

import json

import kopf

from rankops.controller import runtime
from rankops.controller.diffbase import DigestDiffBaseStorage

KEY = "rankops.io/last-handled-configuration"


def body(spec: dict, annotations: dict | None = None) -> kopf.Body:
    return kopf.Body({"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
                      "metadata": {"name": "m", "namespace": "ns", "annotations": annotations or {}},
                      "spec": spec, "status": {"phase": "Ready"}})


def storage() -> kopf.DiffBaseStorage:
    settings = kopf.OperatorSettings()
    runtime.configure_kopf(settings, workers=16)
    return settings.persistence.diffbase_storage


def stored(store: kopf.DiffBaseStorage, obj: kopf.Body) -> dict[str, str]:
    patch = kopf.Patch()
    store.store(body=obj, patch=patch, essence=store.build(body=obj))
    return dict(patch["metadata"]["annotations"])


def test_a_large_spec_leaves_a_small_annotation():
    big = {"podAnnotations": {f"k{i}": "v" * 60_000 for i in range(5)}}   # ~300 KiB
    annotations = stored(storage(), body(big))
    assert annotations and all(len(v) < 100 for v in annotations.values()), \
        {k: len(v) for k, v in annotations.items()}


def test_unchanged_means_no_diff_and_a_change_is_seen():
    store = storage()
    old = body({"replicas": 1})
    annotations = {**stored(store, old)}
    same = body({"replicas": 1}, annotations)
    assert store.fetch(body=same) == store.build(body=same)
    changed = body({"replicas": 2}, annotations)
    assert store.fetch(body=changed) != store.build(body=changed)
    relabelled = body({"replicas": 1}, {**annotations, "team": "ranking"})
    assert store.fetch(body=relabelled) != store.build(body=relabelled), "labels and annotations count too"
    assert store.fetch(body=body({"replicas": 1})) is None, "never handled: a creation"


def test_kopfs_own_format_is_still_read():
    """Objects handled before the switch keep their diff base: no creation re-run, no change missed."""
    legacy = DigestDiffBaseStorage(prefix="rankops.io", key="last-handled-configuration")
    old = body({"replicas": 1})
    essence = kopf.AnnotationsDiffBaseStorage(prefix="rankops.io", key="last-handled-configuration").build(body=old)
    annotations = {KEY: json.dumps(essence) + "\n"}
    assert legacy.fetch(body=body({"replicas": 1}, annotations)) == essence
    assert storage().fetch(body=body({"replicas": 3}, annotations)) == essence
