"""Pods in real containers (issue 38): the images built on this machine, run by a real kubelet.

The module starts its own cluster (rankops_dev/real_cluster.py): the control plane, one real
node (kubelet, containerd, runc, CNI, kube-proxy, cluster DNS) and an S3 server, all in a network
namespace the dev cluster makes. The chart's operator runs as the chart's pod from the operator
image; a RankingModel's Triton pod runs the Triton test image, its fetch-model init container the
operator image, and a Job sends a request through the model's Service name. What only a real
runtime can make true is asserted from the host's /proc: container IDs of containerd, a non-root
UID in a PID namespace of its own, no capabilities, a read-only root filesystem, a container the
kubelet restarts when its liveness probe fails.

Needs root, Debian's containerd runc containernetworking-plugins iptables conntrack dnsmasq-base,
and the image archives (`rankops dev images --export $RANKOPS_IMAGES_DIR`); `.ci/run` provides
them. A missing part fails the module's set-up, it does not skip.
"""
from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from e2e import models
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.render import names
from rankops_dev import spec_models
from rankops_dev.real_cluster import RealCluster, pinned_to_real_nodes, process_facts, wait_until

BUCKET = "models"
OPERATOR_NAMESPACE = "rankops-system"
pytestmark = pytest.mark.usefixtures("real_operator_logs_no_errors")
READY_TIMEOUT = 240
PRODUCT_UID = 1001   # images/Dockerfile's USER
TRITON_UID = 1000    # the rendered Triton container's runAsUser


@pytest.fixture(scope="module")
def k8s(real_k8s: Any) -> Any:
    return real_k8s


