"""One tenant's pods trickle their metrics; another tenant's rollout completes on time (issue 36).

The trickling model is autoscaled by rankops, so the operator reads its pods' metrics port every
few seconds. Its pods are kwok's, moved onto loopback addresses where the test serves a metrics
endpoint that sends a byte every half second and never ends (the pods are still the model's own:
their ReplicaSet is its Deployment's, so they are read). A pod that only carries the model's
labels stands beside them with an honest-looking endpoint that claims a huge load: it is not the
model's, so it is never read. Meanwhile a second model rolls out a new version: it is promoted in
the time such a rollout takes alone, and the trickling model keeps its replicas (no scale-down on
pods it could not read) and says why in status.
"""
from __future__ import annotations

import time

import pytest

from e2e import models, rollouts
from e2e.support import wait_for
from e2e.test_rollout import _rollout
from rankops.render import names
from tests.hostile import Endpoint

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")

METRICS_PORT = 8002
PROMOTED_WITHIN_S = 90   # a rollout of this shape alone: well under a minute here


def trickle(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    while not stop.wait(0.5):
        conn.sendall(b"#")


def forged_load(model: str):
    body = (f'nv_inference_request_success{{model="{model}",version="1"}} 900000000000\n').encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    return lambda conn, stop: conn.sendall(answer)


def _move_to(k8s, namespace: str, pod: str, address: str) -> None:
    # A JSON patch: a strategic merge would add the address to podIPs beside kwok's.
    k8s.core.patch_namespaced_pod_status(pod, namespace, [
        {"op": "replace", "path": "/status/podIP", "value": address},
        {"op": "replace", "path": "/status/podIPs", "value": [{"ip": address}]}])


def test_a_tenant_whose_pods_trickle_metrics_slows_no_other_tenants_rollout(k8s, namespace, operator):
    trickler, steady = "trickler", "steady"
    autoscaling = {"enabled": True, "mode": "rankops", "minReplicas": 1, "maxReplicas": 4,
                   "capacityPerReplicaQps": 100, "scaleDownStabilizationSeconds": 0}
    models.create(k8s, namespace, models.model_manifest(trickler, replicas=3, autoscaling=autoscaling))
    models.create(k8s, namespace, models.model_manifest(steady, version="1", versions=("1", "2"),
                                                        rollout=_rollout()))
    models.wait_ready(k8s, namespace, trickler)
    models.wait_ready(k8s, namespace, steady)

    endpoints: list[Endpoint] = []
    try:
        pods = k8s.core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_MODEL}={trickler},"
                                                                      f"{names.LABEL_TRACK}={names.STABLE}").items
        assert len(pods) == 3, [p.metadata.name for p in pods]
        for i, pod in enumerate(pods):
            address = f"127.66.0.{i + 1}"
            endpoints.append(Endpoint(trickle, address, METRICS_PORT))
            _move_to(k8s, namespace, pod.metadata.name, address)
        # A pod with the model's labels that no Deployment of the model owns, claiming a huge load.
        labels = dict(pods[0].metadata.labels)
        labels.pop("pod-template-hash", None)
        k8s.core.create_namespaced_pod(namespace, {
            "metadata": {"name": "not-the-models", "labels": labels},
            "spec": {"nodeName": pods[0].spec.node_name, "containers": [{"name": "x", "image": "busybox"}],
                     "tolerations": [{"operator": "Exists"}]}})
        wait_for(lambda: k8s.core.read_namespaced_pod("not-the-models", namespace).status.pod_ip,
                 30, "the forged pod running")
        endpoints.append(Endpoint(forged_load(trickler), "127.66.0.99", METRICS_PORT))
        _move_to(k8s, namespace, "not-the-models", "127.66.0.99")

        # The trickling pods are read (and stall): the status names them and why.
        rm = models.wait_status(k8s, namespace, trickler, lambda rm: "no full answer in 2s" in
                                ((rm["status"].get("autoscaling") or {}).get("message") or ""),
                                "the trickling pods named in status.autoscaling", timeout=60)
        # Meanwhile the other tenant's rollout goes through in its usual time.
        started = time.monotonic()
        models.patch_spec(k8s, namespace, steady, {"version": "2"})
        seen, done, _ = rollouts.watch_phases(k8s, namespace, steady, "2", {"Promoted", "RolledBack"},
                                              timeout=PROMOTED_WITHIN_S)
        took = time.monotonic() - started
        assert seen[-1] == "Promoted", (seen, done["status"])
        assert took < PROMOTED_WITHIN_S, took
        # No scale-down on pods that could not be read, and no scale-up on the forged pod's load.
        rm = models.get(k8s, namespace, trickler)
        scaling = rm["status"]["autoscaling"]
        assert scaling["desiredReplicas"] == 3, scaling
        assert "not-the-models" not in str(scaling), scaling
        deployment = k8s.apps.read_namespaced_deployment(names.deployment_name(trickler, names.STABLE), namespace)
        assert deployment.spec.replicas == 3
    finally:
        for endpoint in endpoints:
            endpoint.close()
