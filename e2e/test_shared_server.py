"""Issue 42's wiring against a live API server and the operator process (simulated GPU nodes: the
server's pod runs nowhere, so its members stay Loading; tests/triton/test_shared_server_pod.py
and the real-container test load them into a real Triton through the same shell).

A RankingModel naming a SharedServer gets no pods of its own and says its server's word; the
SharedServer's plan is applied (its Deployment, a selector-less Service and an EndpointSlice per
member it holds), its status lists each member; spec.server is fixed at creation.
"""
from __future__ import annotations

import subprocess

import pytest

from e2e import models
from e2e.support import gone, wait_for
from rankops.api.crdgen import GROUP, VERSION
from rankops.render import names

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")

SERVER = "ranking"
MEMBER = {"server": SERVER, "replicas": 2, "warmReplicas": {"enabled": False},
          "slo": {"p99LatencyMs": 40, "targetQps": 100},
          "planning": {"latencyProfile": {1: 1.0, 512: 8.0},
                       "memory": {"weightsMiB": 1000, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}}}


def _server(k8s, namespace: str) -> dict:
    return k8s.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "sharedservers", SERVER)


def _line(k8s, namespace: str, member: str) -> dict | None:
    return next((m for m in (_server(k8s, namespace).get("status") or {}).get("members") or []
                 if m["name"] == member), None)


def test_members_say_their_server_s_word_and_get_no_pods_of_their_own(cluster, k8s, namespace, operator):
    models.create(k8s, namespace, models.model_manifest("coarse", **MEMBER))
    rm = models.wait_status(k8s, namespace, "coarse", lambda rm: models.condition(rm, "Degraded").get("reason")
                            == "SharedServerNotFound", "coarse says its server does not exist")
    assert rm["status"]["phase"] == "Degraded" and "spec.server" in models.condition(rm, "Degraded")["message"]

    # spec.server is fixed at creation: the API server refuses the edit and names the field
    done = subprocess.run([cluster.tool("kubectl"), "patch", "-n", namespace, "rankingmodel", "coarse", "--type=merge",
                           "-p", '{"spec": {"server": "elsewhere"}}'], env=cluster.env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "spec.server is set when a RankingModel is created" in done.stderr, done.stderr

    k8s.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "sharedservers", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharedServer", "metadata": {"name": SERVER},
        "spec": {"gpuMemoryMiB": 15360, "resources": {"cpu": "1", "memory": "2Gi"}}})
    models.create(k8s, namespace, models.model_manifest("wide", **{**MEMBER, "gpusPerReplica": 2}))
    line = wait_for(lambda: _line(k8s, namespace, "coarse"), 60, "the server lists coarse")
    assert line["state"] == "Loading" and line["port"] == 9000, line
    wide = wait_for(lambda: _line(k8s, namespace, "wide"), 60, "the server lists wide")
    assert (wide["state"], wide["reason"]) == ("Refused", "NotShareable") and "gpusPerReplica" in wide["message"]

    rm = models.wait_status(k8s, namespace, "coarse", lambda rm: models.condition(rm, "Ready").get("reason")
                            == "WaitingForServer" and models.condition(rm, "Degraded").get("status") == "False",
                            "coarse waits for its server")
    assert rm["status"]["phase"] == "Pending"
    models.wait_status(k8s, namespace, "wide", lambda rm: models.condition(rm, "Degraded").get("reason")
                       == "NotShareable", "wide says why the server refuses it")

    # the server's objects, none of the members' own
    deployments = [d.metadata.name for d in k8s.apps.list_namespaced_deployment(namespace).items]
    assert deployments == [names.server_name(SERVER)], deployments
    service = k8s.core.read_namespaced_service("coarse", namespace)
    assert service.spec.selector is None and service.metadata.owner_references[0].kind == "SharedServer"
    slices = k8s.custom.list_namespaced_custom_object("discovery.k8s.io", "v1", namespace, "endpointslices",
                                                      label_selector=f"{names.LABEL_SERVER}={SERVER}")["items"]
    assert [s["metadata"]["name"] for s in slices] == ["coarse-shared"]
    assert gone(lambda: k8s.core.read_namespaced_service("wide", namespace))

    # the server goes: its members say so, and its objects go with it
    k8s.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "sharedservers", SERVER)
    models.wait_status(k8s, namespace, "coarse", lambda rm: models.condition(rm, "Degraded").get("reason")
                       == "SharedServerNotFound", "coarse says its server is gone")
