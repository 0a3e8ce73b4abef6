"""RankingModel helpers for the e2e tests: manifests, apply/patch/read, and waits on status."""
from __future__ import annotations

import copy
import json
from typing import Any

from e2e.support import wait_for

GROUP, VERSION, PLURAL = "rankops.io", "v1alpha1", "rankingmodels"
OP_TIMEOUT = 60  # seconds a reconcile may take to show (the operator re-checks every 2 s)


def model_manifest(name: str, version: str = "1", versions: tuple[str, ...] = ("1",), **spec: Any) -> dict:
    """A small pool-less RankingModel with explicit batching; `spec` overrides fields."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RankingModel",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "gpusPerReplica": 1,
            "version": version,
            "versions": [{"name": v, "modelUri": f"s3://models/{name}/{v}", "format": "onnx",
                          "precision": "fp16"} for v in versions],
            "candidates": {"layout": "batch", "minPerRequest": 20, "maxPerRequest": 200},
            "inputs": [{"name": "user_features", "dataType": "FP32", "dims": [64]},
                       {"name": "item_features", "dataType": "FP32", "dims": [32]}],
            "outputs": [{"name": "scores", "dataType": "FP32", "dims": [1]}],
            "batching": {"maxBatchSize": 512, "preferredBatchSizes": [256, 512], "maxQueueDelayMicroseconds": 1000},
            "resources": {"cpu": "1", "memory": "2Gi"},
        },
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


def create(k8s: Any, namespace: str, body: dict) -> dict:
    return k8s.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def patch_spec(k8s: Any, namespace: str, name: str, spec: dict) -> dict:
    return k8s.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def annotate(k8s: Any, namespace: str, name: str, annotations: dict[str, str | None]) -> dict:
    return k8s.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                     {"metadata": {"annotations": annotations}})


def get(k8s: Any, namespace: str, name: str) -> dict:
    return k8s.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def condition(rm: dict, kind: str) -> dict:
    return next((c for c in (rm.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def wait_status(k8s: Any, namespace: str, name: str, predicate, what: str, timeout: float = OP_TIMEOUT) -> dict:
    """Wait until `predicate(rm)` holds for the RankingModel; the timeout message shows its status."""
    last: dict[str, Any] = {}

    def check() -> dict | None:
        last["rm"] = get(k8s, namespace, name)
        return last["rm"] if predicate(last["rm"]) else None

    try:
        return wait_for(check, timeout, what)
    except AssertionError as exc:  # wait_for's timeout
        status = json.dumps((last.get("rm") or {}).get("status"), indent=1)[:3000]
        raise AssertionError(f"{exc}\nlast status of {namespace}/{name}:\n{status}") from None


def wait_ready(k8s: Any, namespace: str, name: str, timeout: float = OP_TIMEOUT) -> dict:
    return wait_status(k8s, namespace, name, lambda rm: (rm.get("status") or {}).get("phase") == "Ready"
                       and condition(rm, "Ready").get("status") == "True"
                       and rm["status"].get("observedGeneration") == rm["metadata"]["generation"],
                       f"RankingModel {namespace}/{name} Ready", timeout)


def printer_columns(cluster: Any, namespace: str, name: str) -> dict[str, str]:
    """`kubectl get rm NAME` as {column: value}: what a user sees. `cluster`: the suite's (support.Cluster)
    or a real-container one (rankops_dev.real_cluster): anything whose `kubectl(*args)` returns stdout."""
    header, row = cluster.kubectl("get", "rm", name, "-n", namespace, "-o", "wide").splitlines()[:2]
    # Columns are separated by 3+ spaces; empty cells are "<none>".
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    cells = [row[a:b].strip() for a, b in zip(starts, starts[1:] + [len(row) + 1])]
    return dict(zip(header.split(), cells))


def events_for(k8s: Any, namespace: str, name: str) -> list[Any]:
    return [e for e in k8s.core.list_namespaced_event(namespace).items
            if e.involved_object.kind == "RankingModel" and e.involved_object.name == name]


def wait_event(k8s: Any, namespace: str, name: str, reason: str, timeout: float = 30) -> list[Any]:
    """The model's events with `reason`, waited for: kopf posts events from a background queue,
    so one can land after the status that it explains."""
    return wait_for(lambda: [e for e in events_for(k8s, namespace, name) if e.reason == reason], timeout,
                    f"a {reason} event for {name}")
