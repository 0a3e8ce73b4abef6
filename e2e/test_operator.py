"""The operator against a live API server: what `kubectl apply -f rankingmodel.yaml` gives.

The operator runs as a local process with the chart's ServiceAccount (fixture `operator`):
children with owner references, pods on GPU nodes, Ready with the printer columns a user
reads, edits rolled out, drift repaired, deletion collected, restarts converged, and bad
input refused (by the API server) or reported (by the operator) without touching what serves.
"""
from __future__ import annotations

import subprocess
import time

import pytest
import yaml

from e2e import models
from e2e.support import gone, wait_for
from rankops.commands.render import render_documents
from rankops.render import names

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")


def _deployment(k8s, namespace: str, model: str, track: str = names.STABLE):
    return k8s.apps.read_namespaced_deployment(names.deployment_name(model, track), namespace)


def _children(k8s, namespace: str, model: str) -> dict[str, object]:
    return {
        "ConfigMap": k8s.core.read_namespaced_config_map(names.config_map_name(model, names.STABLE), namespace),
        "Deployment": _deployment(k8s, namespace, model),
        "Service": k8s.core.read_namespaced_service(names.serving_service_name(model), namespace),
    }


def _kubectl_apply(cluster, namespace: str, body: dict) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cluster.tool("kubectl"), "apply", "--server-side", "-n", namespace, "-f", "-"],
                          input=yaml.safe_dump(body), env=cluster.env, capture_output=True, text=True,
                          timeout=30)


BAD_SPECS = [
    pytest.param({"version": "9"}, "version", id="version-not-in-versions"),
    pytest.param({"replicas": -1}, "spec.replicas", id="negative-replicas"),
    pytest.param({"batching": {"maxBatchSize": 8, "preferredBatchSizes": [16]}}, "preferredBatchSizes",
                 id="preferred-above-max"),
    pytest.param({"batching": "fast"}, "batching", id="batching-word"),
    pytest.param({"inputs": [{"name": "x", "dataType": "FP32", "dims": [-1]}]}, "maxDims", id="dynamic-dim-without-max"),
    pytest.param({"versions": [{"name": "1", "modelUri": "ftp://x/1", "format": "onnx"}]}, "modelUri",
                 id="unsupported-uri"),
]


@pytest.mark.parametrize("override, field", BAD_SPECS)
def test_api_server_rejects_bad_models_naming_the_field(cluster, k8s, namespace, operator, override, field):
    body = models.model_manifest("bad", **override)
    done = _kubectl_apply(cluster, namespace, body)
    assert done.returncode != 0, f"accepted: {override}"
    assert field in done.stderr, done.stderr
    assert gone(lambda: models.get(k8s, namespace, "bad"))


def test_model_without_pool_serves_with_owned_children_and_true_columns(cluster, k8s, namespace, operator, gpu_nodes):
    body = models.model_manifest("ctr", replicas=2, instancesPerGpu=2)
    created = models.create(k8s, namespace, body)
    rm = models.wait_ready(k8s, namespace, "ctr")

    children = _children(k8s, namespace, "ctr")
    for kind, child in children.items():
        refs = child.metadata.owner_references or []
        assert [(r.kind, r.name, r.uid, r.controller) for r in refs] == \
            [("RankingModel", "ctr", created["metadata"]["uid"], True)], kind
    # The ConfigMap is exactly what `rankops render` makes of the object the server stored.
    rendered = render_documents([("server", models.get(k8s, namespace, "ctr"))])
    expected = next(o for o in rendered if o["kind"] == "ConfigMap")
    assert children["ConfigMap"].data == expected["data"]
    assert "count: 2" in children["ConfigMap"].data["config.pbtxt"]

    pods = k8s.core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_MODEL}=ctr").items
    assert len(pods) == 2 and all(p.spec.node_name in gpu_nodes.gpu for p in pods), \
        [(p.metadata.name, p.spec.node_name) for p in pods]
    container = next(c for c in pods[0].spec.containers if c.name == "triton")
    assert container.resources.limits["nvidia.com/gpu"] == "1"

    status = rm["status"]
    assert status["stableVersion"] == "1" and status["readyReplicas"] == 2 and status["ready"] == "2/2"
    assert models.condition(rm, "Degraded")["status"] == "False"
    columns = models.printer_columns(cluster, namespace, "ctr")
    assert {k: columns[k] for k in ("STABLE", "PHASE", "READY", "VERSION")} == \
        {"STABLE": "1", "PHASE": "Ready", "READY": "2/2", "VERSION": "1"}
    # The one event of the NotReady -> Ready flip.
    ready_events = models.wait_event(k8s, namespace, "ctr", "Ready")
    assert len(ready_events) == 1 and ready_events[0].count in (None, 1), ready_events


