"""GpuNodePools against a live API server: the validator DaemonSet the operator makes, the verdicts
its pods write, the pool status and columns a user reads, and models placed only on validated nodes.

kwok runs the validator pods but no containers, so each test runs what the pods would
(`rankops_dev.node_validators`): the pod's own command line, against a sample RHEL 8 host,
patching the node with the pod's bound token. The two T4 nodes of the e2e set are the pool; the
L4 and CPU nodes are outside its selector. Pools are cluster-scoped: each test makes its own and
deletes it; the operator then clears the pool's marks from its nodes, and the fixtures clear any
left by a test that failed half-way, so each test starts on nodes without rankops marks.
"""
from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from e2e import models
from e2e.support import gone, wait_for
from rankops.api.gpunodepool import NodeRequirements
from rankops.render import names
from rankops.validator.daemonset import HOST_MOUNTS, HOST_ROOT, validator_name
from rankops_dev.node_validators import HEALTHY, run_validators
from rankops_dev.operator_process import RELEASE_NAMESPACE, VALIDATOR_SERVICE_ACCOUNT
from rankops.validator.node import (ANNOTATION_REPORT, LABEL_CUDA, LABEL_DRIVER, LABEL_DRIVER_BRANCH,
                                    LABEL_DRIVER_MINOR, LABEL_LATENCY_TUNED, LABEL_OS, LABEL_POOL, LABEL_READY,
                                    LABEL_TOPOLOGY_ALIGNED, TAINT_EFFECT, TAINT_KEY)
from rankops.validator.report import requirements_digest
from rankops_dev.sample_hosts import DRIVER, T4_REQUIREMENTS

pytestmark = pytest.mark.usefixtures("operator_logs_no_errors")

GROUP, VERSION, PLURAL = "rankops.io", "v1alpha1", "gpunodepools"
T4 = "Tesla-T4"
SELECTOR = {"nvidia.com/gpu.product": T4}
RANKOPS_LABELS = (LABEL_READY, LABEL_POOL, LABEL_DRIVER, LABEL_CUDA, LABEL_OS, LABEL_DRIVER_BRANCH, LABEL_DRIVER_MINOR,
                  LABEL_LATENCY_TUNED, LABEL_TOPOLOGY_ALIGNED)
TIMEOUT = 60  # the operator re-reads pools every 2 s


@pytest.fixture
def t4_nodes(k8s, gpu_nodes) -> tuple[str, str]:
    """The two T4 nodes, free of rankops marks before and after the test."""
    nodes = gpu_nodes.by_product[T4]
    assert len(nodes) == 2, gpu_nodes
    for node in nodes:
        _clear_node(k8s, node)
    yield nodes
    for node in nodes:
        _clear_node(k8s, node)


@pytest.fixture
def make_pool(request, k8s, operator, t4_nodes):
    """make_pool(taint=True, tag="", **spec) -> the created GpuNodePool over the T4 nodes (unless
    spec.nodeSelector says otherwise); deleted afterwards."""
    created: list[str] = []

    def make(taint: bool = True, tag: str = "", **spec: Any) -> dict:
        """`tag` starts the random suffix: pools created in the same second are ordered by name."""
        slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:30].strip("-")
        name = f"e2e-{slug}-{tag}{secrets.token_hex(3)}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuNodePool", "metadata": {"name": name},
                "spec": {"nodeSelector": SELECTOR, "requirements": T4_REQUIREMENTS,
                         "taintFailingNodes": taint, **spec}}
        created.append(name)
        return k8s.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)

    yield make
    for name in created:
        try:
            k8s.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    # The operator's finalizer must not hold deletion up while it runs.
    for name in created:
        wait_for(lambda: gone(lambda: _pool(k8s, name)), 30, f"GpuNodePool {name} deleted")


# --- helpers ---------------------------------------------------------------------------------

def _pool(k8s, name: str) -> dict:
    return k8s.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)



def _clear_node(k8s, name: str) -> None:
    node = k8s.core.read_node(name)
    patch: dict[str, Any] = {"metadata": {"labels": {k: None for k in RANKOPS_LABELS},
                                          "annotations": {ANNOTATION_REPORT: None}}}
    taints = node.spec.taints or []
    if any(t.key == TAINT_KEY for t in taints):
        patch["spec"] = {"taints": [k8s.api_client.sanitize_for_serialization(t) for t in taints
                                    if t.key != TAINT_KEY]}
    k8s.core.patch_node(name, patch)


