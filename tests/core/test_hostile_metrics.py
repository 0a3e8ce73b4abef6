"""A tenant's pod answers what it likes on its metrics port: the operator's reader, parser and
decisions against endpoints that stall, flood, lie and crash (issue 36).

Each case runs a real TCP server on loopback and the operator's own reader
(rankops.triton.metrics.scrape, as controller/pod_metrics reads a pod), and asserts the time it
took, the memory it held, the reason it gives, and that no exception other than
MetricsUnavailable (MetricsRejected) comes out.
"""
from __future__ import annotations

import datetime as dt
import socket
import time
import tracemalloc

import pytest

from rankops.triton import metrics
from rankops.triton.metrics import MetricsRejected, MetricsUnavailable, parse, scrape
from tests.hostile import Endpoint, timed_with_stall

MODEL, VERSION = "ranker", "3"
GOOD = "\n".join([
    "# HELP nv_inference_request_success Number of successful inference requests",
    "# TYPE nv_inference_request_success counter",
    f'nv_inference_request_success{{model="{MODEL}",version="{VERSION}"}} 950',
    f'nv_inference_request_failure{{model="{MODEL}",reason="BACKEND",version="{VERSION}"}} 50',
    f'nv_inference_request_failure{{model="{MODEL}",reason="REJECTED",version="{VERSION}"}} 0',
    f'nv_inference_queue_duration_us{{model="{MODEL}",version="{VERSION}"}} 9500',
    f'nv_inference_request_summary_us{{model="{MODEL}",version="{VERSION}",quantile="0.99"}} 4100',
    # Triton (prometheus-cpp) writes an empty quantile as Nan; Prometheus writes NaN.
    f'nv_inference_request_summary_us{{model="{MODEL}",version="{VERSION}",quantile="0.5"}} Nan',
    'nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5', ""])


