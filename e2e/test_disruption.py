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


def test_the_stable_budget_keeps_replicas_minus_the_tolerance_through_evictions(k8s, namespace, operator):
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
    evict(pods[0])
    wait_for(lambda: policy.read_namespaced_pod_disruption_budget(name, namespace).status.disruptions_allowed == 0,
             30, "the budget spent")
    with pytest.raises(ApiException) as refused:
        evict(pods[1])
    assert refused.value.status == 429, refused.value
