"""Replicas on nodes that are going away move first, then go (rollout/disruption.py): a node
cordoned, failing validation (unless its pool keeps replicas), or in a GPU driver upgrade."""
from __future__ import annotations

import copy
import datetime as dt

import pytest

from rankops.controller import models
from rankops.controller.node_pods import NodePods
from rankops.render import names
from rankops.rollout.disruption import LEAVING_COST, StablePod, node_leaving, plan_moves

from tests.core.test_rollout_controller import Model, gpu_cluster, run_deployment
from tests.fakecluster import roll_out


def node(name="gpu-1", unschedulable=False, **labels):
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.mark.parametrize("labels, cordoned, keep, why", [
    ({}, False, False, None),
    ({}, True, False, "cordoned"),
    ({"rankops.io/gpu-ready": "false"}, False, False, "failing validation (rankops.io/gpu-ready=false)"),
    ({"rankops.io/gpu-ready": "false"}, False, True, None),                 # the pool keeps them
    ({"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"}, False, False, None),   # every node, queued
    ({"nvidia.com/gpu-driver-upgrade-state": "cordon-required"}, False, False,
     "GPU driver upgrade (nvidia.com/gpu-driver-upgrade-state=cordon-required)"),
    ({"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}, False, False,
     "GPU driver upgrade (nvidia.com/gpu-driver-upgrade-state=upgrade-failed)"),
    ({"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}, False, False, None),
])
def test_why_a_node_is_leaving(labels, cordoned, keep, why):
    assert node_leaving(node(unschedulable=cordoned, **labels), move_from_failing=not keep) == why


@pytest.mark.parametrize("condition, why", [
    ({"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"},
     "not Ready (Ready=Unknown: NodeStatusUnknown)"),        # no heartbeat: a dead node
    ({"type": "Ready", "status": "False"}, "not Ready (Ready=False: no reason given)"),
    ({"type": "Ready", "status": "True"}, None),
    (None, None),                                            # not reported yet: nothing to go by
])
def test_a_node_that_is_not_ready_is_leaving(condition, why):
    dead = node()
    dead["status"]["conditions"] = [condition] if condition else []
    assert node_leaving(dead) == why
    assert node_leaving(dead, move_from_failing=False) == why   # the pool's keep is for failing validation only


def pod(name, node_name, ready=True, leaving=None, cost=None):
    return StablePod(name, node_name, ready, False, leaving, cost)


def test_a_replica_on_a_leaving_node_surges_one_then_lets_it_go_once_the_others_are_ready():
    on_a = [pod("p1", "a", leaving="cordoned"), pod("p2", "b")]
    first = plan_moves(2, on_a)
    assert (first.surge, first.let_go) == (1, ("p1",))
    assert "moving 1 replica(s) off leaving nodes: p1 on a (cordoned); 1 replacement(s) surged, 1/2 Ready" \
        in first.message
    # The replacement is starting: still surged, the old one keeps serving.
    starting = on_a + [pod("p3", "c", ready=False)]
    assert plan_moves(2, [*starting[:1], *starting[1:]]).surge == 1
    # It is Ready (warm): no surge any more, the old one goes first (its deletion cost is set).
    ready = [pod("p1", "a", leaving="cordoned", cost=LEAVING_COST), pod("p2", "b"), pod("p3", "c")]
    done = plan_moves(2, ready)
    assert (done.surge, done.let_go) == (0, ()) and "letting the old ones go" in done.message
    # Gone: nothing to do.
    assert plan_moves(2, ready[1:]) == plan_moves(2, [])


def test_node_pods_wake_the_models_on_a_node_only_when_it_starts_or_stops_leaving():
    registry = NodePods()
    registry.pod_event({"metadata": {"namespace": "reco", "name": "p1", "labels": {names.LABEL_MODEL: "ctr"}},
                        "spec": {"nodeName": "a"}}, deleted=False)
    assert registry.node_event(node("a"), deleted=False) is None
    assert registry.node_event(node("a", unschedulable=True), deleted=False) == {("reco", "ctr")}
    assert registry.node_event(node("a", unschedulable=True), deleted=False) is None, "a heartbeat wakes none"
    assert registry.leaving_nodes("reco", "ctr") == frozenset({"a"})
    assert registry.node_event(node("a"), deleted=False) == {("reco", "ctr")}
    assert registry.leaving_nodes("reco", "ctr") == frozenset()


def test_the_controller_surges_a_replacement_for_a_replica_on_a_cordoned_node_then_scales_back():
    cluster = gpu_cluster()
    cluster.put(node("gpu-2"))
    model = Model(cluster, version="1")
    model.body["spec"]["replicas"] = 2
    model.reconcile()
    run_deployment(cluster, names.STABLE)
    dep_name = names.deployment_name(model.body["metadata"]["name"], names.STABLE)
    pods = cluster.list("Pod", "reco", {names.LABEL_TRACK: names.STABLE})
    cluster.put({"kind": "Pod", **pods[1], "spec": {**pods[1]["spec"], "nodeName": "gpu-2"}})
    cluster.put(node("gpu-1", unschedulable=True))                 # kubectl cordon gpu-1
    t = model.t

    def reconcile(seconds):
        nonlocal t
        t += seconds
        result = models.reconcile(cluster, copy.deepcopy(model.body), now=model_now(t),
                                  leaving_nodes=frozenset({"gpu-1"}), memory=model.memory)
        model.body["status"] = result.status.to_wire()
        return result

    result = reconcile(10)
    assert cluster.get("Deployment", "reco", dep_name)["spec"]["replicas"] == 3, "one replacement surged"
    leaving = cluster.get("Pod", "reco", pods[0]["metadata"]["name"])
    assert leaving["metadata"]["annotations"][names.ANNOTATION_DELETION_COST] == LEAVING_COST
    progressing = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "MovingReplicas" and "(cordoned)" in progressing["message"]
    assert "MovingReplicas" in [e.reason for e in result.events]
    # The budget still counts the model's 2 replicas, not the surge.
    budget = cluster.get("PodDisruptionBudget", "reco", names.disruption_budget_name(model.body["metadata"]["name"],
                                                                                      names.STABLE))
    assert budget["spec"]["minAvailable"] == 1
    # The replacement runs on gpu-2 and is Ready: back to 2 (the ReplicaSet removes the cheap one).
    cluster.put({"kind": "Pod", "metadata": {"name": "replacement", "namespace": "reco",
                                             "labels": dict(pods[0]["metadata"]["labels"])},
                 "spec": {"nodeName": "gpu-2"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert roll_out(cluster, "reco", dep_name)["status"]["readyReplicas"] == 3
    result = reconcile(10)
    assert cluster.get("Deployment", "reco", dep_name)["spec"]["replicas"] == 2
    ready = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", "a move keeps the model Ready"
    assert "NotReady" not in [e.reason for e in result.events]
    # The old pod gone, its node no longer has the model's pods: nothing moves.
    cluster.delete("Pod", "reco", pods[0]["metadata"]["name"])
    result = models.reconcile(cluster, copy.deepcopy(model.body), now=model_now(t + 10), memory=model.memory)
    assert cluster.get("Deployment", "reco", dep_name)["spec"]["replicas"] == 2
    assert next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Progressing")["reason"] != "MovingReplicas"


def model_now(seconds):
    from tests.core.test_rollout_controller import T0
    return T0 + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("nodes, replicas, tolerance, said", [
    ((("a", 1), ("b", 1)), 2, 1, None),
    ((("a", 2),), 2, 1, "2 of 2 stable replicas run on node a: losing it leaves 0, fewer than "
                         "replicas - failureTolerance = 1"),
    ((("a", 2), ("b", 1)), 3, 1, "2 of 3 stable replicas run on node a"),
    ((("a", 2), ("b", 2)), 4, 2, None),            # the tolerance covers a node
    ((("a", 1),), 1, 0, "1 of 1 stable replicas run on node a"),
    ((), 2, 1, None),
])
def test_replicas_sharing_a_node_beyond_the_tolerance_are_said(nodes, replicas, tolerance, said):
    from rankops.rollout.disruption import shared_node

    message = shared_node(nodes, replicas, tolerance, required=False)
    assert (message is None) == (said is None) and (said is None or message.startswith(said)), message
    if message:
        assert "nodeSpread: preferred" in message and "free a GPU on another node" in message


def test_a_pod_watch_counts_a_track_s_pods_per_node_leaving_out_those_going():
    pods = NodePods()

    def seen(name, node_name, track, going=False):
        meta = {"namespace": "ns", "name": name, "labels": {names.LABEL_MODEL: "m", names.LABEL_TRACK: track}}
        if going:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        pods.pod_event({"metadata": meta, "spec": {"nodeName": node_name}}, deleted=False)

    seen("s1", "a", names.STABLE)
    seen("s2", "a", names.STABLE)
    seen("s3", "b", names.STABLE, going=True)
    seen("c1", "b", names.CANARY)
    assert pods.track_nodes("ns", "m", names.STABLE) == (("a", 2),)
    pods.pod_event({"metadata": {"namespace": "ns", "name": "s2"}, "spec": {}}, deleted=True)
    assert pods.track_nodes("ns", "m", names.STABLE) == (("a", 1),)
    assert pods.track_nodes("ns", "m", names.CANARY) == (("b", 1),)
    # Another model's pod, and one relabelled to it, count for that model only.
    pods.pod_event({"metadata": {"namespace": "ns", "name": "o1", "labels": {names.LABEL_MODEL: "other",
                    names.LABEL_TRACK: names.STABLE}}, "spec": {"nodeName": "a"}}, deleted=False)
    pods.pod_event({"metadata": {"namespace": "ns", "name": "s1", "labels": {names.LABEL_MODEL: "other",
                    names.LABEL_TRACK: names.STABLE}}, "spec": {"nodeName": "a"}}, deleted=False)
    assert pods.track_nodes("ns", "m", names.STABLE) == ()
    assert pods.track_nodes("ns", "other", names.STABLE) == (("a", 2),)
    assert pods.node_event({"metadata": {"name": "a"}, "spec": {"unschedulable": True}}, deleted=False) == {("ns", "other")}
    assert pods.leaving_nodes("ns", "other") == frozenset({"a"}) and pods.leaving_nodes("ns", "m") == frozenset()


def test_a_model_whose_replicas_share_a_node_says_so_once_and_stays_ready():
    cluster = gpu_cluster()
    model = Model(cluster, version="1")
    model.body["spec"]["replicas"] = 2
    model.reconcile()
    run_deployment(cluster, names.STABLE)

    def reconcile(seconds, nodes):
        result = models.reconcile(cluster, copy.deepcopy(model.body), now=model_now(model.t + seconds),
                                  stable_nodes=nodes)
        model.body["status"] = result.status.to_wire()
        return result

    first = reconcile(10, (("gpu-1", 2),))
    degraded = next(c for c in first.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False" and degraded["reason"] == "AsExpected"
    assert "2 of 2 stable replicas run on node gpu-1: losing it leaves 0" in degraded["message"]
    assert [e.reason for e in first.events].count("ReplicasShareANode") == 1
    assert next(c for c in first.status.to_wire()["conditions"] if c["type"] == "Ready")["status"] == "True"
    again = reconcile(20, (("gpu-1", 2),))
    assert "ReplicasShareANode" not in [e.reason for e in again.events], "said once"
    # Degraded for another reason: the note is hidden there, and no Event repeats it each reconcile.
    conditions = model.body["status"]["conditions"]
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    degraded.update(status="True", reason="RequestsNotBatched", message="inputs not batched")
    hidden = models.reconcile(cluster, copy.deepcopy({**model.body, "status": {**model.body["status"]}}),
                              now=model_now(model.t + 25), stable_nodes=(("gpu-1", 2),))
    assert "ReplicasShareANode" not in [e.reason for e in hidden.events]
    spread = reconcile(30, (("gpu-1", 1), ("gpu-2", 1)))
    assert "run on node" not in next(c for c in spread.status.to_wire()["conditions"] if c["type"] == "Degraded")["message"]
