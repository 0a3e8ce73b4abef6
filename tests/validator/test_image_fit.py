"""A model's Triton image against the nodes' validated drivers and its TensorRT engines (issue 16).

The rules are NVIDIA's (triton_releases.json, sources named there); these tests hold placement
(node affinity), the pool verdict and the engine check to them.
"""
from __future__ import annotations

import pytest

from rankops.api.rankingmodel import RankingModelSpec
from rankops.render.serving import pool_placement
from rankops.triton import image_fit
from rankops.validator.node import LABEL_DRIVER, LABEL_POOL, LABEL_READY, driver_number_labels
from rankops.triton.compat import Verdict, check, releases

T24_10 = "nvcr.io/nvidia/tritonserver:24.10-py3"
T24_05 = "nvcr.io/nvidia/tritonserver:24.05-py3"
DRIVERS = ["450.51.06", "470.57.02", "470.42.01", "525.60.13", "525.85.12", "525.147.05", "530.30.02",
           "535.54.03", "535.86.10", "535.104.05", "545.23.08", "550.54.15", "560.35.03", "570.86.10",
           "575.51.03", "580.95.05"]


def _node(name: str, driver: str | None, *, branch_labels: bool = True) -> dict:
    labels = {LABEL_POOL: "t4", LABEL_READY: "true", **({LABEL_DRIVER: driver} if driver else {})}
    if branch_labels:
        labels.update({k: v for k, v in driver_number_labels(driver).items() if v is not None})
    return {"metadata": {"name": name, "labels": labels}}


def _admits(ways: list[list[dict]], labels: dict[str, str]) -> bool:
    """What the scheduler does with requiredDuringScheduling nodeSelectorTerms (OR of ANDs)."""
    def holds(expr):
        value = labels.get(expr["key"])
        if expr["operator"] == "NotIn":   # a node without the label matches too
            return value not in expr["values"]
        if value is None:
            return False
        if expr["operator"] == "In":
            return value in expr["values"]
        if expr["operator"] == "Gt":
            return int(value) > int(expr["values"][0])
        raise AssertionError(expr)
    return any(all(holds(e) for e in way) for way in ways)


@pytest.mark.parametrize("release", sorted(releases()))
def test_affinity_admits_exactly_the_drivers_nvidia_lists(release):
    image = f"nvcr.io/nvidia/tritonserver:{release}-py3"
    ways = image_fit.driver_affinity(image)
    for driver in DRIVERS:
        labels = {k: v for k, v in driver_number_labels(driver).items() if v}
        assert _admits(ways, labels) == (check(image, driver).verdict is Verdict.COMPATIBLE), (release, driver)


def test_forward_compatible_minimums_are_branch_and_minor():
    # The affinity compares branch and minor only: that is exact while every minimum is X.Y.
    for entry in releases().values():
        assert all(len(m.split(".")) == 2 for m in entry["dataCenterForwardCompatible"]), entry["release"]