def test_spec_edit_is_rolled_out(k8s, namespace, operator):
    models.create(k8s, namespace, models.model_manifest("edit"))
    models.wait_ready(k8s, namespace, "edit")
    before = _deployment(k8s, namespace, "edit").spec.template.metadata.annotations or {}

    models.patch_spec(k8s, namespace, "edit", {"replicas": 2, "batching": {
        "maxBatchSize": 1024, "preferredBatchSizes": [256, 512], "maxQueueDelayMicroseconds": 2000}})
    rm = models.wait_status(k8s, namespace, "edit", lambda rm: rm["status"].get("observedGeneration") == 2
                            and rm["status"].get("ready") == "2/2" and rm["status"].get("phase") == "Ready",
                            "edit rolled out: generation 2, 2/2 Ready")
    config = k8s.core.read_namespaced_config_map(names.config_map_name("edit", names.STABLE), namespace)
    assert "max_batch_size: 1024" in config.data["config.pbtxt"]
    assert "max_queue_delay_microseconds: 2000" in config.data["config.pbtxt"]
    dep = _deployment(k8s, namespace, "edit")
    assert dep.spec.replicas == 2
    # The pods must restart to load the new config: the template changes with it.
    assert (dep.spec.template.metadata.annotations or {}) != before
    assert models.condition(rm, "Ready")["observedGeneration"] == 2


def test_hand_edited_and_deleted_children_come_back(k8s, namespace, operator):
    models.create(k8s, namespace, models.model_manifest("drift"))
    models.wait_ready(k8s, namespace, "drift")
    dep_name = names.deployment_name("drift", names.STABLE)
    config_name = names.config_map_name("drift", names.STABLE)
    pbtxt = k8s.core.read_namespaced_config_map(config_name, namespace).data["config.pbtxt"]

    k8s.apps.patch_namespaced_deployment(dep_name, namespace, {"spec": {"replicas": 3}})
    k8s.core.patch_namespaced_config_map(config_name, namespace, {"data": {"config.pbtxt": "max_batch_size: 1\n"}})
    k8s.core.delete_namespaced_service(names.serving_service_name("drift"), namespace)

    wait_for(lambda: k8s.apps.read_namespaced_deployment(dep_name, namespace).spec.replicas == 1, models.OP_TIMEOUT,
             "hand-scaled Deployment back to 1 replica")
    wait_for(lambda: k8s.core.read_namespaced_config_map(config_name, namespace).data["config.pbtxt"] == pbtxt,
             models.OP_TIMEOUT, "hand-edited config.pbtxt restored")
    wait_for(lambda: not gone(lambda: k8s.core.read_namespaced_service(names.serving_service_name("drift"), namespace)),
             models.OP_TIMEOUT, "deleted Service recreated")
    models.wait_ready(k8s, namespace, "drift")


def test_deleting_the_model_collects_its_children(k8s, namespace, operator):
    models.create(k8s, namespace, models.model_manifest("gone"))
    models.wait_ready(k8s, namespace, "gone")
    k8s.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.PLURAL, "gone")
    wait_for(lambda: gone(lambda: models.get(k8s, namespace, "gone")), 30, "RankingModel deleted")
    for read in (lambda: _deployment(k8s, namespace, "gone"),
                 lambda: k8s.core.read_namespaced_config_map(names.config_map_name("gone", names.STABLE), namespace),
                 lambda: k8s.core.read_namespaced_service(names.serving_service_name("gone"), namespace)):
        wait_for(lambda read=read: gone(read), 60, "children garbage-collected")


def test_a_model_an_older_operator_put_its_finalizer_on_is_released_and_deleted(k8s, namespace, operator):
    """Operators before issue 13 reconciled models with kopf timers, and kopf put its finalizer on
    every model that had one; this one has none: kopf takes the old finalizer off, so deleting
    such a model is not held up forever."""
    body = models.model_manifest("legacy")
    body["metadata"]["finalizers"] = ["rankops.io/finalizer"]
    models.create(k8s, namespace, body)
    models.wait_ready(k8s, namespace, "legacy")
    wait_for(lambda: not (models.get(k8s, namespace, "legacy")["metadata"].get("finalizers")), 30,
             "the old finalizer taken off")
    k8s.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.PLURAL, "legacy")
    wait_for(lambda: gone(lambda: models.get(k8s, namespace, "legacy")), 30, "the model deleted")


