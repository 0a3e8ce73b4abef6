"""Disruptions on pods that really run (issue 25, item 5): two real nodes (conftest's `real`, with
`REAL_NODES = 2`: two kubelets and containerds in the cluster's network namespace), a model with
a replica in a container on each, production-like traffic sent from inside the namespace and
counted request by request. A drain through the Eviction API (as `kubectl drain` does), then the
GPU Operator's upgrade label on the other node: each time the operator surges a warm replacement
first, the budget holds the evictions, every pod that goes leaves the Service before Triton stops,
and no request fails. Last (it kills the second node for good): a node's machine dies."""
from __future__ import annotations

import threading
import time

import pytest
from kubernetes.client.rest import ApiException

from e2e import models
from e2e.support import wait_for
from e2e.test_canary_real import SMALL, SPEC, production_traffic, serve_real_model
from rankops.render import names

REAL_NODES = 2
pytestmark = pytest.mark.usefixtures("real_operator_logs_no_errors")


def _serving(k8s, ns: str, model: str) -> list:
    pods = k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_MODEL}={model},"
                                                           f"{names.LABEL_TRACK}={names.STABLE}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


class Capacity(threading.Thread):
    """The fewest Ready stable pods seen, sampled every 0.2 s."""

    def __init__(self, k8s, ns: str, model: str) -> None:
        super().__init__(daemon=True)
        self.k8s, self.ns, self.model = k8s, ns, model
        self.stop = threading.Event()
        self.fewest: int | None = None

    def run(self) -> None:
        while not self.stop.wait(0.2):
            count = len(_serving(self.k8s, self.ns, self.model))
            self.fewest = count if self.fewest is None else min(self.fewest, count)