def _wait_pool(k8s, name: str, predicate, what: str) -> dict:
    """Wait until predicate(status) holds on a status computed for the pool's current generation."""
    last: dict[str, Any] = {}

    def check():
        pool = last["pool"] = _pool(k8s, name)
        status = pool.get("status") or {}
        return pool if status.get("observedGeneration") == pool["metadata"]["generation"] \
            and predicate(status) else None

    try:
        return wait_for(check, TIMEOUT, f"GpuNodePool {name}: {what}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast status: {json.dumps((last.get('pool') or {}).get('status'))}") from None


def _condition(status: dict, kind: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def _daemonset(k8s, pool: str):
    return wait_for(lambda: k8s.apps.read_namespaced_daemon_set(validator_name(pool), RELEASE_NAMESPACE),
                    TIMEOUT, f"validator DaemonSet of {pool}")


def _validate(cluster, pool: str, hosts: dict[str, str]) -> dict[str, int]:
    """Run the pool's validator pods' work on the simulated hosts; {node: exit code}."""
    return {v.node: v.exit_code for v in run_validators(cluster.kubeconfig, pool, hosts, timeout=TIMEOUT)}


def _node_marks(k8s, name: str) -> tuple[dict[str, str], dict, list[tuple[str, str]]]:
    """(rankops labels, the report annotation parsed, taints as (key, effect))."""
    node = k8s.core.read_node(name)
    labels = {k: v for k, v in (node.metadata.labels or {}).items() if k.startswith("rankops.io/")}
    report = json.loads((node.metadata.annotations or {}).get(ANNOTATION_REPORT, "null"))
    return labels, report, [(t.key, t.effect) for t in node.spec.taints or []]


def _columns(cluster, name: str) -> dict[str, str]:
    """`kubectl get gnp NAME -o wide` as {column: value}: what a user sees."""
    done = subprocess.run([cluster.tool("kubectl"), "get", "gnp", name, "-o", "wide"],
                          env=cluster.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    return dict(zip(header.split(), row.split()))


def _pool_events(k8s, name: str) -> list[Any]:
    selector = f"involvedObject.kind=GpuNodePool,involvedObject.name={name}"
    return k8s.core.list_event_for_all_namespaces(field_selector=selector).items


def _wait_gpus_free(k8s, nodes: tuple[str, ...]) -> None:
    """Pods of earlier tests (namespaces deleted in the background) may still hold the T4 GPUs."""
    def free():
        for node in nodes:
            for pod in k8s.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
                if any((c.resources.limits or {}).get("nvidia.com/gpu") for c in pod.spec.containers):
                    return False
        return True
    wait_for(free, TIMEOUT, f"no pod holding a GPU on {', '.join(nodes)}")


# --- tests -----------------------------------------------------------------------------------

def test_pool_runs_a_read_only_validator_on_exactly_its_nodes(k8s, make_pool, t4_nodes):
    pool = make_pool()
    name = pool["metadata"]["name"]
    ds = _daemonset(k8s, name)

    assert [(r.kind, r.name, r.uid, r.controller) for r in ds.metadata.owner_references or []] == \
        [("GpuNodePool", name, pool["metadata"]["uid"], True)]
    spec = ds.spec.template.spec
    assert spec.node_selector == SELECTOR
    assert spec.service_account_name == VALIDATOR_SERVICE_ACCOUNT
    assert not spec.host_network and not spec.host_pid
    assert any(t.key == TAINT_KEY and t.operator == "Exists" for t in spec.tolerations), \
        "the validator must keep running on the nodes it taints"
    [container] = spec.containers
    # Only the host paths the checks read, each read-only at its place under /host: never the
    # host's / (nor anything holding /var/lib/kubelet/pods).
    host_paths = {v.name: v.host_path.path for v in spec.volumes if v.host_path is not None}
    mounts = {m.name: m for m in container.volume_mounts if m.name in host_paths}
    assert sorted(host_paths.values()) == sorted(path for path, _ in HOST_MOUNTS)
    assert all(m.read_only and m.mount_path == HOST_ROOT + host_paths[name] for name, m in mounts.items())
    assert "/" not in host_paths.values() and len(mounts) == len(host_paths)
    security = container.security_context
    assert security.read_only_root_filesystem and security.run_as_non_root and not security.privileged
    args = container.args
    assert args[args.index("--pool-name") + 1] == name and "--taint-failing-nodes" in args
    requirements = NodeRequirements.model_validate(json.loads(args[args.index("--requirements") + 1]))
    assert requirements_digest(requirements) == \
        requirements_digest(NodeRequirements.model_validate(T4_REQUIREMENTS))

    # kwok runs the pods: one on each T4 node, none on the L4 or CPU nodes.
    selector = ",".join(f"{k}={v}" for k, v in ds.spec.selector.match_labels.items())

    def placed():
        pods = k8s.core.list_namespaced_pod(RELEASE_NAMESPACE, label_selector=selector).items
        nodes = sorted(p.spec.node_name or "" for p in pods if p.status.phase == "Running")
        return nodes if nodes == sorted(t4_nodes) and len(pods) == 2 else None
    wait_for(placed, TIMEOUT, f"validator pods Running on {t4_nodes} only")

    status = _wait_pool(k8s, name, lambda s: s.get("nodes") == 2, "2 nodes matched").get("status")
    assert (status["ready"], status["failing"], status["pending"]) == (0, 0, 2)
    ready = _condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("Unknown", "ValidationPending")

    # A deleted validator comes back by the drift check (DaemonSets are not watched), not at --resync.
    # Settled first: while the pool's first reconciles run, one of them would re-create it anyway.
    time.sleep(15)
    k8s.apps.delete_namespaced_daemon_set(validator_name(name), RELEASE_NAMESPACE)
    wait_for(lambda: (d := k8s.apps.read_namespaced_daemon_set(validator_name(name), RELEASE_NAMESPACE))
             and d.metadata.uid != ds.metadata.uid, 75, f"validator DaemonSet of {name} re-created")


def test_verdicts_taint_failing_nodes_gate_models_and_a_fixed_node_rejoins(cluster, k8s, namespace,
                                                                          make_pool, t4_nodes):
    good, bad = t4_nodes
    name = make_pool()["metadata"]["name"]

    assert _validate(cluster, name, {bad: "nouveau-loaded"}) == {good: 0, bad: 1}

    labels, report, taints = _node_marks(k8s, good)
    assert labels == {LABEL_READY: "true", LABEL_POOL: name, LABEL_DRIVER: DRIVER, LABEL_CUDA: "12.2",
                      LABEL_OS: "rhel-8.9", LABEL_DRIVER_BRANCH: "535", LABEL_DRIVER_MINOR: "104",
                      # latencyTuning: warn (default) labels the base host, which tunes nothing
                      LABEL_LATENCY_TUNED: "false", LABEL_TOPOLOGY_ALIGNED: "unknown"}
    assert report["ready"] is True and report["node"] == good and report["pool"] == name
    assert (TAINT_KEY, TAINT_EFFECT) not in taints
    labels, report, taints = _node_marks(k8s, bad)
    assert labels[LABEL_READY] == "false" and labels[LABEL_POOL] == name
    assert LABEL_DRIVER not in labels, "no nvidia module is loaded: no driver version to show"
    assert report["ready"] is False and "nouveau" in report["blocking"]
    nouveau = next(c for c in report["checks"] if c["id"] == "nouveau")
    assert nouveau["status"] == "fail" and "blacklist" in nouveau["remedy"]
    assert (TAINT_KEY, TAINT_EFFECT) in taints

    status = _wait_pool(k8s, name, lambda s: s.get("pending") == 0, "verdicts counted")["status"]
    assert (status["nodes"], status["ready"], status["failing"]) == (2, 1, 1)
    by_check = {entry["check"]: entry for entry in status["failingByCheck"]}
    assert {"nouveau", "nvidia-module", "nvml"} <= set(by_check)
    assert by_check["nouveau"]["count"] == 1 and by_check["nouveau"]["nodes"] == [bad]
    assert good not in {n for entry in status["failingByCheck"] for n in entry["nodes"]}
    assert (_condition(status, "Ready")["status"], _condition(status, "Ready")["reason"]) == ("True", "NodesReady")
    degraded = _condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NodesFailing") and "nouveau" in degraded["message"]
    columns = _columns(cluster, name)
    assert {k: columns[k] for k in ("NODES", "READY", "FAILING", "PENDING", "TAINT", "DRIVERS", "NEWEST-TRITON")} == \
        {"NODES": "2", "READY": "1", "FAILING": "1", "PENDING": "0", "TAINT": "true", "DRIVERS": DRIVER,
         "NEWEST-TRITON": "25.10"}
    warnings = wait_for(lambda: [e for e in _pool_events(k8s, name) if e.reason == "NodesFailing"],
                        15, "a NodesFailing Event on the pool")
    assert warnings[0].type == "Warning"

    # A model on the pool gets pods on the validated node only, though the failing one has a free GPU.
    _wait_gpus_free(k8s, t4_nodes)
    models.create(k8s, namespace, models.model_manifest("pooled", replicas=2, nodePool=name))
    selector = f"{names.LABEL_MODEL}=pooled"

    def one_placed_one_refused():
        pods = k8s.core.list_namespaced_pod(namespace, label_selector=selector).items
        running = [p.spec.node_name for p in pods if p.status.phase == "Running"]
        refused = [p for p in pods if not p.spec.node_name and any(
            c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])]
        return pods if running == [good] and len(refused) == 1 and len(pods) == 2 else None
    pods = wait_for(one_placed_one_refused, TIMEOUT, f"one pod on {good}, one unschedulable")
    template = k8s.apps.read_namespaced_deployment(names.deployment_name("pooled", names.STABLE), namespace)
    assert template.spec.template.spec.node_selector == {LABEL_POOL: name, LABEL_READY: "true"}
    assert bad not in {p.spec.node_name for p in pods}
    rm = models.get(k8s, namespace, "pooled")
    assert (rm.get("status") or {}).get("phase") != "Ready"

    # The node is fixed (nouveau blacklisted, driver loaded) and re-validated: it rejoins the pool.
    assert _validate(cluster, name, {bad: HEALTHY}) == {good: 0, bad: 0}
    labels, report, taints = _node_marks(k8s, bad)
    assert labels[LABEL_READY] == "true" and labels[LABEL_DRIVER] == DRIVER and report["ready"] is True
    assert (TAINT_KEY, TAINT_EFFECT) not in taints
    status = _wait_pool(k8s, name, lambda s: s.get("ready") == 2, "both nodes ready")["status"]
    assert (status["failing"], status["pending"], status["failingByCheck"]) == (0, 0, [])
    assert (_condition(status, "Degraded")["status"], _condition(status, "Degraded")["reason"]) == \
        ("False", "NoFailingNodes")
    assert _columns(cluster, name)["FAILING"] == "0"
    models.wait_ready(k8s, namespace, "pooled")
    pods = k8s.core.list_namespaced_pod(namespace, label_selector=selector).items
    assert sorted(p.spec.node_name for p in pods) == sorted(t4_nodes)


def test_a_latency_require_pool_labels_only_tuned_nodes_and_pins_models_there(cluster, k8s, namespace,
                                                                              make_pool, t4_nodes):
    """Issue 28: with latencyTuning: require the untuned node is not ready and not aligned; a model
    with latencyIsolation lands only on the tuned node, its pods Guaranteed."""
    tuned, untuned = t4_nodes
    name = make_pool(requirements={**T4_REQUIREMENTS, "latencyTuning": "require"})["metadata"]["name"]

    assert _validate(cluster, name, {tuned: "latency-tuned", untuned: "latency-untuned"}) == {tuned: 0, untuned: 1}
    labels, report, _ = _node_marks(k8s, tuned)
    assert (labels[LABEL_READY], labels[LABEL_LATENCY_TUNED], labels[LABEL_TOPOLOGY_ALIGNED]) == ("true", "true", "true")
    labels, report, taints = _node_marks(k8s, untuned)
    assert (labels[LABEL_READY], labels[LABEL_LATENCY_TUNED], labels[LABEL_TOPOLOGY_ALIGNED]) == \
        ("false", "false", "false")
    assert {"cpu-frequency", "cpu-idle", "tuned", "gpu-clocks", "topology"} <= set(report["blocking"])
    assert (TAINT_KEY, TAINT_EFFECT) in taints
    status = _wait_pool(k8s, name, lambda s: s.get("pending") == 0, "verdicts counted")["status"]
    assert (status["ready"], status["failing"], status["latencyTuned"], status["topologyAligned"]) == (1, 1, 1, 1)
    columns = _columns(cluster, name)
    assert (columns["TUNED"], columns["ALIGNED"], columns["LATENCY"]) == ("1", "1", "require")

    _wait_gpus_free(k8s, t4_nodes)
    models.create(k8s, namespace, models.model_manifest("pinned", replicas=2, nodePool=name, latencyIsolation=True))
    selector = f"{names.LABEL_MODEL}=pinned"

    def one_placed_one_refused():
        pods = k8s.core.list_namespaced_pod(namespace, label_selector=selector).items
        placed = [p.spec.node_name for p in pods if p.spec.node_name]
        return pods if placed == [tuned] and len(pods) == 2 else None
    pods = wait_for(one_placed_one_refused, TIMEOUT, f"one pod on {tuned}, none on {untuned}")
    assert {p.status.qos_class for p in pods} == {"Guaranteed"}  # the API server's verdict, init container included
    template = k8s.apps.read_namespaced_deployment(names.deployment_name("pinned", names.STABLE), namespace)
    assert template.spec.template.spec.node_selector == {LABEL_POOL: name, LABEL_READY: "true",
                                                         LABEL_LATENCY_TUNED: "true", LABEL_TOPOLOGY_ALIGNED: "true"}


def _relabel_driver(k8s, node: str, driver: str) -> None:
    """What the validator writes on a node whose loaded driver is `driver` (the sample hosts all
    have 535.104.05, which runs every release in rankops' table)."""
    branch, minor, _ = driver.split(".")
    k8s.core.patch_node(node, {"metadata": {"labels": {LABEL_DRIVER: driver, LABEL_DRIVER_BRANCH: branch,
                                                       LABEL_DRIVER_MINOR: minor}}})


def test_a_driver_too_old_for_the_triton_image_keeps_pods_off_and_says_so(cluster, k8s, namespace, make_pool,
                                                                          t4_nodes):
    # Issue 16: Triton 24.05 (CUDA 12.4) needs R545, or 525.85+ on R525 on data-center GPUs.
    old, new = t4_nodes
    name = make_pool()["metadata"]["name"]
    assert _validate(cluster, name, {}) == {old: 0, new: 0}
    for node in t4_nodes:
        _relabel_driver(k8s, node, "525.60.13")
    _wait_gpus_free(k8s, t4_nodes)
    image = "nvcr.io/nvidia/tritonserver:24.05-py3"
    models.create(k8s, namespace, models.model_manifest("old-driver", nodePool=name, tritonImage=image))
    rm = models.wait_status(k8s, namespace, "old-driver",
                            lambda r: models.condition(r, "Degraded").get("reason") == "DriverTooOld", "DriverTooOld")
    message = models.condition(rm, "Degraded")["message"]
    assert image in message and f"{old} has 525.60.13" in message and "upgrade the nodes' driver" in message
    selector = f"{names.LABEL_MODEL}=old-driver"

    def unschedulable():
        pods = k8s.core.list_namespaced_pod(namespace, label_selector=selector).items
        return pods if pods and all(not p.spec.node_name and any(
            c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])
            for p in pods) else None
    wait_for(unschedulable, TIMEOUT, "the pod refused by every node (driver too old)")
    # No release in the table runs 525.60.13 (below every listed R525 minimum, 525.85).
    status = _wait_pool(k8s, name, lambda s: s.get("driverVersions") == "525.60.13", "drivers shown")["status"]
    assert status.get("newestTriton") is None

    # One node's driver is upgraded (R550): the pod lands there, and the model is no longer Degraded for it.
    _relabel_driver(k8s, new, "550.54.15")
    pod = wait_for(lambda: next((p for p in k8s.core.list_namespaced_pod(namespace, label_selector=selector).items
                                 if p.spec.node_name), None), TIMEOUT, f"the pod scheduled on {new}")
    assert pod.spec.node_name == new
    models.wait_status(k8s, namespace, "old-driver",
                       lambda r: models.condition(r, "Degraded").get("reason") != "DriverTooOld", "DriverTooOld cleared")


