"""Issue 42: GPU memory per model measured from Triton's nv_gpu_memory_used_bytes (rankops profile)."""
import pytest

from rankops.planner.measure import GpuMemory, MeasureError, gpu_memory, settled_gpu_memory
from rankops.triton.metrics import MetricsRejected, gpu_memory_used

MIB = 1 << 20
PAGE = """# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 16106127360
nv_gpu_memory_total_bytes{gpu_uuid="GPU-b"} 16106127360
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} %d
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 524288000
nv_inference_count{model="ranker",version="1"} 10
"""


def test_used_bytes_by_gpu_from_tritons_page():
    assert gpu_memory_used(PAGE % (1024 * MIB)) == {"GPU-a": 1024.0 * MIB, "GPU-b": 524288000.0}
    assert gpu_memory_used("nv_inference_count{model=\"m\"} 1\n") == {}


@pytest.mark.parametrize("line", [
    'nv_gpu_memory_used_bytes 5',                                          # no gpu_uuid
    'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} -1',
    'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1e300',
    'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} nan',
    'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1\nnv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 2',
    'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a} 1',
])
def test_a_page_triton_could_not_have_written_is_rejected(line):
    with pytest.raises(MetricsRejected):
        gpu_memory_used(line)


def test_the_gpu_that_moved_is_read_and_the_figures_derived():
    unloaded = {"GPU-a": 700 * MIB, "GPU-b": 500 * MIB}
    loaded = {"GPU-a": 2700 * MIB, "GPU-b": 500 * MIB}       # 2 instances x 1000 MiB of weights
    at_max = {"GPU-a": 2956 * MIB, "GPU-b": 501 * MIB}       # 256 MiB for a batch of 64
    reading = gpu_memory(unloaded, loaded, at_max, largest_batch=64)
    assert reading == GpuMemory("GPU-a", 700.0, 2700.0, 2956.0, 64)
    assert reading.planning(instances=2) == {"activationMiBPerItem": 4.0, "weightsMiB": 1000.0}
    assert "weights: measure with --reload" in gpu_memory(None, loaded, at_max, 64).describe(2)
    assert gpu_memory(None, loaded, at_max, 64).planning(2) == {"activationMiBPerItem": 4.0}
    # the largest batch sent, not max_batch_size: a profile that stopped at 32 counts per item of 32
    assert gpu_memory(None, loaded, at_max, 32).planning(2) == {"activationMiBPerItem": 8.0}
    with pytest.raises(MeasureError):
        gpu_memory(None, {"GPU-a": 1.0}, {"GPU-c": 2.0}, 8)


def test_a_reading_is_taken_once_triton_has_refreshed_it():
    readings = iter([{"g": 1.0}, {"g": 5.0}, {"g": 9.0}, {"g": 9.0}, {"g": 9.0}])
    slept = []
    assert settled_gpu_memory(lambda: next(readings), 2.0, slept.append) == {"g": 9.0}
    assert slept == [2.0, 2.0, 2.0]
