"""Every replica warm before it takes traffic, with pods in real containers (conftest's `real`).

A RankingModel is served for real (its artifact fetched from the S3 server, Triton from the
Triton test image on the real node); each of its pods carries the rendered `warm` container, from
the operator image. The test watches the
pods from the moment the model is created and checks that a pod is Ready only after its warm
container logged its replay (the cold pass, the rounds and the warm summary, with their numbers),
and that a replacement pod (a restart, a node loss, a scale-up) warms again before it is Ready.
"""
from __future__ import annotations

import json

import pytest

from e2e import models
from e2e.support import wait_for
from e2e.warming import PodWatch, check_warmed_before_ready
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.render import names
from rankops_dev import spec_models

pytestmark = pytest.mark.usefixtures("real_operator_logs_no_errors")

BUCKET = "models"
# A 2-core CI machine runs the control plane, the operator and Triton at once: the bound is
# loose, the point is that the pod waits for the replay and the numbers it logs.
WARM = {"requests": 100, "concurrency": 2, "maxP99Ms": 3000}
REAL_TIMEOUT = 300


def test_a_models_pods_are_ready_only_after_their_warm_container_replayed_its_requests(
        real, real_k8s, real_namespace_in, tmp_path):
    k8s, ns, name, object_store = real_k8s, real_namespace_in, "warmed", real.store
    k8s.core.create_namespaced_secret(ns, object_store.secret_manifest("model-store", ns))
    body = models.model_manifest(name, modelCredentialsSecret="model-store", warmReplicas=WARM,
                                 tritonImage=real.refs["rankops-triton-test"], resources={"cpu": "500m", "memory": "1Gi"})
    body["spec"]["versions"][0]["precision"] = "fp32"
    directory = tmp_path / "v1"
    spec_models.export(RankingModelSpec.model_validate(body["spec"]), ModelFormat.onnx, directory)
    object_store.upload_tree(BUCKET, f"{name}/1", directory)
    watch = PodWatch(k8s, ns, name)
    watch.start()
    try:
        models.create(k8s, ns, body)
        models.wait_ready(k8s, ns, name, timeout=REAL_TIMEOUT)
        [pod] = k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_MODEL}={name}").items
        assert pod.spec.node_name == real.node_name
        assert [c.name for c in pod.spec.containers] == ["triton", "warm"]
        assert all(c.container_id.startswith("containerd://") for c in pod.status.container_statuses), \
            pod.status.container_statuses   # Triton and the warm container: a real runtime's
        warm = check_warmed_before_ready(watch, real, ns, pod.metadata.name, WARM["maxP99Ms"])
        assert warm["warmRequests"] >= WARM["requests"], warm
        print(f"\nfirst pod warm: {json.dumps(warm)}")

        # A replacement pod (restart, node loss, scale-up) is cold too: it warms before it is Ready.
        k8s.core.delete_namespaced_pod(pod.metadata.name, ns)

        def replacement():
            pods = k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_MODEL}={name}").items
            fresh = [p for p in pods if p.metadata.name != pod.metadata.name and not p.metadata.deletion_timestamp]
            ready = [p for p in fresh if any(c.type == "Ready" and c.status == "True"
                                              for c in p.status.conditions or [])]
            return ready[0] if ready else None

        second = wait_for(replacement, REAL_TIMEOUT, "the replacement pod Ready")
        warm = check_warmed_before_ready(watch, real, ns, second.metadata.name, WARM["maxP99Ms"])
        assert warm["warmRequests"] >= WARM["requests"], warm
        print(f"replacement pod warm: {json.dumps(warm)}")
    finally:
        watch.stopping.set()
        watch.join(5)