def test_without_taint_a_failing_node_is_only_labelled(cluster, k8s, make_pool, t4_nodes):
    good, bad = t4_nodes
    name = make_pool(taint=False)["metadata"]["name"]
    assert "--taint-failing-nodes" not in _daemonset(k8s, name).spec.template.spec.containers[0].args

    assert _validate(cluster, name, {bad: "selinux-boolean-off"}) == {good: 0, bad: 1}
    labels, report, taints = _node_marks(k8s, bad)
    assert labels[LABEL_READY] == "false" and report["blocking"] == ["selinux"]
    assert (TAINT_KEY, TAINT_EFFECT) not in taints
    status = _wait_pool(k8s, name, lambda s: s.get("pending") == 0, "verdicts counted")["status"]
    assert status["failingByCheck"] == [{"check": "selinux", "count": 1, "nodes": [bad]}]
    assert _columns(cluster, name)["TAINT"] == "false"


def test_changed_requirements_make_old_verdicts_pending_until_revalidated(cluster, k8s, make_pool, t4_nodes):
    name = make_pool()["metadata"]["name"]
    assert set(_validate(cluster, name, {}).values()) == {0}
    _wait_pool(k8s, name, lambda s: s.get("ready") == 2, "both nodes ready")
    digest = _daemonset(k8s, name).spec.template.metadata.annotations["rankops.io/requirements-digest"]

    # Models now need CUDA 12.4; driver 535 supports 12.2. Old verdicts no longer count.
    k8s.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name,
                                           {"spec": {"requirements": {"cudaVersion": "12.4"}}})
    status = _wait_pool(k8s, name, lambda s: s.get("pending") == 2, "old verdicts pending")["status"]
    assert (status["ready"], status["failing"]) == (0, 0)
    assert _condition(status, "Ready")["status"] == "Unknown"
    wait_for(lambda: _daemonset(k8s, name).spec.template.metadata.annotations["rankops.io/requirements-digest"]
             != digest, TIMEOUT, "validator pods rolled to the new requirements")

    assert set(_validate(cluster, name, {}).values()) == {1}  # waits for the DaemonSet's rollout
    for node in t4_nodes:
        labels, report, taints = _node_marks(k8s, node)
        assert labels[LABEL_READY] == "false" and report["blocking"] == ["cuda"]
        assert (TAINT_KEY, TAINT_EFFECT) in taints
    status = _wait_pool(k8s, name, lambda s: s.get("failing") == 2, "both nodes failing on cuda")["status"]
    assert status["failingByCheck"] == [{"check": "cuda", "count": 2, "nodes": sorted(t4_nodes)}]
    ready = _condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NoReadyNodes") and "cuda" in ready["message"]


