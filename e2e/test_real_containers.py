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


def _infer_job(real: RealCluster, k8s: Any, ns: str, command: list[str]) -> str:
    """Run `command` in a Job `infer` from the operator image (a client pod of the cluster); its
    output, after checking it succeeded."""
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
    return output


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
    output = _infer_job(real, k8s, ns, command)
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


# --- issue 42: a shared Triton server on real containers ------------------------------------------

SHARED_NS, SERVER = "shared", "ranking"
SHARED_MEMBERS = {"coarse": ([8], [4], 128), "fine": ([16], [8], 64), "rerank": ([32], [24], 32)}


def _shared_member(real: RealCluster, name: str) -> dict:
    user, item, max_batch = SHARED_MEMBERS[name]
    return models.model_manifest(
        name, server=SERVER, modelCredentialsSecret="model-store", tritonImage=real.refs["rankops-triton-test"],
        replicas=2, versions=("1",), candidates={"layout": "batch", "minPerRequest": 1, "maxPerRequest": max_batch},
        inputs=[{"name": "user_features", "dataType": "FP32", "dims": user},
                {"name": "item_features", "dataType": "FP32", "dims": item}],
        batching={"maxBatchSize": max_batch, "preferredBatchSizes": [max_batch], "maxQueueDelayMicroseconds": 500},
        warmReplicas={"enabled": False}, slo={"p99LatencyMs": 100, "targetQps": 10},
        planning={"latencyProfile": {1: 1.0, max_batch: 4.0},
                  "memory": {"weightsMiB": 500, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}})


def server_replicas(k8s: Any, ns: str) -> int:
    return k8s.apps.read_namespaced_deployment(names.server_name(SERVER), ns).spec.replicas


def test_a_shared_server_serves_each_member_on_its_own_service(real: RealCluster, k8s: Any,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """Three RankingModels naming one SharedServer, on real containers, all by the operator (its
    pod, from the operator image): the server's Deployment runs its three containers, `stage`
    fetches each member from the real S3 server with the server's credentials Secret, the operator
    reads each pod's repository index and loads the members into the running Triton (the test
    image's shim makes its one CPU edit to those loads), writes each one's line and EndpointSlice,
    and each member says Ready. Each answers through its own Service name and only there."""
    from e2e.conftest import real_operator_log
    from rankops.api.crdgen import GROUP, VERSION
    from rankops.api.rankingmodel import RankingModel

    ns = SHARED_NS
    k8s.core.create_namespace({"metadata": {"name": ns, "annotations": pinned_to_real_nodes()}})
    wait_until(lambda: _has_default_account(k8s, ns), 30, f"ServiceAccount default in {ns}")
    k8s.core.create_namespaced_secret(ns, real.store.secret_manifest("model-store", ns))
    specs = {}
    for name in SHARED_MEMBERS:
        body = _shared_member(real, name)
        specs[name] = RankingModel.model_validate({**body, "metadata": {"name": name, "namespace": ns}}).spec
        directory = tmp_path_factory.mktemp(f"shared-{name}") / "1"
        spec_models.export(specs[name], ModelFormat.onnx, directory)
        real.store.upload_tree(BUCKET, f"{name}/1", directory)
    k8s.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sharedservers", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharedServer", "metadata": {"name": SERVER},
        "spec": {"gpuMemoryMiB": 15360, "tritonImage": real.refs["rankops-triton-test"],
                 "fetcherImage": real.refs["rankops-operator"], "modelCredentialsSecret": "model-store",
                 "resources": {"cpu": "500m", "memory": "1Gi"},
                 # the operator reads each pod's metrics page (the pod network, the server's NetworkPolicy)
                 "autoscaling": {"enabled": True}}})
    for name in SHARED_MEMBERS:
        models.create(k8s, ns, _shared_member(real, name))

    def lines() -> dict[str, dict]:
        server = k8s.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sharedservers", SERVER)
        return {m["name"]: m for m in (server.get("status") or {}).get("members") or []}
    try:
        wait_until(lambda: len(lines()) == 3 and all(m["state"] == "Serving" for m in lines().values()),
                   READY_TIMEOUT, "every member Serving on the shared server")
        for name in SHARED_MEMBERS:
            models.wait_ready(k8s, ns, name, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nmembers: {json.dumps(lines(), indent=1)[:3000]}\n{real.diagnostics(ns)}\n"
                             f"operator log (tail):\n{real_operator_log(real)[-6000:]}") from None
    assert not any(m["state"] == "Failed" for m in lines().values())
    pods = [p for p in k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_SERVER}={SERVER}").items
            if p.status.phase == "Running"]
    server = k8s.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sharedservers", SERVER)
    # the cards they need together; one may wait for a GPU the module's other tests hold
    assert 1 <= len(pods) <= server["status"]["replicas"], (len(pods), server["status"])
    for pod in pods:
        assert {c.name: c.container_id.startswith("containerd://") for c in pod.status.container_statuses} == \
            {"triton": True, "route": True, "stage": True}
    deployments = [d.metadata.name for d in k8s.apps.list_namespaced_deployment(ns).items]
    assert deployments == [names.server_name(SERVER)], "the members run no pods of their own"

    # One Job from the operator image: each member through its own Service name (cluster DNS,
    # kube-proxy, the EndpointSlice the plan wrote), then coarse's Service asked for fine: refused.
    def infer(service: str, model: str) -> str:
        spec = specs[model]
        inputs = json.dumps([t.to_wire() for t in spec.inputs], separators=(",", ":"))
        return (f"rankops infer --url {service}.{ns}.svc:8000 --model {model} --candidates 5 "
                f"--inputs-spec '{inputs}'")
    script = " && ".join([*(infer(m, m) for m in SHARED_MEMBERS), f"! {infer('coarse', 'fine')}"])
    output = _infer_job(real, k8s, ns, ["sh", "-c", script])
    for name in SHARED_MEMBERS:
        assert f"{name} at {name}.{ns}.svc:8000: 5 candidates scored" in output, output
    for pod in pods:
        after = k8s.core.read_namespaced_pod(pod.metadata.name, ns)
        assert all(c.restart_count == 0 for c in after.status.container_statuses), after.status.container_statuses

    # spec.autoscaling: the operator reads each ready pod's Triton metrics (port 8002 through the server's
    # NetworkPolicy) and has a rate for every member; every pod read, none named as not read
    def scaling() -> dict:
        found = k8s.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sharedservers", SERVER)
        return (found.get("status") or {}).get("autoscaling") or {}
    wait_until(lambda: set(scaling().get("observedQps") or {}) == set(SHARED_MEMBERS), 60,
               "a rate for every member in status.autoscaling")
    assert "not read" not in scaling().get("message", ""), scaling()
    assert scaling()["desiredReplicas"] == server_replicas(k8s, ns), scaling()

    # coarse 1 -> 2 switched inside the running server pods (server_switch.py) while requests run through
    # its own port: 2 staged beside 1 by each pod's stager from S3, loaded beside it in one pod, gated
    # there by the operator (warm-up; equivalence against 1 in the same pod), loaded in the others, 1 unloaded
    _switch_a_member_in_place(real, k8s, ns, specs["coarse"], tmp_path_factory, lines)


