import pytest

from rankops.planner.profile import (
    LatencyProfile, ProfileError, _instances, load_profiles, parse_model_analyzer_csv,
    parse_perf_analyzer_csv, parse_profile_text,
)


def test_inline_profile_accepts_string_keys_and_interpolates():
    profile = LatencyProfile.from_mapping({"16": 4.6, "1": 2.0, "8": "3.0"})
    assert profile.batch_sizes == (1, 8, 16)
    assert profile.compute_ms(1) == 2.0
    assert profile.compute_ms(12) == pytest.approx(3.8)          # halfway between 8 and 16
    assert profile.compute_ms(20) == pytest.approx(4.6 + 0.2 * 4)  # last slope extended


def test_single_point_profile_scales_linearly():
    assert LatencyProfile.from_mapping({8: 3.0}).compute_ms(16) == pytest.approx(6.0)
    assert LatencyProfile.from_mapping({8: 3.0}).compute_ms(2) == pytest.approx(3.0)


@pytest.mark.parametrize("mapping, words", [
    ({}, "empty"),
    ({0: 1.0}, "batch size 0"),
    ({4: -1}, "must be > 0"),
    ({"eight": 3.0}, "'eight'"),
])
def test_bad_inline_profile_names_the_entry(mapping, words):
    with pytest.raises(ProfileError, match=words):
        LatencyProfile.from_mapping(mapping)


def test_perf_analyzer_uses_lowest_concurrency_server_compute(fixtures):
    text = (fixtures / "perf_b1.csv").read_text()
    # rows are sorted by throughput, so concurrency 1 is not always first; 62 + 1895 + 43 us
    assert parse_perf_analyzer_csv(text, 1) == {1: pytest.approx(2.0)}
    verbose = (fixtures / "perf_b8.csv").read_text()
    assert parse_perf_analyzer_csv(verbose, 8) == {8: pytest.approx((108 + 2802 + 95) / 1000)}


def test_perf_analyzer_needs_the_batch_size(fixtures):
    with pytest.raises(ProfileError, match=r"-b.*perf_b8.csv:8"):
        parse_profile_text((fixtures / "perf_b8.csv").read_text(), "perf_b8.csv")


def test_perf_analyzer_without_server_stats_is_refused(fixtures):
    with pytest.raises(ProfileError, match="Server Compute Infer"):
        parse_profile_text((fixtures / "perf_client_only.csv").read_text(), "x.csv", batch_size=1)


def test_model_analyzer_default_columns_use_little_law_at_one_instance(fixtures):
    profile = parse_model_analyzer_csv((fixtures / "metrics-model-inference.csv").read_text())
    # lowest concurrency, GPU:1 rows only: time per request = batch / throughput
    assert profile == {1: pytest.approx(2.5), 4: pytest.approx(2.5), 8: pytest.approx(3.2),
                       16: pytest.approx(5.0)}


def test_model_analyzer_server_compute_columns_win(fixtures):
    profile = parse_profile_text((fixtures / "metrics-model-inference-server.csv").read_text())
    assert profile.as_dict() == {1: pytest.approx(2.0), 8: pytest.approx(3.0), 16: pytest.approx(4.6)}


def test_load_profiles_merges_perf_runs(fixtures):
    profile = load_profiles([f"{fixtures / 'perf_b1.csv'}:1", f"{fixtures / 'perf_b8.csv'}:8"])
    assert profile.batch_sizes == (1, 8)
    assert profile.compute_ms(8) == pytest.approx(3.005)


def test_load_profiles_missing_file():
    with pytest.raises(ProfileError, match="no such file"):
        load_profiles(["/nonexistent/perf.csv:8"])


def test_yaml_profile_text():
    assert parse_profile_text("1: 2.0\n8: 3.0\n").as_dict() == {1: 2.0, 8: 3.0}
    assert parse_profile_text('{"1": 2.0}').as_dict() == {1: 2.0}
    with pytest.raises(ProfileError, match="expected a map"):
        parse_profile_text("- 1\n- 2\n")


@pytest.mark.parametrize("text, count", [("GPU:2", 2), ("1/GPU", 1), ("3:GPU", 3), ("CPU:1", None)])
def test_model_analyzer_instance_group_formats(text, count):
    assert _instances(text) == count
