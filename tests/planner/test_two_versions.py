"""Issue 41: the arithmetic of two versions on one GPU, and what keeps two versions out of one model."""
import pytest

from rankops.cli import main
from rankops.planner.two_versions import VersionOnGpu, cannot_share, side_by_side


def _v(name, mib=1536.0, instances=2, fmt="onnx", precision="fp16", engine=None, triton=None):
    return VersionOnGpu(name, triton if triton is not None else int(name), fmt, precision, mib, instances, engine)


def test_the_sum_a_user_reads_fits():
    pair = side_by_side(_v("3"), _v("4"), gpu_mib=15360, runtime_reserve_mib=512)
    assert pair.fits and pair.in_place and pair.problems == ()
    assert pair.arithmetic == ("2 x 1536 MiB (v3) + 2 x 1536 MiB (v4) + 512 MiB runtime reserve = 6656 MiB, "
                               "+ 10% margin = 7321.6 MiB of 15360 MiB per GPU: fits (8038.4 MiB spare)")


def test_the_margin_decides_at_the_edge():
    # 2 x 3000 + 2 x 3000 + 1024 = 13024 MiB: within a T4's 15360, but not with 20% on top
    assert side_by_side(_v("3", 3000), _v("4", 3000), 15360, 1024).fits
    short = side_by_side(_v("3", 3000), _v("4", 3000), 15360, 1024, margin=0.2)
    assert not short.fits and not short.in_place
    assert short.problems == (f"GPU memory: {short.arithmetic}",)
    assert short.arithmetic.endswith("= 15628.8 MiB of 15360 MiB per GPU: does not fit (268.8 MiB short)")


def test_versions_of_other_footprints_and_instances():
    pair = side_by_side(_v("3", 1000, instances=1), _v("4", 4000, instances=3), 16000, 0, margin=0)
    assert pair.arithmetic.startswith("1 x 1000 MiB (v3) + 3 x 4000 MiB (v4) + 0 MiB runtime reserve = 13000 MiB")
    assert pair.fits


@pytest.mark.parametrize("serving, incoming, says", [
    (_v("3", fmt="onnx"), _v("4", fmt="tensorrt_plan"), "3 is onnx and 4 tensorrt_plan: the backend is set per model"),
    (_v("3", precision="fp16"), _v("4", precision="int8"), "the TensorRT accelerator's precision is set per model"),
    (_v("3", fmt="tensorrt_plan", engine="TensorRT 8.6.1"), _v("4", fmt="tensorrt_plan", engine="TensorRT 10.0.1"),
     "4's engine was built with TensorRT 10.0.1 and 3's with TensorRT 8.6.1"),
    (_v("3", triton=1), _v("4", triton=1), "are both Triton version 1"),
])
def test_what_cannot_be_one_models_versions(serving, incoming, says):
    problems = cannot_share(serving, incoming)
    assert len(problems) == 1 and says in problems[0]
    pair = side_by_side(serving, incoming, 15360, 512)
    assert pair.fits and not pair.in_place and pair.problems == tuple(problems)


def test_same_format_and_engine_share():
    assert cannot_share(_v("3", fmt="torchscript", precision="fp32"), _v("4", fmt="torchscript", precision="fp16")) == []
    assert cannot_share(_v("3", fmt="tensorrt_plan", engine=None), _v("4", fmt="tensorrt_plan", engine="TensorRT 10.0.1")) == []


def test_unknown_figures_say_what_is_missing():
    pair = side_by_side(_v("3", None), _v("4"), None)
    assert pair.fits is None and not pair.in_place
    assert pair.arithmetic == "not known: the GPU memory of 3 and the GPU's size"


SPEC = """
apiVersion: rankops.io/v1alpha1
kind: RankingModel
metadata: {name: ctr-ranker}
spec:
  slo: {p99LatencyMs: 10, targetQps: 2000}
  planning:
    gpuMemoryMiB: 15360
    latencyProfile: {1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}
    memory: {weightsMiB: 1024, gpuEmbeddingsMiB: 2048, activationMiBPerItem: 16, runtimeReserveMiB: 1024}
  version: "3"
  versions:
  - {name: "3", modelUri: "s3://models/ctr/3", format: onnx, precision: fp16}
  - {name: "4", modelUri: "s3://models/ctr/4", format: onnx, precision: fp16}
  - {name: "5", modelUri: "s3://models/ctr/5", format: tensorrt_plan, precision: int8}
  inputs: [{name: user, dataType: FP32, dims: [64]}]
  outputs: [{name: score, dataType: FP32, dims: [1]}]
"""

EXPECTED = """
Two versions on one GPU (a version loaded beside 3 in its running pods):
  (spec.planning.memory is one figure per instance for every version)
  4: can load in place
    1 x 3328 MiB (v3) + 1 x 3328 MiB (v4) + 1024 MiB runtime reserve = 7680 MiB, + 10% margin = 8448 MiB of 15360 MiB per GPU: fits (6912 MiB spare)
  5: cannot load in place
    1 x 3328 MiB (v3) + 1 x 3328 MiB (v5) + 1024 MiB runtime reserve = 7680 MiB, + 10% margin = 8448 MiB of 15360 MiB per GPU: fits (6912 MiB spare)
    ! 3 is onnx and 5 tensorrt_plan: the backend is set per model in config.pbtxt, not per version
"""


def test_rankops_plan_prints_the_arithmetic_for_each_version_beside_the_serving_one(tmp_path, capsys):
    path = tmp_path / "rm.yaml"
    path.write_text(SPEC)
    assert main(["plan", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(EXPECTED)
    assert "\n\n\nTwo versions" not in out and "\n\nTwo versions" in out


def test_a_planning_sketch_prints_no_such_section(tmp_path, capsys):
    path = tmp_path / "rm.yaml"
    path.write_text(SPEC.split("  version:")[0])
    assert main(["plan", "-f", str(path)]) == 0
    assert "Two versions" not in capsys.readouterr().out