def _switch_a_member_in_place(real: RealCluster, k8s: Any, ns: str, spec: RankingModelSpec,
                              tmp_path_factory: pytest.TempPathFactory, lines: Any) -> None:
    from rankops.api.crdgen import GROUP, VERSION
    from rankops.triton.samples import Sample
    from rankops_dev import traffic

    directory = tmp_path_factory.mktemp("shared-coarse") / "2"
    spec_models.export(spec, ModelFormat.onnx, directory)          # the same weights: equivalent
    real.store.upload_tree(BUCKET, "coarse/2", directory)
    template = k8s.apps.read_namespaced_deployment(names.server_name(SERVER), ns).spec.template.to_dict()
    port = lines()["coarse"]["port"]

    def addresses() -> list[str]:
        """What coarse's Service sends to: its EndpointSlice's ready endpoints (a pod that starts mid-switch
        joins once it serves coarse)."""
        found = k8s.custom.get_namespaced_custom_object("discovery.k8s.io", "v1", ns, "endpointslices",
                                                        "coarse-shared")
        return sorted(a for e in found.get("endpoints") or [] if (e.get("conditions") or {}).get("ready")
                      for a in e.get("addresses") or [])
    sender = traffic.Traffic(addresses, "coarse", lambda rng: Sample(
        line=1, inputs=spec_models.request_arrays(spec, candidates=5, seed=int(rng.integers(1 << 30)))),
        netns=real.netns, port=port, rate=20)
    sender.start()
    held = _shared_member(real, "coarse")["spec"]["versions"]         # as created: nothing else of it changes
    try:
        time.sleep(2)        # the held version's P99 in Triton's window before the first load
        models.patch_spec(k8s, ns, "coarse", {
            "version": "2", "versions": [*held, {**held[0], "name": "2", "modelUri": f"s3://{BUCKET}/coarse/2"}],
            "rollout": {"warmup": {"requests": 100, "concurrency": 2, "maxP99Ms": 2000}}})
        wait_until(lambda: (lines()["coarse"].get("switch") or {}).get("phase") in ("Switched", "RolledBack",
                                                                                     "FellBack"),
                   240, "coarse's switch to 2 ended")
    except AssertionError as exc:
        from e2e.conftest import real_operator_log
        raise AssertionError(f"{exc}\ncoarse: {json.dumps(lines()['coarse'], indent=1)}\n"
                             f"operator log (tail):\n{real_operator_log(real)[-6000:]}") from None
    finally:
        sender.stop.set()
        sender.join(30)
    line = lines()["coarse"]
    print(f"\ncoarse: {line['switch']['message']}; {sender.sent} requests, {sender.failed} failed")
    assert line["switch"]["phase"] == "Switched" and line["version"] == "2" and line["state"] == "Serving", line
    assert sender.sent > 20 and sender.failed == 0, sender.failures[:5]
    assert k8s.apps.read_namespaced_deployment(names.server_name(SERVER), ns).spec.template.to_dict() == template
    for pod in _running_server_pods(k8s, ns):
        assert all(c.restart_count == 0 for c in pod.status.container_statuses), pod.metadata.name
    models.wait_ready(k8s, ns, "coarse", timeout=60)
    # the evidence it was promoted on, on the member's own status: both gates passed on the gate pod
    def gates() -> set[tuple[str, str, str]]:
        own = k8s.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "rankingmodels", "coarse")
        return {(g["gate"], g["version"], g["outcome"]) for g in (own.get("status") or {}).get("gates") or []}
    wait_until(lambda: gates() == {("warmup", "2", "pass"), ("equivalence", "2", "pass")}, 30,
               "coarse's own status.gates: both gates passed on 2")


def _running_server_pods(k8s: Any, ns: str) -> list[Any]:
    return [p for p in k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_SERVER}={SERVER}").items
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None and p.status.pod_ip]
