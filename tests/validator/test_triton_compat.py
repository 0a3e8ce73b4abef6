"""Triton image x node driver, from NVIDIA's release notes (table: rankops/triton/triton_releases.json)."""
from __future__ import annotations

import pytest

from rankops.triton.compat import Verdict, check, releases, triton_release


@pytest.mark.parametrize("image, release", [
    ("nvcr.io/nvidia/tritonserver:24.10-py3", "24.10"),
    ("nvcr.io/nvidia/tritonserver:24.10-py3-min", "24.10"),
    ("nvidia/tritonserver:25.03-trtllm-python-py3", "25.03"),
    ("nvcr.io/nvidia/tritonserver:24.05-py3@sha256:" + "a" * 64, "24.05"),
    ("registry.example.com/ml/tritonserver:24.10-py3", None),
    ("nvcr.io/nvidia/tritonserver:latest", None),
])
def test_release_from_image(image, release):
    assert triton_release(image) == release


def test_full_feature_driver_is_compatible():
    # "Release 24.10 is based on CUDA 12.6.2 which requires NVIDIA Driver release 560 or later."
    result = check("nvcr.io/nvidia/tritonserver:24.10-py3", "560.35.03")
    assert result.verdict is Verdict.COMPATIBLE and not result.data_center_only
    assert (result.release, result.cuda) == ("24.10", "12.6.2")


def test_forward_compatible_branch_only_on_data_center_gpus():
    # "... on a data center GPU (for example, T4 ...) ... 535.86 (or later R535)".
    result = check("nvcr.io/nvidia/tritonserver:24.10-py3", "535.104.05")
    assert result.verdict is Verdict.COMPATIBLE and result.data_center_only
    assert "R535" in result.reason


def test_too_old_on_a_forward_compatible_branch_is_not():
    result = check("nvcr.io/nvidia/tritonserver:24.10-py3", "535.54.03")
    assert result.verdict is Verdict.NOT_COMPATIBLE
    assert "R560" in result.reason and "535.86" in result.reason and "535.54.03" in result.reason


def test_branch_outside_forward_compatibility_is_not():
    # R550 is neither >= R560 nor a forward-compatible branch of 24.10.
    assert check("nvcr.io/nvidia/tritonserver:24.10-py3", "550.54.15").verdict is Verdict.NOT_COMPATIBLE


def test_self_contradicting_note_leaves_the_branch_out():
    # 24.10's note lists 545.23 but also says to upgrade from R545: not claimed compatible.
    assert check("nvcr.io/nvidia/tritonserver:24.10-py3", "545.23.08").verdict is Verdict.NOT_COMPATIBLE
    assert check("nvcr.io/nvidia/tritonserver:24.05-py3", "545.23.08").verdict is Verdict.COMPATIBLE


@pytest.mark.parametrize("image, driver, words", [
    ("nvcr.io/nvidia/tritonserver:19.01-py3", "535.104.05", "not in rankops' table"),
    ("myrepo/triton:custom", "535.104.05", "not an NGC tritonserver"),
    ("nvcr.io/nvidia/tritonserver:24.10-py3", None, "not a validated driver"),
    ("nvcr.io/nvidia/tritonserver:24.10-py3", "garbage", "not a validated driver"),
])
def test_unknown_is_said_not_guessed(image, driver, words):
    result = check(image, driver)
    assert result.verdict is Verdict.UNKNOWN and words in result.reason


def test_table_is_well_formed():
    for release, entry in releases().items():
        assert entry["release"] == release and isinstance(entry["minDriverBranch"], int)
        assert all(int(m.split(".")[0]) <= entry["minDriverBranch"] for m in entry["dataCenterForwardCompatible"])
        # A TensorRT version is only ever filled from an NVIDIA page for that release, named beside it.
        assert (entry["tensorrt"] is None) == ("tensorrtSource" not in entry), release
        assert entry["tensorrt"] is None or entry["tensorrtSource"].startswith("https://docs.nvidia.com/")


def test_tensorrt_of_a_release_comes_with_the_check():
    # 24.05: TensorRT 10.0.1.6 (Triton's Release Compatibility Matrix; the 24.05 framework containers).
    assert check("nvcr.io/nvidia/tritonserver:24.05-py3", "550.54.15").tensorrt == "10.0.1.6"
    assert check("nvcr.io/nvidia/tritonserver:24.10-py3", "560.35.03").tensorrt is None