@pytest.fixture(scope="module")
def served(real: RealCluster, k8s: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One RankingModel served on the real node: its namespace, name and the time to Ready."""
    ns, name = "reco", "ranker"
    k8s.core.create_namespace({"metadata": {"name": ns, "annotations": pinned_to_real_nodes()}})
    wait_until(lambda: _has_default_account(k8s, ns), 30, f"ServiceAccount default in {ns}")
    assert real.store is not None
    k8s.core.create_namespaced_secret(ns, real.store.secret_manifest("model-store", ns))
    body = models.model_manifest(name, version="1", modelCredentialsSecret="model-store",
                                 tritonImage=real.refs["rankops-triton-test"],
                                 resources={"cpu": "500m", "memory": "1Gi"})
    body["spec"]["versions"][0]["precision"] = "fp32"
    spec = RankingModelSpec.model_validate(body["spec"])
    directory = tmp_path_factory.mktemp("artifact") / "1"
    spec_models.export(spec, ModelFormat.onnx, directory)
    real.store.upload_tree(BUCKET, f"{name}/1", directory)
    created = time.monotonic()
    models.create(k8s, ns, body)
    try:
        models.wait_ready(k8s, ns, name, timeout=READY_TIMEOUT)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{real.diagnostics(ns)}\n--- operator\n"
                             f"{real.diagnostics(OPERATOR_NAMESPACE)}") from None
    ready_s = time.monotonic() - created
    print(f"\nRankingModel {ns}/{name}: create -> Ready {ready_s:.1f}s on real containers")
    return {"namespace": ns, "name": name, "ready_s": ready_s}


def _has_default_account(k8s: Any, ns: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        k8s.core.read_namespaced_service_account("default", ns)
        return True
    except ApiException:
        return False


def _serving_pod(k8s: Any, ns: str, name: str) -> Any:
    pods = [p for p in k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_MODEL}={name}").items
            if p.metadata.deletion_timestamp is None and p.status.phase == "Running"]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def _container(pod: Any, name: str) -> Any:
    return next(c for c in pod.status.container_statuses if c.name == name)


def _assert_confined(facts: dict | None, uid: int, what: str) -> None:
    assert facts is not None, f"no process of {what} found under its container's cgroup"
    assert facts["uid"] == uid, (what, facts)
    assert facts["pidns"] != facts["host_pidns"], (what, facts)      # a PID namespace of its own
    assert facts["cap_eff"] == 0, (what, facts)                      # every capability dropped
    assert "ro" in facts["root_mount_options"], (what, facts)        # readOnlyRootFilesystem


def test_the_operator_runs_as_the_charts_pod_from_its_image(real: RealCluster, k8s: Any) -> None:
    pods = k8s.core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/instance=rankops").items
    operator = [p for p in pods if p.status.phase == "Running"]
    assert len(operator) == 1, [(p.metadata.name, p.status.phase) for p in pods]
    pod = operator[0]
    assert pod.spec.node_name == real.node_name
    container = pod.status.container_statuses[0]
    assert container.image == real.refs["rankops-operator"] and container.ready, container
    assert container.container_id.startswith("containerd://"), container.container_id
    _assert_confined(process_facts(container.container_id, None), PRODUCT_UID, "the operator")


def test_a_model_serves_from_triton_containers_and_answers_through_its_service(
        real: RealCluster, k8s: Any, served: dict[str, Any]) -> None:
    ns, name = served["namespace"], served["name"]
    pod = _serving_pod(k8s, ns, name)
    assert pod.spec.node_name == real.node_name and not pod.status.pod_ip.startswith("127."), pod.status.pod_ip
    fetch = pod.status.init_container_statuses[0]
    assert (fetch.name, fetch.state.terminated.exit_code) == ("fetch-model", 0), fetch
    assert fetch.image == real.refs["rankops-operator"] and fetch.container_id.startswith("containerd://")
    triton = _container(pod, "triton")
    assert triton.image == real.refs["rankops-triton-test"], triton.image
    assert triton.container_id.startswith("containerd://"), triton.container_id
    _assert_confined(process_facts(triton.container_id, "tritonserver"), TRITON_UID, "tritonserver")
    log = real.logs(ns, pod.metadata.name, "triton")
    assert f"successfully loaded '{name}'" in log, log[-3000:]

    # A Job from the operator image sends one request through the Service name (cluster DNS,
    # kube-proxy), as the demo does.
    spec = models.get(k8s, ns, name)["spec"]
    command = ["rankops", "infer", "--url", f"{names.serving_service_name(name)}.{ns}.svc:8000", "--model", name,
               "--candidates", "20", "--inputs-spec", json.dumps(spec["inputs"], separators=(",", ":"))]
    k8s.batch.create_namespaced_job(ns, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "infer"},
                                         "spec": {"backoffLimit": 0, "template": {"spec": {
                                             "restartPolicy": "Never", "containers": [{
                                                 "name": "infer", "image": real.refs["rankops-operator"],
                                                 "imagePullPolicy": "Never", "command": command}]}}}})
    def finished() -> Any:
        status = k8s.batch.read_namespaced_job("infer", ns).status
        return status if status.succeeded or status.failed else None

    status = wait_until(finished, 120, "the infer Job")
    job_pod = k8s.core.list_namespaced_pod(ns, label_selector="job-name=infer").items[0]
    output = real.logs(ns, job_pod.metadata.name, "infer")
    print(f"\n{output}")
    assert status.succeeded == 1, output
    assert f"{name} at {names.serving_service_name(name)}.{ns}.svc:8000: 20 candidates scored" in output, output


def test_a_failed_liveness_probe_restarts_the_triton_container(real: RealCluster, k8s: Any,
                                                                served: dict[str, Any]) -> None:
    ns, name = served["namespace"], served["name"]
    pod = _serving_pod(k8s, ns, name)
    triton = _container(pod, "triton")
    facts = process_facts(triton.container_id, "tritonserver")
    assert facts is not None
    os.kill(facts["pid"], signal.SIGSTOP)  # alive to the kernel, deaf to its probes
    try:
        restarted = wait_until(
            lambda: (c := _container(k8s.core.read_namespaced_pod(pod.metadata.name, ns), "triton")).restart_count >= 1
            and c, 180, "the kubelet to restart the stopped Triton container")
    finally:
        try:
            os.kill(facts["pid"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert restarted.container_id != triton.container_id
    events = [e.reason for e in k8s.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={pod.metadata.name}").items]
    assert "Unhealthy" in events and "Killing" in events, events
    wait_until(lambda: _container(k8s.core.read_namespaced_pod(pod.metadata.name, ns), "triton").ready, 180,
               "the restarted Triton container Ready")
    models.wait_ready(k8s, ns, name, timeout=120)
