"""Disruption budgets on the local cluster (issue 25 item 1): a served model's stable track has a
PodDisruptionBudget keeping replicas - failureTolerance, which the disruption controller computes
from the Ready pods, and the Eviction API honours it."""
from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e import models
from e2e.support import wait_for
from rankops.render import names

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")


HOLD_TAINT = {"key": "e2e.rankops.io/hold", "value": "true", "effect": "NoSchedule"}


def _hold_new_pods(k8s, nodes, hold: bool) -> None:
    """Taint (or untaint) the GPU nodes so the replacement of an evicted pod stays Pending: on kwok
    it would be Ready within a second and give the budget back before the second eviction. A
    NoSchedule taint is not a leaving node (rollout.disruption.node_leaving): nothing moves."""
    for node in nodes:
        taints = [t for t in k8s.core.read_node(node).spec.taints or [] if t.key != HOLD_TAINT["key"]]
        kept = [k8s.api_client.sanitize_for_serialization(t) for t in taints]
        k8s.core.patch_node(node, {"spec": {"taints": kept + ([HOLD_TAINT] if hold else [])}})


def test_the_stable_budget_keeps_replicas_minus_the_tolerance_through_evictions(k8s, namespace, operator, gpu_nodes):
    models.create(k8s, namespace, models.model_manifest("budget", replicas=2))
    models.wait_ready(k8s, namespace, "budget")
    policy = client.PolicyV1Api(k8s.api_client)
    name = names.disruption_budget_name("budget", names.STABLE)

    def settled():
        pdb = policy.read_namespaced_pod_disruption_budget(name, namespace)
        return pdb if (pdb.status and pdb.status.observed_generation == pdb.metadata.generation
                       and pdb.status.current_healthy == 2) else None

    pdb = wait_for(settled, 60, "the disruption controller counts the stable pods")
    assert pdb.spec.min_available == 1 and pdb.spec.unhealthy_pod_eviction_policy == "AlwaysAllow"
    assert pdb.status.disruptions_allowed == 1
    assert [r.kind for r in pdb.metadata.owner_references] == ["RankingModel"]

    # As `kubectl drain` does: the first eviction goes, a second one while only one is Ready is refused.
    pods = k8s.core.list_namespaced_pod(
        namespace, label_selector=f"{names.LABEL_MODEL}=budget,{names.LABEL_TRACK}={names.STABLE}").items
    assert len(pods) == 2
    evict = lambda pod: k8s.core.create_namespaced_pod_eviction(  # noqa: E731
        pod.metadata.name, namespace, {"apiVersion": "policy/v1", "kind": "Eviction",
                                       "metadata": {"name": pod.metadata.name, "namespace": namespace}})
    _hold_new_pods(k8s, gpu_nodes.gpu, True)
    try:
        evict(pods[0])
        wait_for(lambda: policy.read_namespaced_pod_disruption_budget(name, namespace).status.disruptions_allowed == 0,
                 30, "the budget spent")
        with pytest.raises(ApiException) as refused:
            evict(pods[1])
        assert refused.value.status == 429, refused.value
    finally:
        _hold_new_pods(k8s, gpu_nodes.gpu, False)


class _ReplicasSeen:
    """Every spec.replicas the Deployment had, from a watch: a surge and its undo can both fall
    between two polls when kwok's pods are Ready at once."""

    def __init__(self, k8s, namespace: str, deployment: str):
        import threading

        from kubernetes import watch

        self.values: set[int] = set()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(k8s, namespace, deployment), daemon=True)
        self._thread.start()
        wait_for(lambda: self.values, 10, f"the watch on {deployment} listed it")   # watching before the change

    def _run(self, k8s, namespace: str, deployment: str) -> None:
        try:
            for event in self._watch.stream(k8s.apps.list_namespaced_deployment, namespace,
                                            field_selector=f"metadata.name={deployment}", timeout_seconds=120):
                self.values.add(event["object"].spec.replicas)
        except Exception:  # noqa: BLE001 - the watch ends with the test; what it saw stands
            pass

    def stop(self) -> None:
        self._watch.stop()
        self._thread.join(5)


def _stable_pods(k8s, namespace: str, model: str) -> list:
    return [p for p in k8s.core.list_namespaced_pod(
        namespace, label_selector=f"{names.LABEL_MODEL}={model},{names.LABEL_TRACK}={names.STABLE}").items
        if p.metadata.deletion_timestamp is None]


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@pytest.mark.parametrize("leave", ["cordon", "driver-upgrade"])
def test_a_replica_on_a_leaving_node_moves_before_it_goes(k8s, namespace, operator, gpu_nodes, leave):
    """Issue 25 item 4: a node cordoned (a drain's first step) or labelled by the GPU Operator's
    upgrade controller: the model surges a replacement elsewhere and lets the old replica go only
    once the replacement is Ready; Ready replicas never fall below the model's."""
    model = f"moves-{leave}"
    models.create(k8s, namespace, models.model_manifest(model, replicas=2))
    models.wait_ready(k8s, namespace, model)
    pods = sorted(_stable_pods(k8s, namespace, model), key=lambda p: p.metadata.name)
    node = pods[0].spec.node_name
    on_node = sum(1 for p in pods if p.spec.node_name == node)   # spreading is preferred: maybe both
    patch = {"spec": {"unschedulable": True}} if leave == "cordon" else \
        {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": "pod-deletion-required"}}}
    undo = {"spec": {"unschedulable": None}} if leave == "cordon" else \
        {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": None}}}
    deployment = names.deployment_name(model, names.STABLE)
    watched = _ReplicasSeen(k8s, namespace, deployment)
    k8s.core.patch_node(node, patch)
    seen = {"replicas": set(), "ready_min": 2}
    try:
        def moved():
            dep = k8s.apps.read_namespaced_deployment(deployment, namespace)
            seen["replicas"].add(dep.spec.replicas)
            pods = _stable_pods(k8s, namespace, model)
            ready = [p for p in pods if _ready(p)]
            seen["ready_min"] = min(seen["ready_min"], len(ready))
            return dep.spec.replicas == 2 and len(ready) == 2 and all(p.spec.node_name != node for p in pods)

        wait_for(moved, 90, f"the replica on {node} moved ({leave})", interval=0.2)
    finally:
        k8s.core.patch_node(node, undo)
        watched.stop()
    seen["replicas"] |= watched.values
    assert 2 + on_node in seen["replicas"], f"a replacement per leaving pod was surged first: {seen}"
    assert seen["ready_min"] >= 2, f"Ready replicas fell below the model's: {seen}"
    [moving] = models.wait_event(k8s, namespace, model, "MovingReplicas")
    assert node in moving.message, moving.message