def test_pool_placement_adds_the_driver_terms_to_each_alternative():
    requirements = type("R", (), {"gpu_products": ["Tesla-T4"], "min_gpu_memory_mib": None})()
    placement = pool_placement("t4", requirements, T24_10)
    terms = placement["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == len(image_fit.driver_affinity(T24_10))
    # Each alternative keeps the pool's own expressions: off nodes mid-upgrade, the pool's GPUs.
    assert all([e["key"] for e in term["matchExpressions"][:2]] ==
               ["nvidia.com/gpu-driver-upgrade-state", "nvidia.com/gpu.product"] for term in terms)
    # 550.54.15 on a T4: too old for 24.10 (R560, forward-compatible R470/R525/R535 only).
    t4_550 = {"nvidia.com/gpu.product": "Tesla-T4", **driver_number_labels("550.54.15")}
    t4_560 = {"nvidia.com/gpu.product": "Tesla-T4", **driver_number_labels("560.35.03")}
    ways = [term["matchExpressions"] for term in terms]
    assert not _admits(ways, t4_550) and _admits(ways, t4_560)


def test_unknown_image_adds_no_driver_terms_and_says_so():
    image = "registry.example.com/ml/tritonserver:custom"
    assert image_fit.driver_affinity(image) is None
    def driver_keys(placement):
        terms = placement["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        return {e["key"] for term in terms for e in term["matchExpressions"]} & {
            "rankops.io/driver-branch", "rankops.io/driver-minor"}

    # Only the term that keeps pods off nodes mid-upgrade, no driver terms.
    assert driver_keys(pool_placement("t4", None, image)) == set()
    note = image_fit.unknown_note(image)
    assert "not an NGC tritonserver" in note and "not kept off" in note
    assert image_fit.unknown_note(T24_10) is None
    # Without a pool there is no validated driver label to select on.
    assert driver_keys(pool_placement(None, None, T24_10)) == set()


def test_no_ready_node_runs_the_image_is_driver_too_old_naming_image_drivers_and_fix():
    reason, message = image_fit.pool_driver_problem(
        T24_10, "t4", [_node("gpu-b", "550.54.15"), _node("gpu-a", "535.54.03")])
    assert reason == "DriverTooOld"
    for words in (T24_10, "CUDA 12.6.2", "R560 or later", "535.86 (or later R535)", "gpu-a has 535.54.03",
                  "gpu-b has 550.54.15", "GpuNodePool t4", "older Triton image",
                  "nvcr.io/nvidia/tritonserver:24.05-py3", "nvidia-driver:560-dkms"):
        assert words in message, words


def test_one_ready_node_that_runs_it_is_enough():
    assert image_fit.pool_driver_problem(T24_10, "t4", [_node("a", "550.54.15"), _node("b", "560.35.03")]) is None
    # Forward compatibility on a data-center GPU counts.
    assert image_fit.pool_driver_problem(T24_10, "t4", [_node("a", "535.104.05")]) is None


def test_a_node_from_an_older_validator_is_named():
    reason, message = image_fit.pool_driver_problem(T24_10, "t4", [_node("a", "560.35.03", branch_labels=False)])
    assert reason == "DriverTooOld" and "rankops.io/driver-branch" in message and "validator" in message


@pytest.mark.parametrize("image, nodes", [
    ("myrepo/triton:custom", [_node("a", "470.42.01")]),    # needs unknown: nothing claimed
    (T24_10, []),                                         # no ready node: NoReadyNodes says it
])
def test_no_verdict_without_knowledge_or_nodes(image, nodes):
    assert image_fit.pool_driver_problem(image, "t4", nodes) is None


def test_newest_release_every_driver_runs():
    assert image_fit.newest_release(["550.54.15"]) == "24.05"
    assert image_fit.newest_release(["560.35.03", "535.54.03"]) == "23.08"
    assert image_fit.newest_release(["450.51.06"]) == "23.08"
    assert image_fit.newest_release(["418.87.01"]) is None and image_fit.newest_release([]) is None


def _spec(image: str, *versions: dict) -> RankingModelSpec:
    return RankingModelSpec.model_validate({
        "tritonImage": image, "version": versions[0]["name"],
        "versions": [{"modelUri": f"s3://m/{v['name']}", **v} for v in versions],
        "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}], "batching": {"maxBatchSize": 8}})


def test_engine_built_for_another_tensorrt_is_a_mismatch_naming_both_and_the_fix():
    mismatches, _ = image_fit.engine_mismatches(_spec(T24_05, {"name": "2", "format": "tensorrt_plan",
                                                               "tensorrtVersion": "8.6.1.6"}))
    assert len(mismatches) == 1
    for words in ("spec.versions[0] (2)", "TensorRT 8.6.1.6", "TensorRT 10.0.1.6", T24_05, "rebuild the engine",
                  "format: onnx"):
        assert words in mismatches[0], words


@pytest.mark.parametrize("version", [
    {"tensorrtVersion": "10.0.1.6"}, {"tensorrtVersion": "10.0.1"}, {"builtWithTriton": "24.05"},
])
def test_engine_of_the_image_s_tensorrt_passes(version):
    assert image_fit.engine_mismatches(_spec(T24_05, {"name": "2", "format": "tensorrt_plan", **version})) == ([], [])


@pytest.mark.parametrize("image, version, words", [
    (T24_05, {}, "declare tensorrtVersion"),
    (T24_10, {"tensorrtVersion": "10.5.0.18"}, "not known to rankops"),
    (T24_05, {"builtWithTriton": "23.08"}, "cannot tell"),
])
def test_engine_that_cannot_be_checked_says_so(image, version, words):
    mismatches, notes = image_fit.engine_mismatches(_spec(image, {"name": "2", "format": "tensorrt_plan", **version}))
    assert mismatches == [] and len(notes) == 1 and words in notes[0]


def test_only_tensorrt_plans_are_checked_and_only_they_may_declare_an_engine():
    assert image_fit.engine_mismatches(_spec(T24_05, {"name": "1", "format": "onnx"})) == ([], [])
    with pytest.raises(ValueError, match="apply only to format tensorrt_plan"):
        _spec(T24_05, {"name": "1", "format": "onnx", "tensorrtVersion": "10.0.1.6"})
    with pytest.raises(ValueError, match="quoted string"):
        _spec(T24_05, {"name": "1", "format": "tensorrt_plan", "builtWithTriton": 24.1})