def _drain(k8s, ns: str, node: str, timeout: float = 240) -> int:
    """Cordon `node` and evict this namespace's pods on it as `kubectl drain` does (a 429 from a
    budget is retried); returns how many evictions were refused on the way."""
    k8s.core.patch_node(node, {"spec": {"unschedulable": True}})
    refused, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in k8s.core.list_namespaced_pod(ns, field_selector=f"spec.nodeName={node}").items
                if p.metadata.deletion_timestamp is None]
        if not left:
            return refused
        for pod in left:
            try:
                k8s.core.create_namespaced_pod_eviction(pod.metadata.name, ns, {
                    "apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod.metadata.name, "namespace": ns}})
            except ApiException as exc:
                if exc.status != 429:
                    raise
                refused += 1
        time.sleep(1.0)
    raise AssertionError(f"{node} not drained within {timeout:.0f}s")


def _in_containers_on(real, pods: list) -> set[str]:
    """The nodes the pods ran on, after checking each is a real node's and its Triton a real
    runtime's container (containerd's ID, a pod IP of a real node's range)."""
    import ipaddress

    for pod in pods:
        [triton] = [c for c in pod.status.container_statuses if c.name == "triton"]
        assert triton.container_id.startswith("containerd://"), (pod.metadata.name, triton.container_id)
        node_range = real.pod_range(pod.spec.node_name)
        assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(node_range), \
            (pod.metadata.name, pod.status.pod_ip, node_range)
    nodes = {p.spec.node_name for p in pods}
    assert nodes <= set(real.node_names), (nodes, real.node_names)
    return nodes


def test_a_drain_and_a_driver_upgrade_move_replicas_without_a_failed_request(
        real, real_k8s, real_namespace_in, tmp_path):
    k8s, ns, name = real_k8s, real_namespace_in, "ranker"
    body = models.model_manifest(name, replicas=2, modelCredentialsSecret="model-store",
                                 tritonImage=real.refs["rankops-triton-test"], **SMALL, **SPEC)
    serve_real_model(k8s, ns, real.store, tmp_path, body)
    nodes = _in_containers_on(real, _serving(k8s, ns, name))
    assert nodes == set(real.node_names), nodes   # spread: a replica on each real node
    traffic = production_traffic(k8s, ns, name, bad_fraction=0.0, real=real)
    capacity = Capacity(k8s, ns, name)
    traffic.start()
    capacity.start()
    try:
        time.sleep(3)
        # 1. kubectl drain of the node with the first replica.
        drained = sorted(nodes)[0]
        refused = _drain(k8s, ns, drained)
        wait_for(lambda: len(_serving(k8s, ns, name)) == 2 and all(
            p.spec.node_name != drained for p in _serving(k8s, ns, name)), 180, "2 replicas off the drain")
        k8s.core.patch_node(drained, {"spec": {"unschedulable": None}})
        # 2. The GPU Operator takes the other node for a driver upgrade.
        [upgraded] = set(real.node_names) - {drained}
        k8s.core.patch_node(upgraded, {"metadata": {"labels": {
            "nvidia.com/gpu-driver-upgrade-state": "pod-deletion-required"}}})
        wait_for(lambda: len(_serving(k8s, ns, name)) == 2 and all(
            p.spec.node_name != upgraded for p in _serving(k8s, ns, name)), 180, "2 replicas off the upgrade")
        time.sleep(3)
    finally:
        traffic.stop.set()
        capacity.stop.set()
        traffic.join(30)
        capacity.join(5)
        for node in real.node_names:
            k8s.core.patch_node(node, {"spec": {"unschedulable": None}, "metadata": {
                "labels": {"nvidia.com/gpu-driver-upgrade-state": None}}})
    assert _in_containers_on(real, _serving(k8s, ns, name)) == {drained}
    print(f"\ndrain of {drained}: {refused} evictions refused by the budget; upgrade of {upgraded}; "
          f"fewest Ready replicas {capacity.fewest}; traffic: {traffic.sent} sent, {traffic.failed} failed")
    assert traffic.sent > 0 and traffic.failed == 0, traffic.failures[:5]
    assert capacity.fewest is not None and capacity.fewest >= 2 - 1, capacity.fewest   # replicas - tolerance
    models.wait_event(k8s, ns, name, "MovingReplicas")
    k8s.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, ns, models.PLURAL, name)


def test_a_dead_node_s_replica_is_replaced_and_only_requests_to_it_fail(
        real, real_k8s, real_namespace_in, tmp_path):
    """A node's machine dies (its kubelet, containerd and containers killed, nothing reported):
    requests sent to its pod fail until the node lifecycle controller marks the node (its grace
    period) and the pod leaves the Service; the operator surges a replacement then, which serves
    Ready and warm. The second node stays dead: this test is the module's last."""
    from rankops_dev import traffic as traffic_driver
    from e2e.test_canary_real import _request

    k8s, ns, name = real_k8s, real_namespace_in, "ranker"
    dead_node, live_node = real.node_names[1], real.node_names[0]   # the first runs kube-proxy and the DNS
    body = models.model_manifest(name, replicas=2, modelCredentialsSecret="model-store",
                                 tritonImage=real.refs["rankops-triton-test"],
                                 disruption={"nodeSpread": "required"}, **SMALL, **SPEC)
    serve_real_model(k8s, ns, real.store, tmp_path, body)
    assert _in_containers_on(real, _serving(k8s, ns, name)) == set(real.node_names)
    on_dead = [p for p in _serving(k8s, ns, name) if p.spec.node_name == dead_node]
    assert len(on_dead) == 1, [(p.metadata.name, p.spec.node_name) for p in _serving(k8s, ns, name)]
    dead_pod, dead_ip = on_dead[0].metadata.name, on_dead[0].status.pod_ip
    load = traffic_driver.Traffic(lambda: traffic_driver.serving_addresses(k8s.core, ns, name),
                                  name, lambda rng: _request(rng, False), rate=20, timeout_s=2.0, max_seconds=300,
                                  netns=real.netns)
    load.start()
    try:
        time.sleep(3)
        killed = time.time()
        real.node(dead_node).kill()
        marked = wait_for(lambda: dead_pod not in {p.metadata.name for p in _serving(k8s, ns, name)} and time.time(),
                          150, "the dead node's pod out of the Service")
        replaced = wait_for(lambda: len(_serving(k8s, ns, name)) == 2 and all(
            p.spec.node_name == live_node for p in _serving(k8s, ns, name)) and time.time(),
            150, "a replacement Ready on the live node")
        time.sleep(3)
    finally:
        load.stop.set()
        load.join(30)
    late = [f for f in load.failures if f[1] > marked + 2 * traffic_driver.REFRESH_S + 2.0]
    print(f"\nnode {dead_node} killed: its pod left the Service after {marked - killed:.0f} s (the grace "
          f"period), a replacement was Ready and warm {replaced - marked:.0f} s later "
          f"({replaced - killed:.0f} s after the death); traffic: {load.sent} sent, {load.failed} failed, "
          f"all to {dead_ip}: {all(f[0] == dead_ip for f in load.failures)}")
    assert _in_containers_on(real, _serving(k8s, ns, name)) == {live_node}
    assert all(f[0] == dead_ip for f in load.failures), load.failures[:5]   # only the dead node's
    assert not late, late[:5]                       # none once it has left the Service
    assert replaced - marked <= 60, replaced - marked
    rm = models.get(k8s, ns, name)
    assert models.condition(rm, "Ready").get("status") == "True", rm["status"]
    models.wait_event(k8s, ns, name, "MovingReplicas")