def test_deleting_the_pool_clears_its_marks_and_nothing_else(cluster, k8s, gpu_nodes, make_pool, t4_nodes):
    good, bad = t4_nodes
    other = next(n for n in gpu_nodes.gpu if n not in t4_nodes)  # outside the pool's selector
    # Marks that are not the pool's: a user's label, annotation and taint on the pool's nodes
    # (PreferNoSchedule, so the validator pods still land there), and another pool's on a node outside
    # this one's selector.
    keep_taint = {"key": "e2e.rankops.io/keep", "value": "yes", "effect": "PreferNoSchedule"}
    other_marks = {LABEL_POOL: "some-other-pool", LABEL_READY: "false"}
    try:
        for node in t4_nodes:
            taints = [k8s.api_client.sanitize_for_serialization(t) for t in k8s.core.read_node(node).spec.taints or []]
            k8s.core.patch_node(node, {"metadata": {"labels": {"e2e.rankops.io/keep": "yes"},
                                                    "annotations": {"e2e.rankops.io/keep": "yes"}},
                                       "spec": {"taints": taints + [keep_taint]}})
        k8s.core.patch_node(other, {"metadata": {"labels": other_marks}, "spec": {"taints": [
            *[k8s.api_client.sanitize_for_serialization(t) for t in k8s.core.read_node(other).spec.taints or []],
            {"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT}]}})
        before = {node: k8s.core.read_node(node) for node in t4_nodes}

        pool = make_pool()
        name = pool["metadata"]["name"]
        assert _validate(cluster, name, {bad: "nouveau-loaded"}) == {good: 0, bad: 1}
        assert _node_marks(k8s, bad)[0][LABEL_POOL] == name and (TAINT_KEY, TAINT_EFFECT) in _node_marks(k8s, bad)[2]
        assert _node_marks(k8s, good)[0][LABEL_READY] == "true"

        k8s.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        # The operator's finalizer holds the pool until its validators are gone and its marks cleared.
        wait_for(lambda: gone(lambda: _pool(k8s, name)), TIMEOUT, f"GpuNodePool {name} deleted")
        assert gone(lambda: k8s.apps.read_namespaced_daemon_set(validator_name(name), RELEASE_NAMESPACE))

        for node in t4_nodes:
            labels, report, taints = _node_marks(k8s, node)
            assert (labels, report) == ({}, None), node
            assert (TAINT_KEY, TAINT_EFFECT) not in taints
            now, was = k8s.core.read_node(node), before[node]
            assert now.metadata.labels == was.metadata.labels, "every other label untouched"
            assert now.metadata.annotations == was.metadata.annotations, "every other annotation untouched"
            assert [k8s.api_client.sanitize_for_serialization(t) for t in now.spec.taints or []] == \
                [k8s.api_client.sanitize_for_serialization(t) for t in was.spec.taints or []], "other taints, in order"
        labels, _, taints = _node_marks(k8s, other)
        assert labels == other_marks and (TAINT_KEY, TAINT_EFFECT) in taints, "another pool's node is left alone"
    finally:
        _clear_node(k8s, other)
        for node in (*t4_nodes, other):
            current = k8s.core.read_node(node)
            patch: dict[str, Any] = {"metadata": {"labels": {"e2e.rankops.io/keep": None},
                                                  "annotations": {"e2e.rankops.io/keep": None}}}
            if any(t.key == keep_taint["key"] for t in current.spec.taints or []):
                patch["spec"] = {"taints": [k8s.api_client.sanitize_for_serialization(t)
                                            for t in current.spec.taints if t.key != keep_taint["key"]]}
            k8s.core.patch_node(node, patch)


def test_a_validator_pods_token_may_mark_its_own_node_only(cluster, k8s, gpu_nodes, make_pool, t4_nodes):
    """The chart's default (validator.restrictToOwnNode) binds the validator's node writes to the
    node of the pod its token is bound to: a token leaked from one node's validator pod cannot
    mark, untaint, taint or cordon any other node."""
    from kubernetes import client

    from rankops_dev.cluster import api_client
    from rankops_dev.node_validators import plan_runs, pod_client, wait_for_pods

    own, other_in_pool = t4_nodes
    outside = next(n for n in gpu_nodes.gpu if n not in t4_nodes)
    name = make_pool()["metadata"]["name"]
    admin = api_client(cluster.kubeconfig)
    try:
        [run] = [r for r in plan_runs(wait_for_pods(admin, validator_name(name), RELEASE_NAMESPACE, TIMEOUT), {})
                 if r.node == own]
        as_pod = pod_client(admin, run, RELEASE_NAMESPACE)
    finally:
        admin.close()
    nodes = client.CoreV1Api(as_pod)

    def refused(node: str, patch: dict) -> bool:
        try:
            nodes.patch_node(node, patch)
        except ApiException as exc:
            assert exc.status in (403, 422), exc.body
            return True
        return False

    taint = {"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT}
    try:
        for node in (other_in_pool, outside):
            before = k8s.core.read_node(node)
            assert refused(node, {"metadata": {"labels": {LABEL_READY: "true", LABEL_POOL: name}}}), node
            assert refused(node, {"spec": {"taints": [taint]}}), node
            assert refused(node, {"spec": {"unschedulable": True}}), node
            after = k8s.core.read_node(node)
            assert after.metadata.resource_version == before.metadata.resource_version, f"{node} changed"
        # Its own node: rankops.io marks and the rankops taint, as the validator writes them; no cordon.
        assert not refused(own, {"metadata": {"labels": {LABEL_READY: "false", LABEL_POOL: name}}})
        assert not refused(own, {"spec": {"taints": [
            *[k8s.api_client.sanitize_for_serialization(t) for t in k8s.core.read_node(own).spec.taints or []], taint]}})
        assert (TAINT_KEY, TAINT_EFFECT) in _node_marks(k8s, own)[2]
        assert refused(own, {"spec": {"unschedulable": True}})
        assert refused(own, {"metadata": {"labels": {"team": "mine-now"}}})
    finally:
        as_pod.close()


@pytest.fixture
def unmarked_nodes(k8s, gpu_nodes):
    """Every e2e node free of rankops marks after the test (for pools beyond the T4 nodes)."""
    yield
    for node in (*gpu_nodes.gpu, *gpu_nodes.cpu):
        _clear_node(k8s, node)


def test_a_pool_selecting_every_node_marks_only_gpu_nodes(cluster, k8s, gpu_nodes, make_pool, unmarked_nodes):
    """A broad selector catches the CPU node and a control-plane node: neither is validated into
    the pool nor tainted (before: the CPU node was labelled into the pool and tainted)."""
    from rankops.validator.node import NOT_OWNED
    from rankops_dev.nodes import SHAPES, gpu_node

    control_plane = gpu_node(f"kwok-cp-{secrets.token_hex(2)}", SHAPES["cpu"])
    control_plane["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = ""
    control_plane["spec"]["taints"] = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    cp = control_plane["metadata"]["name"]
    k8s.core.create_node(control_plane)
    try:
        [cpu] = gpu_nodes.cpu
        pool = make_pool(nodeSelector={"type": "kwok"})   # every simulated node
        name = pool["metadata"]["name"]
        # The CPU node's (simulated) host fails, which taints a GPU node of the pool: not this one.
        codes = _validate(cluster, name, {cpu: "nouveau-loaded"})
        assert codes == {**{node: 0 for node in gpu_nodes.gpu}, cpu: NOT_OWNED}, codes
        labels, report, taints = _node_marks(k8s, cpu)
        assert (labels, report) == ({}, None) and (TAINT_KEY, TAINT_EFFECT) not in taints
        labels, _, taints = _node_marks(k8s, cp)
        assert labels == {} and (TAINT_KEY, TAINT_EFFECT) not in taints
        for node in gpu_nodes.gpu:
            assert _node_marks(k8s, node)[0][LABEL_POOL] == name

        status = _wait_pool(k8s, name, lambda s: s.get("pending") == 0 and s.get("excluded") == 2,
                            "GPU nodes counted, CPU and control-plane nodes excluded")["status"]
        assert (status["nodes"], status["ready"]) == (len(gpu_nodes.gpu), len(gpu_nodes.gpu))
        without = _condition(status, "NodesWithoutGpus")
        assert (without["status"], without["reason"]) == ("True", "NoGpuCapacity")
        assert without["message"].startswith(f"{', '.join(sorted([cpu, cp]))}: no nvidia.com/gpu capacity")
        assert _columns(cluster, name)["EXCLUDED"] == "2"
    finally:
        k8s.core.delete_node(cp)


def test_two_pools_over_the_same_nodes_leave_them_to_the_older_one(cluster, k8s, namespace, gpu_nodes, make_pool,
                                                                   t4_nodes, unmarked_nodes):
    """The T4 nodes are in an older T4 pool and a newer all-GPU pool. Only the older one marks
    them; both say so; a model of the older pool is served there (before: the pools relabelled
    and retainted the nodes in turn, and the model went Pending)."""
    from rankops.validator.node import NOT_OWNED

    good, bad = t4_nodes
    older = make_pool(tag="a")["metadata"]["name"]
    newer = make_pool(tag="b", nodeSelector={"nvidia.com/gpu.present": "true"})["metadata"]["name"]
    others = tuple(n for n in gpu_nodes.gpu if n not in t4_nodes)

    assert _validate(cluster, older, {bad: "nouveau-loaded"}) == {good: 0, bad: 1}
    marks = {node: _node_marks(k8s, node) for node in t4_nodes}
    # The newer pool's validators find every host healthy; they still leave the T4 nodes alone.
    codes = _validate(cluster, newer, {})
    assert codes == {good: NOT_OWNED, bad: NOT_OWNED, **{n: 0 for n in others}}, codes
    for node in t4_nodes:
        labels, report, taints = _node_marks(k8s, node)
        assert labels[LABEL_POOL] == older and labels == marks[node][0] and taints == marks[node][2], node
    assert (TAINT_KEY, TAINT_EFFECT) in _node_marks(k8s, bad)[2], "the older pool's taint stays"
    assert _validate(cluster, older, {bad: "nouveau-loaded"}) == {good: 0, bad: 1}  # and once more: no fight

    status = _wait_pool(k8s, older, lambda s: _condition(s, "Overlapping").get("status") == "True"
                        and s.get("pending") == 0, "the older pool reports the overlap")["status"]
    assert (status["nodes"], status["ready"], status["failing"], status["excluded"]) == (2, 1, 1, 0)
    overlap = _condition(status, "Overlapping")
    assert overlap["reason"] == "SharesNodesWithNewerPool"
    assert f"GpuNodePool {newer} (newer) also selects {', '.join(sorted(t4_nodes))}" in overlap["message"]
    status = _wait_pool(k8s, newer, lambda s: _condition(s, "Overlapping").get("status") == "True"
                        and s.get("pending") == 0, "the newer pool reports the overlap")["status"]
    assert (status["nodes"], status["ready"], status["excluded"]) == (len(others), len(others), 2)
    overlap = _condition(status, "Overlapping")
    assert overlap["reason"] == "SharesNodesWithOlderPool"
    assert f"GpuNodePool {older} (older) also selects {', '.join(sorted(t4_nodes))} and validates them" \
        in overlap["message"]
    assert wait_for(lambda: [e for e in _pool_events(k8s, newer) if e.reason == "SharesNodesWithOlderPool"],
                    15, "a SharesNodesWithOlderPool Event")[0].type == "Warning"

    _wait_gpus_free(k8s, t4_nodes)
    models.create(k8s, namespace, models.model_manifest("older-pool", nodePool=older))
    models.wait_ready(k8s, namespace, "older-pool")
    [pod] = k8s.core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_MODEL}=older-pool").items
    assert pod.spec.node_name == good
