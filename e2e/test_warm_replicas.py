"""Every replica warm before it takes traffic, with pods that really run (process node).

A RankingModel is served for real (its artifact fetched from the S3 server, Triton on the
process node); each of its pods carries the rendered `warm` container. The test watches the
pods from the moment the model is created and checks that a pod is Ready only after its warm
container logged its replay (the cold pass, the rounds and the warm summary, with their numbers),
and that a replacement pod (a restart, a node loss, a scale-up) warms again before it is Ready.
"""
from __future__ import annotations

import datetime
import json
import threading
import time

import pytest

from e2e import models
from e2e.support import wait_for
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.devcluster import spec_models
from rankops.render import names

pytestmark = pytest.mark.usefixtures("operator_logs_no_errors")

BUCKET = "models"
# A 2-core CI machine runs the control plane, the operator and Triton at once: the bound is
# loose, the point is that the pod waits for the replay and the numbers it logs.
WARM = {"requests": 100, "concurrency": 2, "maxP99Ms": 3000}
REAL_TIMEOUT = 300


class PodWatch(threading.Thread):
    """Every state of the model's pods as seen (poll), with the wall time it was seen at."""

    def __init__(self, k8s, namespace: str, model: str):
        super().__init__(daemon=True)
        self.k8s, self.namespace, self.selector = k8s, namespace, f"{names.LABEL_MODEL}={model}"
        self.seen: list[tuple[float, str, bool, dict[str, bool]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            for pod in self.k8s.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items:
                ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
                containers = {s.name: bool(s.ready) for s in pod.status.container_statuses or []}
                self.seen.append((time.time(), pod.metadata.name, ready, containers))

    def first_ready(self, pod: str) -> float:
        return min(t for t, name, ready, _ in self.seen if name == pod and ready)

    def states(self, pod: str) -> list[tuple[float, bool, dict[str, bool]]]:
        return [(t, ready, containers) for t, name, ready, containers in self.seen if name == pod]


def _at(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _warm_events(process_node, namespace: str, pod: str) -> list[dict]:
    text = process_node.pod_logs(namespace, pod).get("warm", "")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _check_warmed_before_ready(watch: PodWatch, process_node, namespace: str, pod: str) -> dict:
    wait_for(lambda: any(ready for _, ready, _ in watch.states(pod)), 30, f"the watch to see {pod} Ready")
    events = _warm_events(process_node, namespace, pod)
    states = watch.states(pod)
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["start", "waiting"] and "coldPass" in kinds and "round" in kinds, (kinds, states[-8:])
    [warm] = [e for e in events if e["event"] == "warm"]
    assert warm["ready"] == "warm", warm
    assert warm["errors"] == 0 and 0 < warm["p99Ms"] <= WARM["maxP99Ms"], warm
    assert warm["warmRequests"] >= WARM["requests"] and warm["coldRequests"] == warm["samples"] > 0, warm
    assert len(warm["batchSizes"]) > 1, "the candidate counts production sends"
    rounds = [e for e in events if e["event"] == "round"]
    assert rounds[-1]["withinBound"] and rounds[-1]["server"]["requests"] == rounds[-1]["requests"], rounds[-1]
    # Ready only after the replay: never seen Ready (nor its warm container ready) before it ended.
    warmed_at = _at(warm["at"])
    assert watch.first_ready(pod) >= warmed_at, (warm["at"], states[:5])
    assert not [s for s in states if s[0] < warmed_at and (s[1] or s[2].get("warm"))], states
    # It was seen running and not Ready while it warmed.
    assert any(not ready and "warm" in containers for _, ready, containers in states), states
    return warm


def test_a_models_pods_are_ready_only_after_their_warm_container_replayed_its_requests(
        k8s, real_namespace, operator, object_store, process_node, tmp_path):
    ns, name = real_namespace, "warmed"
    k8s.core.create_namespaced_secret(ns, object_store.secret_manifest("model-store", ns))
    body = models.model_manifest(name, modelCredentialsSecret="model-store", warmReplicas=WARM)
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
        assert pod.spec.node_name == process_node.name
        assert [c.name for c in pod.spec.containers] == ["triton", "warm"]
        warm = _check_warmed_before_ready(watch, process_node, ns, pod.metadata.name)
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
        warm = _check_warmed_before_ready(watch, process_node, ns, second.metadata.name)
        print(f"replacement pod warm: {json.dumps(warm)}")
    finally:
        watch.stopping.set()
        watch.join(5)
