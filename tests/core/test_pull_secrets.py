"""Image pull secrets (`rankops run --image-pull-secret`, the chart's imagePullSecrets) on the
validator DaemonSets; the model pods and gate Jobs: tests/core/test_rollout_controller.py."""
from __future__ import annotations

from rankops.controller import pools
from rankops.controller.context import OperatorContext
from rankops.render.pullsecrets import with_pull_secrets
from tests.fakecluster import FakeCluster


def test_validator_daemonsets_get_the_operators_pull_secrets():
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
            "metadata": {"name": "t4", "uid": "u1", "generation": 1}, "spec": {"nodeSelector": {"pool": "t4"}}}
    kube = FakeCluster()
    pools.reconcile(kube, body, OperatorContext(image_pull_secrets=["regcred"]))
    (ds,) = [o for o in kube.applied if o["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_pull_secrets_are_added_once_and_only_to_pod_templates():
    job = {"kind": "Job", "spec": {"template": {"spec": {"imagePullSecrets": [{"name": "a"}]}}}}
    service = {"kind": "Service", "spec": {}}
    out = with_pull_secrets([job, service], ["a", "b", "b"])
    assert out[0]["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert out[1] == service and job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "a"}]
    assert with_pull_secrets([job], []) == [job]
