"""spec.latencyIsolation renders Guaranteed Triton pods; latencyTuning: require keeps models on
tuned, aligned nodes (issue 28)."""
from __future__ import annotations

import pathlib

import pydantic
import pytest
import yaml

from rankops.api import bounds
from rankops.api.gpunodepool import NodeRequirements
from rankops.api.rankingmodel import RankingModel
from rankops.render import isolation
from rankops.render.desired import ServingState, desired_objects, resolve_shape
from rankops.render.serving import pool_placement
from rankops.validator.node import LABEL_LATENCY_TUNED, LABEL_POOL, LABEL_READY, LABEL_TOPOLOGY_ALIGNED

CASES = pathlib.Path(__file__).parent / "cases"


def _model(case: str = "onnx-fp16-pooled", **spec) -> RankingModel:
    doc = yaml.safe_load((CASES / f"{case}.yaml").read_text())
    doc["spec"].update(spec)
    return RankingModel.model_validate(doc)


def _pod(rm: RankingModel, requirements: NodeRequirements | None = None) -> dict:
    objects = desired_objects(rm, ServingState(rm.spec.version), resolve_shape(rm.spec), requirements)
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-stable")]
    return deployment["spec"]["template"]["spec"]


def qos_class(pod: dict) -> str:
    """Kubernetes' rule (pkg/apis/core/helper/qos): Guaranteed only when every container, init
    containers included, has cpu and memory limits equal to its requests."""
    containers = pod.get("initContainers", []) + pod["containers"]
    for container in containers:
        requests, limits = container["resources"].get("requests", {}), container["resources"].get("limits", {})
        for name in ("cpu", "memory"):
            if name not in limits or bounds.quantity(requests.get(name, limits[name])) != bounds.quantity(limits[name]):
                return "Burstable"
    return "Guaranteed"


@pytest.mark.parametrize("warm", [False, True])
def test_latency_isolation_makes_every_container_guaranteed(warm):
    rm = _model(latencyIsolation=True, resources={"cpu": "4", "memory": "8Gi"}, warmReplicas={"enabled": warm})
    pod = _pod(rm)
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-model"]
    assert qos_class(pod) == "Guaranteed"
    triton = next(c for c in pod["containers"] if c["name"] == "triton")
    assert triton["resources"]["requests"] == triton["resources"]["limits"] == {
        "cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1", "ephemeral-storage": "12Gi"}
    # whole CPUs for the init container too: it runs alone, and the CPU manager hands its cores on
    fetch = pod["initContainers"][0]["resources"]
    assert fetch["requests"] == fetch["limits"] and float(fetch["limits"]["cpu"]).is_integer()


def test_without_isolation_the_fetcher_keeps_the_pod_burstable():
    """The state the issue describes: Triton at requests == limits, and still not pinned."""
    pod = _pod(_model())
    assert qos_class(pod) == "Burstable"


def test_an_init_container_that_differs_breaks_guaranteed():
    """The QoS rule counts init containers: the test above would fail if one were left out."""
    pod = _pod(_model(latencyIsolation=True))
    pod["initContainers"][0]["resources"]["requests"]["memory"] = "512Mi"
    assert qos_class(pod) == "Burstable"


def test_guaranteed_takes_the_larger_of_request_and_limit():
    assert isolation.guaranteed({"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
                                whole_cpus=True) == {"requests": {"cpu": "1", "memory": "2Gi"},
                                                     "limits": {"cpu": "1", "memory": "2Gi"}}
    assert isolation.guaranteed({"requests": {"cpu": "250m", "memory": "192Mi"}}, whole_cpus=False) == {
        "requests": {"cpu": "250m", "memory": "192Mi"}, "limits": {"cpu": "250m", "memory": "192Mi"}}


def test_triton_threads_follow_the_pinned_cpus():
    pod = _pod(_model(latencyIsolation=True, resources={"cpu": "6", "memory": "8Gi"}))
    triton = next(c for c in pod["containers"] if c["name"] == "triton")
    assert "--backend-config=onnxruntime,enable-global-threadpool=1" in triton["args"]
    assert "--backend-config=onnxruntime,intra_op_thread_count=6" in triton["args"]
    assert {"name": "OMP_NUM_THREADS", "value": "6"} in triton["env"]
    plain = next(c for c in _pod(_model())["containers"] if c["name"] == "triton")
    assert not [a for a in plain["args"] if a.startswith("--backend-config=onnxruntime")]
    assert not [e for e in plain["env"] if e["name"] == "OMP_NUM_THREADS"]


def test_tensorrt_engines_get_no_onnx_runtime_pools():
    pod = _pod(_model("tensorrt-int8", latencyIsolation=True))
    triton = next(c for c in pod["containers"] if c["name"] == "triton")
    assert not [a for a in triton["args"] if "onnxruntime" in a]
    assert qos_class(pod) == "Guaranteed"


def test_latency_isolation_needs_whole_cpus():
    with pytest.raises(pydantic.ValidationError, match="latencyIsolation needs whole CPUs"):
        _model(latencyIsolation=True, resources={"cpu": "1500m", "memory": "8Gi"})
    _model(latencyIsolation=True, resources={"cpu": "2000m", "memory": "8Gi"})  # 2 cores, spelled in millicores


@pytest.mark.parametrize("mode, pinned", [("off", False), ("warn", False), ("require", True)])
def test_require_places_models_only_on_tuned_aligned_nodes(mode, pinned):
    placement = pool_placement("t4-pool", NodeRequirements.model_validate({"latencyTuning": mode}))
    expected = {LABEL_POOL: "t4-pool", LABEL_READY: "true"}
    if pinned:
        expected |= {LABEL_LATENCY_TUNED: "true", LABEL_TOPOLOGY_ALIGNED: "true"}
    assert placement["nodeSelector"] == expected


def test_require_reaches_the_rendered_deployment():
    pod = _pod(_model(latencyIsolation=True), NodeRequirements.model_validate({"latencyTuning": "require"}))
    assert pod["nodeSelector"][LABEL_LATENCY_TUNED] == pod["nodeSelector"][LABEL_TOPOLOGY_ALIGNED] == "true"


def test_summed_disk_sizes_are_spelled_as_the_api_server_stores_them():
    """12288Mi is stored as 12Gi: spelled otherwise the Deployment is patched on every reconcile."""
    from rankops.render.serving import sum_quantities, canonical_binary

    assert sum_quantities("10Gi", "2Gi") == "12Gi"
    assert sum_quantities("10Gi", "256Mi") == "10496Mi"
    assert sum_quantities("1G", "256Mi") == "1209Mi"   # decimal bytes, rounded up to a whole Mi
    assert canonical_binary(2 ** 40) == "1Ti" and canonical_binary(0) == "0"