def test_operator_killed_mid_way_converges_without_duplicates(k8s, namespace, operator):
    operator.kill()
    try:
        models.create(k8s, namespace, models.model_manifest("restart", replicas=2))
    finally:
        operator.start()
    models.wait_ready(k8s, namespace, "restart")
    operator.kill()  # and once more, with everything in place: a restart must change nothing
    dep = _deployment(k8s, namespace, "restart")
    config = k8s.core.read_namespaced_config_map(names.config_map_name("restart", names.STABLE), namespace)
    operator.start()
    time.sleep(3 * operator.interval + 2)  # resume handlers and at least one timer tick have run
    assert _deployment(k8s, namespace, "restart").metadata.resource_version == dep.metadata.resource_version
    assert k8s.core.read_namespaced_config_map(names.config_map_name("restart", names.STABLE), namespace) \
        .metadata.resource_version == config.metadata.resource_version
    deployments = k8s.apps.list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deployments] == [names.deployment_name("restart", names.STABLE)]
    assert len(k8s.core.list_namespaced_config_map(namespace, label_selector=f"{names.LABEL_MODEL}=restart").items) == 1
    assert len(k8s.core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_MODEL}=restart").items) == 2


def test_missing_pool_is_degraded_and_a_bad_edit_leaves_the_serving_model_alone(k8s, namespace, operator):
    models.create(k8s, namespace, models.model_manifest("orphan", nodePool="no-such-pool"))
    rm = models.wait_status(k8s, namespace, "orphan", lambda rm: models.condition(rm, "Degraded").get("reason")
                            == "NodePoolNotFound", "Degraded NodePoolNotFound")
    message = models.condition(rm, "Degraded")["message"]
    assert "no-such-pool" in message and "spec.nodePool" in message
    assert gone(lambda: _deployment(k8s, namespace, "orphan"))
    models.wait_event(k8s, namespace, "orphan", "NodePoolNotFound")

    models.create(k8s, namespace, models.model_manifest("serving"))
    models.wait_ready(k8s, namespace, "serving")
    before = _deployment(k8s, namespace, "serving")
    models.patch_spec(k8s, namespace, "serving", {"nodePool": "typo-pool", "replicas": 3})
    rm = models.wait_status(k8s, namespace, "serving", lambda rm: models.condition(rm, "Degraded").get("reason")
                            == "NodePoolNotFound", "bad edit reported as Degraded")
    after = _deployment(k8s, namespace, "serving")
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.status.ready_replicas == 1
    assert models.condition(rm, "Ready")["status"] == "True"   # still serving: the truth

    models.patch_spec(k8s, namespace, "serving", {"nodePool": None, "replicas": 1})
    rm = models.wait_ready(k8s, namespace, "serving")
    assert models.condition(rm, "Degraded")["status"] == "False"


def test_a_file_uri_to_the_hosts_etc_is_degraded_and_nothing_mounts_it(k8s, namespace, operator):
    """A tenant's modelUri: file:///etc (or a path that climbs back to it) would be a hostPath of
    the node's files; on a cluster whose admin allows no file:// directory (the default) it is
    reported, naming the field, and no pod, Deployment or edit of a serving one mounts it."""
    for name, uri in (("etc", "file:///etc"), ("climb", "file:///srv/models/../../etc/shadow")):
        body = models.model_manifest(name)
        body["spec"]["versions"] = [{"name": "1", "modelUri": uri, "format": "onnx"}]
        models.create(k8s, namespace, body)
        rm = models.wait_status(k8s, namespace, name, lambda rm: models.condition(rm, "Degraded").get("reason")
                                == "NotAllowedOnThisCluster", f"{uri} refused")
        message = models.condition(rm, "Degraded")["message"]
        assert message.startswith(f"spec.versions[0].modelUri: {uri} would mount the node's /etc"), message
        assert "--allow-file-uri-dir" in message and "pvc://" in message
        assert gone(lambda: _deployment(k8s, namespace, name))

    # A serving model edited to a host path keeps serving exactly what it served.
    models.create(k8s, namespace, models.model_manifest("serving", versions=("1", "2")))
    models.wait_ready(k8s, namespace, "serving")
    before = _deployment(k8s, namespace, "serving")
    models.patch_spec(k8s, namespace, "serving", {"version": "2", "versions": [
        {"name": "1", "modelUri": "s3://models/serving/1", "format": "onnx", "precision": "fp16"},
        {"name": "2", "modelUri": "file:///", "format": "onnx"}]})
    rm = models.wait_status(k8s, namespace, "serving", lambda rm: models.condition(rm, "Degraded").get("reason")
                            == "NotAllowedOnThisCluster" and rm["status"].get("observedGeneration") == 2,
                            "the edit refused")
    assert "spec.versions[1].modelUri: file:/// would mount the node's /" in models.condition(rm, "Degraded")["message"]
    assert _deployment(k8s, namespace, "serving").metadata.resource_version == before.metadata.resource_version
    assert gone(lambda: _deployment(k8s, namespace, "serving", names.CANARY))
    assert models.condition(rm, "Ready")["status"] == "True" and rm["status"]["stableVersion"] == "1"
    models.wait_event(k8s, namespace, "serving", "NotAllowedOnThisCluster")
    host_paths = [(p.metadata.name, v.host_path.path) for p in k8s.core.list_namespaced_pod(namespace).items
                  for v in p.spec.volumes or [] if v.host_path]
    assert host_paths == []
