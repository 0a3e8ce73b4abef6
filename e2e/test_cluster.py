"""The cluster's own proofs: the API server is the pinned release, the scheduler honours GPU
requests and node selectors on the simulated nodes, and kwok drives pods the way the
operator's tests need (Ready replicas, completing Jobs, simulated exit codes and messages).
"""
from __future__ import annotations

import json
import os
import re

import pytest

from e2e.support import wait_for

PAUSE = "registry.k8s.io/pause:3.10"  # never pulled: kwok plays the kubelet


def _container(gpus: int = 0) -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"name": "main", "image": PAUSE, "resources": resources}


def _pods(k8s, namespace: str, selector: str) -> list:
    return k8s.core.list_namespaced_pod(namespace, label_selector=selector).items


def test_server_is_a_live_pinned_release(cluster):
    from rankops_dev.binaries import k8s_version

    git_version = cluster.version["git_version"]
    match = re.fullmatch(r"v1\.(\d+)\.\d+.*", git_version)
    assert match, f"unexpected server version {git_version!r}"
    assert int(match.group(1)) >= 33, f"server {git_version} is older than 1.33"
    expected = os.environ.get("RANKOPS_E2E_EXPECT_VERSION") or (k8s_version() if cluster.local else None)
    if expected:
        assert git_version == expected


def test_simulated_nodes_look_like_rhel8_gpu_servers(k8s, gpu_nodes):
    from rankops_dev.nodes import E2E_NODES, SHAPES

    assert len(gpu_nodes.by_product.get("Tesla-T4", ())) == 2
    assert len(gpu_nodes.by_product.get("NVIDIA-L4", ())) == 1
    for name in gpu_nodes.gpu:
        node = k8s.core.read_node(name)
        assert node.status.node_info.os_image == "Red Hat Enterprise Linux 8.9 (Ootpa)"
        assert node.status.node_info.kernel_version == "4.18.0-513.5.1.el8_9.x86_64"
        assert node.status.node_info.container_runtime_version == "cri-o://1.27.1"
        shape = SHAPES[dict(E2E_NODES)[name]]
        assert node.status.allocatable["nvidia.com/gpu"] == str(shape.gpu_count)
        assert node.metadata.labels["nvidia.com/gpu.count"] == str(shape.gpu_count)
        assert int(node.metadata.labels["nvidia.com/gpu.memory"]) > 0
        assert node.metadata.labels["node.kubernetes.io/instance-type"]
    for name in gpu_nodes.cpu:
        assert "nvidia.com/gpu" not in (k8s.core.read_node(name).status.allocatable or {})


def test_gpu_deployment_lands_on_matching_nodes_and_gets_ready(k8s, namespace, gpu_nodes):
    labels = {"app": "ranker"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ranker"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
                "containers": [_container(gpus=1)]}},
        },
    }
    k8s.apps.create_namespaced_deployment(namespace, deployment)
    wait_for(lambda: (k8s.apps.read_namespaced_deployment_status("ranker", namespace)
                      .status.ready_replicas or 0) == 2, 60, "2 ready replicas of ranker")
    nodes = sorted(p.spec.node_name for p in _pods(k8s, namespace, "app=ranker"))
    # One GPU per T4 node: two replicas must take both T4 nodes, nothing else.
    assert nodes == sorted(gpu_nodes.by_product["Tesla-T4"])

    # A third replica has no T4 GPU left: the scheduler must leave it Pending.
    k8s.apps.patch_namespaced_deployment_scale("ranker", namespace, {"spec": {"replicas": 3}})

    def unschedulable_pod():
        for pod in _pods(k8s, namespace, "app=ranker"):
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                    return cond.message
        return None

    message = wait_for(unschedulable_pod, 30, "the third replica to be Unschedulable")
    assert "nvidia.com/gpu" in message


def test_job_completes(k8s, namespace, gpu_nodes):
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "containers": [_container()]}}},
    }
    k8s.batch.create_namespaced_job(namespace, job)
    status = wait_for(lambda: (s := k8s.batch.read_namespaced_job_status("once", namespace).status)
                      .succeeded and s, 60, "Job once to succeed")
    assert any(c.type == "Complete" and c.status == "True" for c in status.conditions)


