"""The pure parts of `rankops profile`: reading Triton's statistics and choosing sizes."""
from rankops.planner.measure import (BatchTiming, Measurement, StatsSnapshot, default_batch_sizes,
                                     executions_between, parse_stats, shared_batch_size)
from rankops.planner.profile import parse_profile_text


def _entry(version, batches, success=0):
    return {"name": "m", "version": version, "inference_stats": {"success": {"count": success}, "fail": {"count": 1}},
            "batch_stats": [{"batch_size": b, "compute_input": {"count": c, "ns": 10},
                             "compute_infer": {"count": c, "ns": ns}, "compute_output": {"count": c, "ns": 5}}
                            for b, c, ns in batches]}


def test_stats_sum_input_infer_output_and_versions_unless_one_is_named():
    doc = {"model_stats": [_entry("1", [(8, 2, 1000)], 2), _entry("2", [(8, 1, 500)], 1),
                           {"name": "other", "version": "1", "batch_stats": [{"batch_size": 8}]}]}
    assert parse_stats(doc, "m") == StatsSnapshot({8: (3, 1530)}, 3, 2)
    assert parse_stats(doc, "m", "2").batches == {8: (1, 515)}


def test_executions_between_snapshots():
    before = StatsSnapshot({1: (4, 4_000_000), 8: (1, 3_000_000)}, 5, 0)
    after = StatsSnapshot({1: (4, 4_000_000), 8: (2, 6_500_000), 16: (1, 5_000_000)}, 7, 0)
    assert executions_between(before, after) == {8: (1, 3.5), 16: (1, 5.0)}


def test_sizes():
    assert default_batch_sizes(1) == [1]
    assert default_batch_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert default_batch_sizes(24) == [1, 2, 4, 8, 16, 24]
    assert shared_batch_size(32, [1, 8, 32]) == 32
    assert shared_batch_size(32, [1, 17, 32]) == 17     # two of 17 cannot be one batch
    assert shared_batch_size(32, [1, 8]) == 32


def test_config_map_holds_what_the_planner_reads():
    m = Measurement("h:8000", "ranker", "", 16, 2, [BatchTiming(1, 20, 2.0004, 2.1, 2.0, 2.5),
                                                   BatchTiming(16, 20, 4.6, 4.8, 4.7, 5.0)], slowdown=0.3)
    cm = m.config_map("ranker-latency-profile", "ns", "profile.yaml")
    assert cm["metadata"]["annotations"]["rankops.io/shared-gpu-slowdown"] == "0.3"
    assert parse_profile_text(cm["data"]["profile.yaml"]).as_dict() == {1: 2.0, 16: 4.6}
    assert m.planning() == {"latencyProfile": {1: 2.0, 16: 4.6}, "sharedGpuSlowdown": 0.3}


def test_plan_reads_the_printed_config_map_as_a_profile_file(tmp_path):
    from rankops.planner.profile import load_profiles
    from rankops.yamlio import dump_all

    m = Measurement("h:8000", "ranker", "", 16, 1, [BatchTiming(1, 20, 2.0, 2.1, 2.0, 2.5),
                                                   BatchTiming(16, 20, 4.6, 4.8, 4.7, 5.0)])
    path = tmp_path / "cm.yaml"
    path.write_text(dump_all([m.config_map("ranker-latency-profile", None, "profile.yaml")]))
    assert load_profiles([str(path)]).as_dict() == {1: 2.0, 16: 4.6}
