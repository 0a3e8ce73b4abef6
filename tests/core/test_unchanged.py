"""Write only on change (issue 13): a child is left alone when it says what rankops would apply."""
from __future__ import annotations

import copy

from rankops.controller.unchanged import APPLIED_ANNOTATION, unchanged, with_digest

DESIRED = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "m-stable", "namespace": "reco", "labels": {"rankops.io/model": "m"},
                 "ownerReferences": [{"kind": "RankingModel", "name": "m", "uid": "u1", "controller": True}]},
    "spec": {"replicas": 1, "template": {"spec": {"containers": [{
        "name": "triton", "image": "triton:1", "ports": [{"containerPort": 8000, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "1"}}, "env": []}]}}},
}


def as_stored(obj: dict) -> dict:
    """What the API server answers: defaults and status added, quantities as strings."""
    stored = copy.deepcopy(obj)
    stored["metadata"].update(uid="d1", resourceVersion="7", generation=1)
    container = stored["spec"]["template"]["spec"]["containers"][0]
    container["ports"][0]["protocol"] = "TCP"
    container["resources"]["limits"]["nvidia.com/gpu"] = "1"
    container.pop("env")
    stored["spec"]["strategy"] = {"type": "RollingUpdate"}
    stored["status"] = {"readyReplicas": 1}
    return stored


def test_a_child_as_applied_is_unchanged_despite_server_defaults():
    desired = with_digest(DESIRED)
    assert APPLIED_ANNOTATION in desired["metadata"]["annotations"]
    assert with_digest(desired) == desired, "the digest does not digest itself"
    assert unchanged(desired, as_stored(desired))


def test_missing_deleted_or_applied_by_an_older_rendering_is_changed():
    desired = with_digest(DESIRED)
    assert not unchanged(desired, None)
    going = as_stored(desired)
    going["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert not unchanged(desired, going)
    older = copy.deepcopy(DESIRED)
    older["spec"]["template"]["spec"]["containers"][0]["image"] = "triton:0"
    assert not unchanged(desired, as_stored(with_digest(older)))
    assert not unchanged(desired, as_stored(DESIRED)), "never applied with a digest (an older operator)"


def test_a_hand_edit_of_an_owned_field_is_drift():
    desired = with_digest(DESIRED)
    scaled = as_stored(desired)
    scaled["spec"]["replicas"] = 3
    assert not unchanged(desired, scaled)
    relabelled = as_stored(desired)
    relabelled["metadata"]["labels"] = {}
    assert not unchanged(desired, relabelled)
    extra_port = as_stored(desired)
    extra_port["spec"]["template"]["spec"]["containers"][0]["ports"].append({"containerPort": 9})
    assert not unchanged(desired, extra_port)
    # A field rankops does not set is not its business.
    annotated = as_stored(desired)
    annotated["metadata"]["annotations"]["someone.else/note"] = "x"
    annotated["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    assert unchanged(desired, annotated)
