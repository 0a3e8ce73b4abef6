"""Canary analysis on Triton's own counters (rollout/canary_analysis.py)."""
from __future__ import annotations

from rankops.triton.metrics import ModelCounters, parse
from rankops.rollout.canary_analysis import FAIL, PASS, WAIT, Bounds, judge, track_window


def counters(success=0.0, failure=0.0, executions=0.0, inferences=0.0, queue_us=0.0, p99_us=None,
             rejected=0.0) -> ModelCounters:
    values = {"success": success, "failure": failure, "executions": executions, "inferences": inferences,
              "queue_us": queue_us, "rejected": rejected}
    return ModelCounters(values, {0.99: p99_us} if p99_us is not None else {})


def test_a_window_sums_its_pods_differences_and_takes_the_worst_p99():
    before = {"a": counters(100, 1, 50, 1000, 1000), "b": counters(10, 0, 5, 100, 100)}
    after = {"a": counters(300, 3, 150, 3000, 3000, p99_us=4000), "b": counters(110, 0, 55, 1100, 1100, p99_us=9000)}
    window = track_window(before, after)
    assert (window.pods, window.requests, window.failures) == (2, 302, 2)
    assert window.p99_ms == 9.0 and window.avg_batch_size == 20.0
    assert round(window.avg_queue_ms, 4) == round(3000 / 300 / 1000, 4)


def test_a_new_or_restarted_pod_counts_from_zero():
    before = {"a": counters(500, 5), "gone": counters(50)}
    after = {"a": counters(20, 1), "new": counters(30, 0)}  # a restarted: its counters went down
    window = track_window(before, after)
    assert (window.requests, window.failures, window.pods) == (51, 1, 2)


def test_too_little_traffic_is_no_verdict():
    result = judge(track_window({}, {"c": counters(40)}), track_window({}, {"s": counters(400)}), Bounds(min_requests=100))
    assert result.outcome == WAIT and result.reason == "NotEnoughTraffic" and "40 requests" in result.summary


def test_failing_requests_roll_it_back_with_the_numbers():
    canary = track_window({}, {"c": counters(190, 10, p99_us=5000)})
    stable = track_window({}, {"s": counters(400, 0, p99_us=5000)})
    result = judge(canary, stable, Bounds(max_failure_ratio=0.01))
    assert result.outcome == FAIL and result.reason == "CanaryFailingRequests"
    assert "failure ratio 5.00% > 1.00%" in result.summary
    assert result.metrics["canary"]["failureRatio"] == 0.05 and result.metrics["stable"]["requests"] == 400


def test_slower_than_the_stable_or_than_the_bound_fails():
    stable = track_window({}, {"s": counters(400, p99_us=5000)})
    slow = track_window({}, {"c": counters(200, p99_us=12000)})
    assert judge(slow, stable, Bounds(max_p99_vs_stable=1.5)).reason == "CanarySlowerThanStable"
    assert judge(slow, stable, Bounds(max_p99_vs_stable=None, max_p99_ms=10)).reason == "CanaryP99AboveBound"
    assert judge(slow, stable, Bounds(max_p99_vs_stable=3.0)).outcome == PASS
    # A stable without enough traffic of its own is no yardstick.
    quiet = track_window({}, {"s": counters(20, p99_us=1000)})
    assert judge(slow, quiet, Bounds(max_p99_vs_stable=1.5)).outcome == PASS


def test_it_reads_tritons_metrics_text():
    text = "\n".join([
        'nv_inference_request_success{model="ranker",version="2"} 180',
        'nv_inference_request_failure{model="ranker",version="2"} 20',
        'nv_inference_exec_count{model="ranker",version="2"} 90',
        'nv_inference_count{model="ranker",version="2"} 9000',
        'nv_inference_queue_duration_us{model="ranker",version="2"} 36000',
        'nv_inference_request_summary_us{model="ranker",version="2",quantile="0.99"} 7300',
        'nv_inference_request_success{model="other",version="1"} 5000',
    ])
    window = track_window({}, {"p": parse(text, "ranker")})
    assert (window.requests, window.failures, window.p99_ms, window.avg_batch_size) == (200, 20, 7.3, 100.0)


def _deployment(track, uid, version):
    return {"metadata": {"name": f"ranker-{track}", "uid": uid},
            "spec": {"template": {"metadata": {"labels": {"rankops.io/version": version}}}}}