def http(body: bytes, head: str = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n") -> bytes:
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def send(payload: bytes):
    return lambda conn, stop: conn.sendall(payload)


def trickle(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    while not stop.is_set():
        conn.sendall(b"n")
        time.sleep(0.5)


def silent(conn, stop):
    stop.wait(30)


def endless(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    line = (f'nv_inference_request_success{{model="{MODEL}",version="{VERSION}"}} 1\n' * 1000).encode()
    while not stop.is_set():
        conn.sendall(line)


def short(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + GOOD.encode())


def label_line(size: int) -> bytes:
    return b'nv_inference_count{model="' + b"a" * size + b'"} 1\n'


CASES = {
    # name: (server behaviour, what the reason says)
    "trickles a byte every 0.5 s": (trickle, "no full answer in 2s"),
    "accepts and says nothing": (silent, "no full answer in 2s"),
    "an endless body": (endless, "body over 1024 KiB"),
    "a Content-Length of 200 MB": (send(b"HTTP/1.1 200 OK\r\nContent-Length: 200000000\r\n\r\nx"),
                                   "body over 1024 KiB (Content-Length 200000000)"),
    "a quoted 4 MB label": (send(http(label_line(4 << 20))), "body over 1024 KiB"),
    "a 70 KB header": (send(b"HTTP/1.1 200 OK\r\nX-Big: " + b"h" * 70_000 + b"\r\n\r\n"), "headers over 16 KiB"),
    "150 headers": (send(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n"),
                    "more than 64 headers"),
    "not HTTP": (send(b"SSH-2.0-OpenSSH_9.2\r\n\r\n"), "not an HTTP answer"),
    "garbage without an end of headers": (send(b"\x00\xff" * 100), "not an HTTP answer"),
    "closes at once": (send(b""), "closed without an answer"),
    "a short body": (short, "short body"),
    "a 302 redirect to another port": (send(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/metrics\r\n"
                                            b"Content-Length: 0\r\n\r\n"), "redirect (302)"),
    "HTTP 500": (send(http(b"oops", "HTTP/1.1 500 Internal Server Error\r\n")), "HTTP 500"),
    "chunked": (send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), "chunked"),
    "a NaN counter": (send(http(GOOD.replace("} 950", "} NaN").encode())), "not a 64-bit counter"),
    "an infinite counter": (send(http(GOOD.replace("} 950", "} +Inf").encode())), "not a 64-bit counter"),
    "a counter of 1e308": (send(http(GOOD.replace("} 950", "} 1e308").encode())), "not a 64-bit counter"),
    "a negative counter": (send(http(GOOD.replace("} 950", "} -5").encode())), "not a 64-bit counter"),
    "a duplicated exporter": (send(http((GOOD + GOOD).encode())), "duplicate series"),
    "a value that is not a number": (send(http(GOOD.replace("} 950", "} 0x10").encode())), "is not a number"),
    "a 1 MB unquoted label": (send(http(b"nv_inference_count{" + b"a" * ((1 << 20) - 100) + b" 1\n")),
                              "has no quoted value"),
    "an unterminated label value": (send(http(b'nv_inference_count{model="ranker} 1\n')), "unterminated label value"),
    "an escaped label value": (send(http(b'nv_inference_count{model="r\\"a",version="3"} 1\n')), "escaped label value"),
    # The shed count is a failure series like the others: a forged one rejects the reading.
    "a negative shed counter": (send(http(GOOD.replace('reason="REJECTED",version="3"} 0',
                                                       'reason="REJECTED",version="3"} -7').encode())),
                                "not a 64-bit counter"),
    "a shed series given twice": (send(http(GOOD.replace(
        f'nv_inference_queue_duration_us', f'nv_inference_request_failure{{version="{VERSION}",reason="REJECTED",'
        f'model="{MODEL}"}} 900\nnv_inference_queue_duration_us').encode())), "duplicate series"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_endpoint_costs_a_bounded_read_and_gives_a_reason(case):
    behave, reason = CASES[case]
    server = Endpoint(behave)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(MetricsUnavailable) as raised:
            scrape(f"127.0.0.1:{server.port}", MODEL, VERSION)
        took = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        server.close()
    assert reason in str(raised.value), str(raised.value)
    assert f"127.0.0.1:{server.port}" in str(raised.value) or isinstance(raised.value, MetricsRejected)
    # One deadline for the whole read (2 s), whatever the pod does; the body cap bounds memory.
    assert took < metrics.READ_DEADLINE_S + 1.0, f"{case}: {took:.2f}s"
    assert peak < 8 * metrics.MAX_BODY_BYTES, f"{case}: {peak / 1e6:.1f} MB held"


def test_a_refused_connection_is_a_reason():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(MetricsUnavailable, match=f"127.0.0.1:{port}"):
        scrape(f"127.0.0.1:{port}", MODEL, VERSION)


def test_an_honest_endpoint_is_read_with_its_versions_series_only():
    server = Endpoint(send(http(GOOD.encode())))
    try:
        counters = scrape(f"127.0.0.1:{server.port}", MODEL, VERSION)
    finally:
        server.close()
    assert counters.seen and counters.values["success"] == 950 and counters.values["failure"] == 50
    assert counters.values["rejected"] == 0, "BACKEND failures are not shed"
    assert counters.quantiles_us == {0.99: 4100.0}   # the empty (NaN) quantile is no value


def test_another_versions_or_models_series_are_not_the_reading_and_say_what_was_there():
    # A second loaded version (what an in-place switch makes routine) is not summed into this one.
    other_version = GOOD.replace(f'version="{VERSION}"', 'version="2"')
    both = parse(GOOD + other_version, MODEL, VERSION)
    assert both.values["success"] == 950
    only_other = parse(other_version, MODEL, VERSION)
    assert not only_other.seen and "only for version(s) 2, not 3" in only_other.note
    assert "none of model ranker" in parse(GOOD.replace(MODEL, "other"), MODEL, VERSION).note
    assert "not Prometheus text" in parse("<html><body>login</body></html>", MODEL, VERSION).note
    assert parse("", MODEL, VERSION).note == "an empty metrics page"


ADVERSARIAL_LINES = {
    "unquoted run of word characters": "nv_inference_count{" + "a" * (1 << 20) + " 1",
    "quoted 1 MB value": 'nv_inference_count{model="' + "a" * (1 << 20) + '"} 1',
    "escaped quotes": 'nv_inference_count{model="' + '\\"' * (1 << 19) + '"} 1',
    "a million-digit value": f'nv_inference_count{{model="{MODEL}",version="{VERSION}"}} ' + "1" * (1 << 20),
    "many labels": "nv_inference_count{" + 'a="b",' * (1 << 17) + "} 1",
    "other name, 1 MB": "x{" + "a" * (1 << 20) + " 1",
    "backslashes": "\\" * (1 << 20) + '"',
    "32k duplicate lines": f'nv_inference_count{{model="{MODEL}",version="{VERSION}"}} 1\n' * (1 << 15),
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL_LINES))
def test_the_parser_is_linear_and_never_holds_the_process(case):
    """A thread ticking every millisecond sees no gap as long as the old label regex's (seconds on
    16 KB): the parser never holds the GIL through a long scan. Its time: benchmarks/metrics_bench.py."""
    text = ADVERSARIAL_LINES[case]

    def parse_it():
        try:
            parse(text, MODEL, VERSION)
        except MetricsRejected:
            pass
    took, stall = timed_with_stall(parse_it)
    assert took < 2.0, f"{case}: {took:.2f}s"
    assert stall < 0.5, f"{case}: the process stood still {stall * 1000:.0f} ms"


# -- the decisions, on what the reader gives --------------------------------------------------------

def _counters(success, failure=0.0, queue_us=0.0, p99_us=None):
    from rankops.triton.metrics import ModelCounters
    return ModelCounters({"success": success, "failure": failure, "queue_us": queue_us},
                         {0.99: p99_us} if p99_us else {})


def test_a_canary_with_an_unread_pod_gets_no_verdict_even_when_the_rest_passes():
    from rankops.rollout.canary_analysis import WAIT, Bounds, judge, track_window
    canary = track_window({}, {"c0": _counters(500, 0, p99_us=4000)}, unread=["c1 (127.0.0.9): no full answer in 2s"])
    stable = track_window({}, {"s0": _counters(1000, 0, p99_us=4000)})
    judged = judge(canary, stable, Bounds())
    assert (judged.outcome, judged.reason) == (WAIT, "CanaryPodsNotRead")
    assert "c1 (127.0.0.9): no full answer in 2s" in judged.summary


def test_a_canary_held_to_the_stable_is_not_passed_when_the_stable_is_unread():
    from rankops.rollout.canary_analysis import PASS, WAIT, Bounds, judge, track_window
    canary = track_window({}, {"c0": _counters(500, 0, p99_us=9000)})
    unread = track_window({}, {}, unread=["s0 (127.0.0.2): body over 1024 KiB"])
    judged = judge(canary, unread, Bounds(max_p99_vs_stable=1.5))
    assert (judged.outcome, judged.reason) == (WAIT, "StablePodsNotRead")
    # Read, with no latency summary while it has traffic: the comparison cannot be made either.
    no_p99 = track_window({}, {"s0": _counters(1000, 0)})
    assert judge(canary, no_p99, Bounds(max_p99_vs_stable=1.5)).reason == "StableP99Unknown"
    # The shed ratio is held to the stable's too (on by default): an unread stable is no yardstick.
    assert judge(canary, unread, Bounds(max_p99_vs_stable=None)).reason == "StablePodsNotRead"
    # Without a bound relative to the stable, the stable's pods are not needed.
    assert judge(canary, unread, Bounds(max_p99_vs_stable=None, max_shed_ratio_vs_stable=None)).outcome == PASS


def test_a_failing_canary_is_failed_even_with_pods_unread():
    from rankops.rollout.canary_analysis import FAIL, Bounds, judge, track_window
    canary = track_window({}, {"c0": _counters(950, 50)}, unread=["c1: silent"])
    assert judge(canary, track_window({}, {}), Bounds()).outcome == FAIL


def test_counters_that_jump_beyond_what_a_pod_can_serve_are_not_summed():
    from rankops.rollout.canary_analysis import FAIL, WAIT, Bounds, judge, track_window
    before = {"c0": _counters(0), "c1": _counters(0)}
    # c1 forges 10^12 successes in 60 s to hide c0's 5% failures.
    after = {"c0": _counters(950, 50), "c1": _counters(1e12)}
    window = track_window(before, after, seconds={"c0": 60.0, "c1": 60.0})
    assert window.requests == 1000 and len(window.unread) == 1 and "not a reading" in window.unread[0]
    assert judge(window, track_window({}, {}), Bounds()).outcome == FAIL
    honest = track_window(before, {"c0": _counters(1000), "c1": _counters(1e12)}, seconds={"c0": 60.0, "c1": 60.0})
    assert judge(honest, track_window({}, {}), Bounds()).outcome == WAIT


def _spec(**autoscaling):
    import copy

    from rankops.api.rankingmodel import RankingModelSpec
    from tests.core.test_render_is_the_plan import SMALL
    return RankingModelSpec.model_validate({**copy.deepcopy(SMALL), "autoscaling": {
        "enabled": True, "mode": "rankops", "minReplicas": 1, "maxReplicas": 8, "capacityPerReplicaQps": 100,
        **autoscaling}})


def _at(second):
    return dt.datetime(2026, 12, 3, 12, 0, second, tzinfo=dt.timezone.utc)


def test_an_unread_pod_holds_a_scale_down_and_a_forged_jump_scales_nothing_up():
    from rankops import autoscale
    spec = _spec(scaleDownStabilizationSeconds=0)
    first = autoscale.step(spec, None, {"a": autoscale.pod_reading(0, 0, _at(0)), "b": autoscale.pod_reading(0, 0, _at(0))},
                           4, 0, _at(0), deployment_replicas=4)
    # 10 s later only pod a answers, with almost no load: b may carry the load that keeps 4 replicas.
    quiet = autoscale.step(spec, first.status, {"a": autoscale.pod_reading(10, 0, _at(10))}, 4, 0, _at(10),
                           deployment_replicas=4, problems=("b (127.0.0.3): no full answer in 2s",))
    assert quiet.replicas == 4 and quiet.status.reason == "ScaleDownHeld"
    assert "b (127.0.0.3): no full answer in 2s" in quiet.status.message
    # Read again, both quiet: now it scales down.
    both = autoscale.step(spec, quiet.status, {"a": autoscale.pod_reading(20, 0, _at(20)),
                                               "b": autoscale.pod_reading(10, 0, _at(20))}, 4, 0, _at(20))
    assert both.replicas < 4
    # A pod whose counter jumps by 10^12 in 10 s is not load: no scale-up, and said.
    forged = autoscale.step(spec, both.status, {"a": autoscale.pod_reading(30, 0, _at(30)),
                                                "b": autoscale.pod_reading(1e12, 0, _at(30))}, 4, 0, _at(30))
    assert forged.replicas <= both.replicas and "not a reading" in forged.status.message


def test_a_stored_reading_that_is_not_a_number_counts_from_the_next_one():
    from rankops import autoscale
    before = {"a": {"requests": None, "queueUs": 0, "at": "2026-12-03T12:00:00Z"},
              "b": {"requests": float("nan"), "queueUs": 0, "at": "2026-12-03T12:00:00Z"},
              "c": {"requests": "12", "queueUs": 0, "at": "2026-12-03T12:00:00Z"},
              "d": {"requests": 100, "queueUs": 0, "at": "2026-12-03T12:00:00Z"}}
    after = {pod: autoscale.pod_reading(1_000_000, 0, _at(10)) for pod in "abc"}
    after["d"] = autoscale.pod_reading(200, 0, _at(10))
    assert autoscale.rate(before, after)[:3] == (10.0, 0.0, 1)


# -- the reader, off the reconcile --------------------------------------------------------------------

def test_a_model_whose_pods_stall_holds_no_reconcile_and_at_most_its_share_of_readers():
    from rankops.controller.pod_metrics import PodMetrics, Target
    stalled = Endpoint(silent)
    honest = Endpoint(send(http(GOOD.encode())))
    kicked: list = []
    reader = PodMetrics(kick=kicked.append, threads=4, per_model=2)
    try:
        hostile = [Target("stable", f"h{i}", "127.0.0.1", VERSION, stalled.port) for i in range(6)]
        started = time.monotonic()
        assert reader.read("hostile", MODEL, hostile) == {}   # nothing yet; nothing waited for
        assert time.monotonic() - started < 0.1
        time.sleep(0.2)
        with reader._cond:
            assert len(reader._in_flight.get("hostile", ())) <= 2   # its share, not every reader
        started = time.monotonic()
        target = Target("stable", "ok", "127.0.0.1", VERSION, honest.port)
        assert reader.read("honest", MODEL, [target]) == {}
        while "honest" not in kicked and time.monotonic() - started < 5:
            time.sleep(0.01)
        # The honest model's read went past the stalled ones: well within one read deadline.
        assert time.monotonic() - started < 1.0, time.monotonic() - started
        answer = reader.read("honest", MODEL, [target])[target]
        assert answer.counters is not None and answer.counters.values["success"] == 950
        # The stalled reads end at their deadline, with a reason, and back off.
        time.sleep(metrics.READ_DEADLINE_S * 3 + 0.5)
        answers = reader.read("hostile", MODEL, hostile)
        assert len(answers) == 6 and all("no full answer in 2s" in a.problem for a in answers.values())
        with reader._cond:
            assert not reader._queued.get("hostile"), "failed pods wait for their backoff"
    finally:
        stalled.close()
        honest.close()


def _deployment(track, uid, version):
    return {"metadata": {"name": f"ranker-{track}", "uid": uid},
            "spec": {"template": {"metadata": {"labels": {"rankops.io/version": version}}}}}


class _Kube:
    """The two reads pod_metrics.read makes: the model's pods, and a ReplicaSet by name."""

    def __init__(self, pods, replica_sets, refuse=None):
        self.pods, self.replica_sets, self.refuse, self.gets = pods, replica_sets, refuse, 0

    def list(self, kind, namespace, labels=None):
        assert kind == "Pod" and labels == {"rankops.io/model": MODEL}
        return self.pods

    def get(self, kind, namespace, name):
        assert kind == "ReplicaSet"
        self.gets += 1
        if self.refuse:
            raise self.refuse
        return self.replica_sets.get(name)


def _serving_pod(name, track, port_owner, ip="127.0.0.1"):
    return {"metadata": {"name": name, "labels": {"rankops.io/track": track, "rankops.io/traffic": "on"},
                         "ownerReferences": [{"kind": "ReplicaSet", "name": port_owner, "uid": f"{port_owner}-uid",
                                              "controller": True}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_reconciles_read_of_stalling_and_lying_pods_is_bounded_and_gives_reasons(monkeypatch):
    """controller/pod_metrics.read as a reconcile calls it (no kick: reads at once, concurrently):
    a stalled pod and a lying one cost one deadline together, each named with its reason."""
    from rankops.controller import pod_metrics
    stalled, lying, honest = Endpoint(silent), Endpoint(send(http((GOOD + GOOD).encode()))), \
        Endpoint(send(http(GOOD.encode())))
    ports = {"s0": stalled.port, "s1": lying.port, "c0": honest.port}
    real = pod_metrics.serving_targets

    def on_test_ports(*args, **kwargs):   # each pod's metrics port is its test server's here
        targets, refused, foreign = real(*args, **kwargs)
        return [t.__class__(t.track, t.pod, t.address, t.version, ports[t.pod]) for t in targets], refused, foreign
    monkeypatch.setattr(pod_metrics, "serving_targets", on_test_ports)
    deployments = {"stable": _deployment("stable", "dep-stable", VERSION),
                   "canary": _deployment("canary", "dep-canary", "4")}
    replica_sets = {name: {"metadata": {"name": name, "uid": f"{name}-uid", "ownerReferences": [
        {"kind": "Deployment", "uid": dep, "controller": True}]}}
        for name, dep in (("rs-stable", "dep-stable"), ("rs-canary", "dep-canary"))}
    kube = _Kube([_serving_pod("s0", "stable", "rs-stable"), _serving_pod("s1", "stable", "rs-stable"),
                  _serving_pod("c0", "canary", "rs-canary")], replica_sets)
    reader = pod_metrics.PodMetrics()
    started = time.monotonic()
    try:
        snapshot = pod_metrics.read(kube, reader, ("reco", MODEL, "uid"), "reco", MODEL, deployments)
        took = time.monotonic() - started
        # Asked again: each ReplicaSet was read once.
        pod_metrics.read(kube, reader, ("reco", MODEL, "uid"), "reco", MODEL, deployments)
    finally:
        for server in (stalled, lying, honest):
            server.close()
    assert took < metrics.READ_DEADLINE_S + 1.0
    assert kube.gets == 2
    assert sorted(snapshot.unread["stable"]) == [
        f"s0 (127.0.0.1): 127.0.0.1:{ports['s0']}: no full answer in 2s",
        f"s1 (127.0.0.1): line 12 (nv_inference_request_success): duplicate series "
        f"\"{{'model': 'ranker', 'version': '3'}}\": two exporters, or not Triton"]
    # The canary pod serves version 4: its page has only version 3's series, and says so.
    assert snapshot.unread["canary"] == [f"c0 (127.0.0.1): no series of model ranker version 4 "
                                         f"(series of model ranker only for version(s) 3, not 4)"]
    assert not snapshot.readings["stable"] and not snapshot.readings["canary"]


def test_a_replicaset_the_operator_may_not_read_is_the_pods_reason_not_a_failed_reconcile():
    from rankops.controller import pod_metrics
    from rankops.controller.kube import ApiError
    kube = _Kube([_serving_pod("s0", "stable", "rs-stable")], {},
                 refuse=ApiError(403, "Forbidden"))
    snapshot = pod_metrics.read(kube, pod_metrics.PodMetrics(), ("reco", MODEL, "uid"), "reco", MODEL,
                                {"stable": _deployment("stable", "dep-stable", VERSION)})
    assert len(snapshot.unread["stable"]) == 1 and "replicasets get" in snapshot.unread["stable"][0]


# -- found in review: the real client, half rounds, kick loops, bloated pages, lookups ----------------

def test_the_operators_client_knows_replicasets():
    """The ownership check GETs ReplicaSets through the operator's own client: a kind it did not
    know refused every pod (the fakes above answer any kind)."""
    from rankops.controller.kube import KINDS
    assert KINDS["ReplicaSet"].path("reco", "ranker-stable-5d9f") == \
        "/apis/apps/v1/namespaces/reco/replicasets/ranker-stable-5d9f"


def test_a_round_half_in_is_no_reading_for_the_autoscaler():
    from rankops import autoscale
    from rankops.api.autoscaling import AutoscalingStatus
    from rankops.controller.pod_metrics import Snapshot
    previous = {pod: autoscale.pod_reading(1000, 0, _at(0)) for pod in "abc"}
    recorded = AutoscalingStatus(mode="rankops", reading=previous)
    snapshot = Snapshot()
    snapshot.readings["stable"] = {"a": (_counters(2000), _at(10)), "b": (_counters(2000), _at(10)),
                                   "c": (_counters(1000), _at(0))}
    assert autoscale.load_reading(snapshot, recorded)[0] is None, "c's load would be counted as nothing"
    snapshot.readings["stable"]["c"] = (_counters(2000), _at(11))
    reading, problems = autoscale.load_reading(snapshot, recorded)
    assert set(reading) == {"a", "b", "c"} and problems == ()


def test_a_slow_round_is_taken_once_and_kicks_no_more_reconciles(monkeypatch):
    """A round whose answers are stale by the time its kick runs a reconcile must not ask again from
    that reconcile (else: a kick every round, forever)."""
    from rankops.controller import pod_metrics
    from rankops.controller.pod_metrics import Answer, PodMetrics, Target

    def slow(target, model, deadline_s, now):
        time.sleep(0.3)
        return Answer(now() - dt.timedelta(seconds=10), _counters(1))   # stale as soon as it is in
    monkeypatch.setattr(pod_metrics, "read_target", slow)
    kicks: list = []
    targets = [Target("stable", f"p{i}", "127.0.0.1", VERSION) for i in range(3)]
    reader = PodMetrics(kick=lambda who: (kicks.append(who), reader.read(who, MODEL, targets)))
    reader.read("m", MODEL, targets)
    time.sleep(2.0)
    assert kicks == ["m"], kicks


def test_a_bloated_page_keeps_only_what_is_read():
    lines = [f'nv_inference_request_summary_us{{model="{MODEL}",version="{VERSION}",quantile="0.{i:07d}"}} 5'
             for i in range(1, 200)]
    kept = parse("\n".join(lines + [GOOD]), MODEL, VERSION)
    assert set(kept.quantiles_us) == {0.99}, "only Triton's quantiles are kept"
    more = [f'nv_inference_count{{model="{MODEL}",version="{VERSION}",x="{i}"}} 1' for i in range(300)]
    with pytest.raises(MetricsRejected, match="more than 256 series of model ranker"):
        parse("\n".join(more), MODEL, VERSION)


def test_a_replicaset_not_found_is_asked_again_after_a_while_not_every_reconcile():
    from rankops.controller.pod_metrics import MISS_S, PodMetrics
    now = {"t": 0.0}
    reader = PodMetrics(monotonic=lambda: now["t"])
    kube = _Kube([], {"rs": {"metadata": {"name": "rs", "uid": "rs-uid", "ownerReferences": [
        {"kind": "Deployment", "uid": "dep", "controller": True}]}}})
    owner = reader.replica_set_owner(kube, "reco")
    assert [owner("forged", "forged-uid") for _ in range(5)] == [None] * 5 and kube.gets == 1
    now["t"] += MISS_S
    assert owner("forged", "forged-uid") is None and kube.gets == 2
    assert [owner("rs", "rs-uid") for _ in range(3)] == ["dep"] * 3 and kube.gets == 3


def test_a_pod_of_the_previous_template_is_read_for_its_own_version():
    from rankops.controller.pod_metrics import serving_targets
    deployments = {"stable": _deployment("stable", "dep-stable", "4")}
    pod = _serving_pod("old", "stable", "rs-stable")
    pod["metadata"]["labels"]["rankops.io/version"] = "3"    # mid-rollout: the old ReplicaSet's pod
    targets, _, _ = serving_targets([pod], deployments, lambda name, uid: "dep-stable", [])
    assert [t.version for t in targets] == ["3"]
