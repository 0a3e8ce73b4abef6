"""Disruptions on pods that really run (issue 25, item 5): two process nodes, a model with a
replica on each, production-like traffic counted request by request. A drain through the
Eviction API (as `kubectl drain` does), then the GPU Operator's upgrade label on the other node:
each time the operator surges a warm replacement first, the budget holds the evictions, every pod
that goes leaves the Service before Triton stops, and no request fails."""
from __future__ import annotations

import threading
import time

from kubernetes.client.rest import ApiException

from e2e import models
from e2e.support import wait_for
from e2e.test_canary_real import SPEC, production_traffic, serve_real_model
from rankops.render import names


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


def test_a_drain_and_a_driver_upgrade_move_replicas_without_a_failed_request(
        k8s, cluster, real_namespace, operator, object_store, process_node, tmp_path):
    from rankops_dev.process_nodes import ProcessNode

    ns, name = real_namespace, "ranker"
    body = models.model_manifest(name, replicas=2, modelCredentialsSecret="model-store", **SPEC)
    with ProcessNode(cluster.kubeconfig, "process-1", tmp_path / "process-1") as other:
        try:
            serve_real_model(k8s, ns, object_store, tmp_path, body)
            nodes = {p.spec.node_name for p in _serving(k8s, ns, name)}
            traffic = production_traffic(k8s, ns, name, bad_fraction=0.0)
            capacity = Capacity(k8s, ns, name)
            traffic.start()
            capacity.start()
            try:
                time.sleep(3)
                # 1. kubectl drain of the node with the first replica.
                drained = sorted(nodes)[0]
                refused = _drain(k8s, ns, drained)
                wait_for(lambda: len(_serving(k8s, ns, name)) == 2 and all(
                    p.spec.node_name != drained for p in _serving(k8s, ns, name)), 120, "2 replicas off the drain")
                k8s.core.patch_node(drained, {"spec": {"unschedulable": None}})
                # 2. The GPU Operator takes the other node for a driver upgrade.
                upgraded = other.name if drained != other.name else process_node.name
                k8s.core.patch_node(upgraded, {"metadata": {"labels": {
                    "nvidia.com/gpu-driver-upgrade-state": "pod-deletion-required"}}})
                wait_for(lambda: len(_serving(k8s, ns, name)) == 2 and all(
                    p.spec.node_name != upgraded for p in _serving(k8s, ns, name)), 120, "2 replicas off the upgrade")
                time.sleep(3)
            finally:
                traffic.stop.set()
                capacity.stop.set()
                traffic.join(30)
                capacity.join(5)
                for node in (process_node.name, other.name):
                    k8s.core.patch_node(node, {"spec": {"unschedulable": None}, "metadata": {
                        "labels": {"nvidia.com/gpu-driver-upgrade-state": None}}})
            print(f"\ndrain of {drained}: {refused} evictions refused by the budget; upgrade of {upgraded}; "
                  f"fewest Ready replicas {capacity.fewest}; traffic: {traffic.sent} sent, {traffic.failed} failed")
            assert traffic.failed == 0, traffic.failures[:5]
            assert capacity.fewest is not None and capacity.fewest >= 2 - 1, capacity.fewest   # replicas - tolerance
            models.wait_event(k8s, ns, name, "MovingReplicas")
        finally:   # the model's pods leave process-1 before its runner stops
            k8s.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, ns, models.PLURAL, name)
            wait_for(lambda: not [p for p in k8s.core.list_namespaced_pod(ns).items
                                  if p.spec.node_name == other.name], 120, "the model's pods off process-1")
    k8s.core.delete_node("process-1")


def test_a_dead_node_s_replica_is_replaced_and_only_requests_to_it_fail(
        k8s, cluster, real_namespace, operator, object_store, process_node, tmp_path):
    """A node's machine dies (its runner and pods killed, nothing reported): requests sent to its
    pod fail until the node lifecycle controller marks the node (its grace period) and the pod
    leaves the Service; the operator surges a replacement then, which serves Ready and warm."""
    from rankops_dev import traffic as traffic_driver
    from rankops_dev.process_nodes import ProcessNode
    from e2e.test_canary_real import _request

    ns, name = real_namespace, "ranker"
    body = models.model_manifest(name, replicas=2, modelCredentialsSecret="model-store",
                                 disruption={"nodeSpread": "required"}, **SPEC)
    other = ProcessNode(cluster.kubeconfig, "process-1", tmp_path / "process-1").start()
    try:
        serve_real_model(k8s, ns, object_store, tmp_path, body)
        on_dead = [p for p in _serving(k8s, ns, name) if p.spec.node_name == other.name]
        assert len(on_dead) == 1, [(p.metadata.name, p.spec.node_name) for p in _serving(k8s, ns, name)]
        dead_pod, dead_ip = on_dead[0].metadata.name, on_dead[0].status.pod_ip
        load = traffic_driver.Traffic(lambda: traffic_driver.serving_addresses(k8s.core, ns, name), name,
                                      lambda rng: _request(rng, False), rate=20, timeout_s=2.0, max_seconds=300)
        load.start()
        try:
            time.sleep(3)
            killed = time.time()
            other.kill()
            marked = wait_for(lambda: dead_pod not in {p.metadata.name for p in _serving(k8s, ns, name)} and time.time(),
                              150, "the dead node's pod out of the Service")
            replaced = wait_for(lambda: len(_serving(k8s, ns, name)) == 2 and all(
                p.spec.node_name == process_node.name for p in _serving(k8s, ns, name)) and time.time(),
                150, "a replacement Ready on the live node")
            time.sleep(3)
        finally:
            load.stop.set()
            load.join(30)
        late = [f for f in load.failures if f[1] > marked + 2 * traffic_driver.REFRESH_S + 2.0]
        print(f"\nnode {other.name} killed: its pod left the Service after {marked - killed:.0f} s (the grace "
              f"period), a replacement was Ready and warm {replaced - marked:.0f} s later "
              f"({replaced - killed:.0f} s after the death); traffic: {load.sent} sent, {load.failed} failed, "
              f"all to {dead_ip}: {all(f[0] == dead_ip for f in load.failures)}")
        assert all(f[0] == dead_ip for f in load.failures), load.failures[:5]   # only the dead node's
        assert not late, late[:5]                       # none once it has left the Service
        assert replaced - marked <= 60, replaced - marked
        rm = models.get(k8s, ns, name)
        assert models.condition(rm, "Ready").get("status") == "True", rm["status"]
        models.wait_event(k8s, ns, name, "MovingReplicas")
    finally:
        other.kill()
        k8s.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, ns, models.PLURAL, name)
        k8s.core.delete_node(other.name)   # its pods are force-deleted by the pod GC