def _pod(name, track, ip, ready=True, traffic="on", owner=None):
    meta = {"name": name, "labels": {"rankops.io/track": track, "rankops.io/traffic": traffic}}
    if owner:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "uid": f"{owner}-uid", "controller": True}]
    return {"metadata": meta, "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


REPLICA_SETS = {("rs-stable", "rs-stable-uid"): "dep-stable", ("rs-canary", "rs-canary-uid"): "dep-canary",
                ("rs-other", "rs-other-uid"): "dep-of-another-model"}


def test_the_operator_reads_only_ready_serving_pods_of_its_deployments_in_its_networks():
    from rankops.controller.pod_metrics import Target, serving_targets

    deployments = {"stable": _deployment("stable", "dep-stable", "3"), "canary": _deployment("canary", "dep-canary", "4")}
    pods = [_pod("c0", "canary", "127.77.0.3", owner="rs-canary"), _pod("c1", "canary", "127.77.0.4", ready=False,
                                                                        owner="rs-canary"),
            _pod("s0", "stable", "127.77.0.2", owner="rs-stable"), _pod("s1", "stable", "10.244.0.9", owner="rs-stable"),
            _pod("r0", "reference", "127.77.0.5", owner="rs-stable"),
            _pod("s2", "stable", "127.77.0.6", traffic="off", owner="rs-stable"),
            # The labels alone: a pod anyone made, one of another model's ReplicaSet, one claiming to be canary.
            _pod("forged", "stable", "127.77.0.7"), _pod("other", "stable", "127.77.0.8", owner="rs-other"),
            _pod("claims-canary", "canary", "127.77.0.9", owner="rs-stable")]
    owner = lambda name, uid: REPLICA_SETS.get((name, uid))  # noqa: E731
    targets, refused, foreign = serving_targets(pods, deployments, owner, ["127.0.0.0/8"])
    # The track and the Triton version come from the owning Deployment, not from the pod's labels.
    assert targets == [Target("canary", "c0", "127.77.0.3", "4"), Target("stable", "s0", "127.77.0.2", "3"),
                       Target("stable", "claims-canary", "127.77.0.9", "3")]
    assert [f.split(":")[0] for f in foreign] == ["forged", "other"]
    # A serving pod outside the networks is not read, and said: the analysis cannot judge it.
    assert len(refused) == 1 and refused[0][0] == "stable" and refused[0][1].startswith("s1 (10.244.0.9): outside")
    assert "--pod-metrics-network 127.0.0.0/8" in refused[0][1]
    assert [t.pod for t in serving_targets(pods, deployments, owner, [])[0] if t.track == "stable"] == \
        ["s0", "s1", "claims-canary"]


def test_metrics_without_a_series_of_the_model_are_not_a_reading():
    assert not parse('nv_inference_request_success{model="other",version="1"} 5000', "ranker").seen
    assert parse('nv_inference_request_success{model="ranker",version="1"} 0', "ranker").seen


def test_the_canarys_average_queue_time_is_held_to_its_bound_and_to_the_stables():
    # 300 requests that queued 9 ms on average against the stable's 2 ms, P99s alike.
    canary = track_window({}, {"c": counters(300, 0, 100, 3000, 300 * 9000, p99_us=20000)})
    stable = track_window({}, {"s": counters(600, 0, 200, 6000, 600 * 2000, p99_us=20000)})
    assert judge(canary, stable, Bounds()).outcome == PASS, "not bounded unless the spec says so"
    absolute = judge(canary, stable, Bounds(max_avg_queue_ms=5))
    assert (absolute.outcome, absolute.reason) == (FAIL, "CanaryQueueAboveBound")
    assert "canary average queue 9.00ms > 5ms" in absolute.summary
    assert absolute.metrics["canary"]["avgQueueMs"] == 9.0 and absolute.metrics["bounds"]["maxAvgQueueMs"] == 5
    relative = judge(canary, stable, Bounds(max_avg_queue_vs_stable=3))
    assert (relative.outcome, relative.reason) == (FAIL, "CanaryQueuesLongerThanStable")
    assert "4.50x the stable's 2.00ms > 3x" in relative.summary
    assert judge(canary, stable, Bounds(max_avg_queue_ms=10, max_avg_queue_vs_stable=5)).outcome == PASS
    # A stable with too little traffic of its own is no yardstick.
    quiet = track_window({}, {"s": counters(50, 0, 20, 500, 50 * 1000)})
    assert judge(canary, quiet, Bounds(max_avg_queue_vs_stable=3)).outcome == PASS


def test_the_queue_bounds_come_from_the_spec():
    from rankops.api.rankingmodel import RankingModel
    from rankops.rollout.machine import analysis_bounds

    rm = RankingModel.model_validate({
        "metadata": {"name": "ctr", "namespace": "reco"},
        "spec": {"version": "1", "versions": [{"name": "1", "modelUri": "s3://m/1", "format": "onnx"}],
                 "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}], "batching": {"maxBatchSize": 8},
                 "rollout": {"canary": {"analysis": {"maxAvgQueueMs": 4, "maxAvgQueueVsStable": 2.5}}}}})
    bounds = analysis_bounds(rm.spec)
    assert (bounds.max_avg_queue_ms, bounds.max_avg_queue_vs_stable) == (4, 2.5)


# Shed is not broken (issue 40): requests Triton rejected from its queue (reason REJECTED).

def shedding(requests: int, shed_ratio: float, broken: int = 0, p99_us: float = 20000) -> ModelCounters:
    """A track's counters: `requests` of which `shed_ratio` shed and `broken` failed otherwise."""
    shed = round(requests * shed_ratio)
    served = requests - shed - broken
    return counters(served, shed + broken, served / 10, served, served * 2000, p99_us=p99_us, rejected=shed)


def test_the_parser_counts_shed_requests_apart_and_still_as_failures():
    text = "\n".join([
        'nv_inference_request_success{model="ranker",version="2"} 700',
        'nv_inference_request_failure{model="ranker",reason="OTHER",version="2"} 3',
        'nv_inference_request_failure{model="ranker",reason="BACKEND",version="2"} 2',
        'nv_inference_request_failure{model="ranker",reason="CANCELED",version="2"} 5',
        'nv_inference_request_failure{model="ranker",reason="REJECTED",version="2"} 290',
        'nv_inference_request_failure{model="other",reason="REJECTED",version="2"} 9999',
    ])
    got = parse(text, "ranker", "2")
    assert (got.values["failure"], got.values["rejected"]) == (300, 290)
    window = track_window({}, {"p": got})
    assert (window.requests, window.failures, window.rejected, window.served) == (1000, 300, 290, 700)
    # 10 broken of the 710 that were not shed; 29% shed.
    assert round(window.failure_ratio, 4) == round(10 / 710, 4) and window.shed_ratio == 0.29
    assert window.as_metrics()["shedRatio"] == 0.29 and window.as_metrics()["rejected"] == 290
    # A Triton before the reason label: nothing is said to be shed.
    old = parse('nv_inference_request_failure{model="ranker",version="2"} 7', "ranker")
    assert (old.values["failure"], old.values["rejected"]) == (7, 0)


def test_the_gates_report_says_how_much_triton_shed():
    from rankops.triton.metrics import run_report
    page = lambda ok, shed, other: parse("\n".join([  # noqa: E731
        f'nv_inference_request_success{{model="m",version="1"}} {ok}',
        f'nv_inference_request_failure{{model="m",reason="REJECTED",version="1"}} {shed}',
        f'nv_inference_request_failure{{model="m",reason="BACKEND",version="1"}} {other}']), "m")
    report = run_report(page(100, 10, 1), page(250, 60, 1))
    assert (report["requests"], report["failures"], report["rejected"]) == (200, 50, 50)
    assert report["shedRatio"] == 0.25
    assert run_report(page(5, 0, 0), page(5, 0, 0))["shedRatio"] is None


def test_load_shed_alike_on_both_tracks_is_not_the_canarys_fault():
    canary = track_window({}, {"c": shedding(1000, 0.30)})
    stable = track_window({}, {"s": shedding(9000, 0.30)})
    judged = judge(canary, stable, Bounds())
    assert judged.outcome == PASS, judged.summary
    assert "(300 shed)" in judged.summary and judged.metrics["canary"]["failureRatio"] == 0
    assert judged.metrics["canary"]["shedRatio"] == judged.metrics["stable"]["shedRatio"] == 0.3
    # Before shed was told apart, the same window failed: 30% > 1%.
    assert canary.failures / canary.requests > Bounds().max_failure_ratio


def test_a_canary_shedding_more_than_the_stable_fails_with_both_ratios():
    canary = track_window({}, {"c": shedding(1000, 0.30)})
    stable = track_window({}, {"s": shedding(9000, 0.02)})
    judged = judge(canary, stable, Bounds())
    assert (judged.outcome, judged.reason) == (FAIL, "CanarySheddingMoreThanStable")
    assert "canary shed 30.00% of its requests, the stable 2.00%: 28.00 points more > 2" in judged.summary
    assert judged.metrics["bounds"]["maxShedRatioVsStable"] == 0.02
    assert judge(canary, stable, Bounds(max_shed_ratio_vs_stable=None)).outcome == PASS, "off: not compared"
    assert judge(canary, stable, Bounds(max_shed_ratio_vs_stable=0.3)).outcome == PASS
    # A stable with too little traffic of its own is no yardstick.
    quiet = track_window({}, {"s": shedding(50, 0.0)})
    assert judge(canary, quiet, Bounds()).outcome == PASS


def test_a_shed_difference_within_chance_is_not_blamed_until_the_counts_say_so():
    # 5% against 2.5%: 2.5 points, over the 2-point bound, but at 200 canary requests chance alone
    # spreads that much (3 standard errors: 3.7 points).
    few = judge(track_window({}, {"c": shedding(200, 0.05)}), track_window({}, {"s": shedding(1800, 0.025)}), Bounds())
    assert few.outcome == PASS, few.summary
    many = judge(track_window({}, {"c": shedding(2000, 0.05)}), track_window({}, {"s": shedding(18000, 0.025)}),
                 Bounds())
    assert (many.outcome, many.reason) == (FAIL, "CanarySheddingMoreThanStable"), many.summary


def test_shed_requests_do_not_hide_a_broken_canary():
    # 30% shed on both; of the 700 the canary tried, 21 failed in its model: 3% > 1%.
    canary = track_window({}, {"c": shedding(1000, 0.30, broken=21)})
    stable = track_window({}, {"s": shedding(9000, 0.30)})
    judged = judge(canary, stable, Bounds())
    assert (judged.outcome, judged.reason) == (FAIL, "CanaryFailingRequests")
    assert "failure ratio 3.00% (not counting 300 shed) > 1.00%" in judged.summary


def test_a_canary_that_shed_nearly_everything_does_not_pass_on_latency_it_did_not_serve():
    # Both tracks shed 97%: nothing to blame the canary for, but its P99 and queue time are over
    # 30 requests; with the stable's comparison off, the P99 bound alone would have passed it.
    canary = track_window({}, {"c": shedding(1000, 0.97)})
    stable = track_window({}, {"s": shedding(9000, 0.97)})
    for bounds in (Bounds(), Bounds(max_shed_ratio_vs_stable=None, max_p99_vs_stable=None, max_p99_ms=50)):
        judged = judge(canary, stable, bounds)
        assert (judged.outcome, judged.reason) == (WAIT, "CanaryServedTooFew"), judged.summary
        assert "only 30 canary requests served, fewer than 100" in judged.summary
    # All shed: no P99 from Triton either, and still no pass.
    assert judge(track_window({}, {"c": shedding(1000, 1.0, p99_us=None)}), stable,
                 Bounds(max_shed_ratio_vs_stable=None)).outcome == WAIT


def test_a_window_started_before_shed_was_read_counts_none_shed():
    # The analysis baseline an operator before this one recorded has no "rejected".
    start = ModelCounters({"success": 100.0, "failure": 0.0, "executions": 10.0, "inferences": 100.0,
                           "queue_us": 1000.0}, {})
    now = counters(800, 300, 80, 800, 8000, rejected=300)
    window = track_window({"c": start}, {"c": now})
    assert (window.requests, window.failures, window.rejected) == (1000, 300, 0)
    # A reading of more shed than failed is not Triton's: at most the failures are shed.
    assert track_window({}, {"c": counters(10, 5, rejected=9)}).rejected == 5


def test_the_shed_bound_comes_from_the_spec_and_is_checked():
    import pydantic
    from rankops.api.rankingmodel import RankingModel
    from rankops.rollout.machine import analysis_bounds

    def spec(analysis):
        return {"metadata": {"name": "ctr", "namespace": "reco"},
                "spec": {"version": "1", "versions": [{"name": "1", "modelUri": "s3://m/1", "format": "onnx"}],
                         "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
                         "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}], "batching": {"maxBatchSize": 8},
                         "rollout": {"canary": {"analysis": analysis}}}}

    assert analysis_bounds(RankingModel.model_validate(spec({})).spec).max_shed_ratio_vs_stable == 0.02
    assert analysis_bounds(RankingModel.model_validate(spec({"maxShedRatioVsStable": None})).spec) \
        .max_shed_ratio_vs_stable is None
    assert analysis_bounds(RankingModel.model_validate(spec({"maxShedRatioVsStable": 0.1})).spec) \
        .max_shed_ratio_vs_stable == 0.1
    try:
        RankingModel.model_validate(spec({"maxShedRatioVsStable": 5}))
    except pydantic.ValidationError as exc:
        assert "maxShedRatioVsStable" in str(exc) and "less than or equal to 1" in str(exc)
    else:
        raise AssertionError("a shed ratio bound of 5 was accepted")