@pytest.mark.parametrize("exit_code, phase, job_condition", [
    (0, "Succeeded", "Complete"),
    (3, "Failed", "Failed"),
])
def test_simulated_exit_code_and_termination_message(k8s, namespace, gpu_nodes,
                                                     exit_code, phase, job_condition):
    verdict = json.dumps({"gate": "equivalence", "passed": exit_code == 0, "maxAbsError": 0.0012})
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "gate"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {"sim.rankops.io/exit-code": str(exit_code),
                                         "sim.rankops.io/termination-message": verdict}},
            "spec": {"restartPolicy": "Never", "containers": [_container()]}}},
    }
    k8s.batch.create_namespaced_job(namespace, job)

    def finished():
        conditions = k8s.batch.read_namespaced_job_status("gate", namespace).status.conditions or []
        return [c.type for c in conditions if c.status == "True" and c.type in ("Complete", "Failed")]

    assert wait_for(finished, 60, f"Job gate to finish ({job_condition})") == [job_condition]
    (pod,) = _pods(k8s, namespace, "job-name=gate")
    assert pod.status.phase == phase
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == exit_code
    assert json.loads(terminated.message) == json.loads(verdict)
    assert terminated.reason == ("Completed" if exit_code == 0 else "Error")


def test_pod_marked_not_ready_runs_but_stays_unready(k8s, namespace, gpu_nodes):
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "cold", "annotations": {"sim.rankops.io/ready": "false"}},
           "spec": {"containers": [_container()]}}
    k8s.core.create_namespaced_pod(namespace, pod)
    status = wait_for(lambda: (s := k8s.core.read_namespaced_pod_status("cold", namespace).status)
                      .phase == "Running" and s, 60, "pod cold to run")
    ready = {c.type: c.status for c in status.conditions}
    assert ready["Ready"] == "False" and ready["PodScheduled"] == "True"
    assert status.container_statuses[0].ready is False


def test_a_pod_marked_not_ready_by_the_node_controller_is_ready_again_as_a_kubelet_would_say(
        k8s, namespace, gpu_nodes):
    """After an API server outage the node lifecycle controller finds the Leases lapsed and marks
    the nodes' pods NotReady; a kubelet reports them Ready again once it reaches the API server.
    kwok's pod-ready stage did not (it matches pods without a podIP only), so a rollout rolled back
    over pods that were fine: pod-ready-again does."""
    k8s.core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lapsed"},
                                               "spec": {"containers": [_container()]}})

    def ready() -> bool:
        status = k8s.core.read_namespaced_pod_status("lapsed", namespace).status
        return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])

    wait_for(ready, 60, "pod lapsed Ready")
    # What the node lifecycle controller writes (MarkPodsNotReady): Ready False, reason NodeNotReady.
    k8s.core.patch_namespaced_pod_status("lapsed", namespace, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}})
    assert not ready()
    wait_for(ready, 30, "pod lapsed Ready again")


def test_daemonset_gets_one_pod_per_matching_node(k8s, namespace, gpu_nodes):
    labels = {"app": "validator"}
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "validator"},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                     "containers": [_container()]}}},
    }
    k8s.apps.create_namespaced_daemon_set(namespace, daemonset)

    def all_ready():
        status = k8s.apps.read_namespaced_daemon_set_status("validator", namespace).status
        return status.desired_number_scheduled and status.number_ready == status.desired_number_scheduled

    wait_for(all_ready, 60, "every validator pod Ready")
    nodes = sorted(p.spec.node_name for p in _pods(k8s, namespace, "app=validator"))
    gpu_labelled = sorted(n.metadata.name for n in
                          k8s.core.list_node(label_selector="nvidia.com/gpu.present=true").items)
    assert nodes == gpu_labelled
    assert set(gpu_nodes.gpu) <= set(nodes) and not set(gpu_nodes.cpu) & set(nodes)


def test_simulated_nodes_renew_their_leases(k8s, gpu_nodes):
    """Without Lease renewals the node lifecycle controller marks every node NotReady ~40 s
    after its last status update, and every pod with it: long tests would fail at random."""
    import datetime as dt

    from kubernetes import client

    leases = {lease.metadata.name: lease for lease in
              client.CoordinationV1Api(k8s.api_client).list_namespaced_lease("kube-node-lease").items}
    now = dt.datetime.now(dt.timezone.utc)
    for name in gpu_nodes.gpu + gpu_nodes.cpu:
        assert name in leases, f"node {name} has no Lease"
        renewed = leases[name].spec.renew_time
        assert renewed and (now - renewed).total_seconds() < 40, (name, renewed)
