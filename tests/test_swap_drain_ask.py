"""A swap's drain asks from the operator's side (controller/inplace_pods.Executor._drain and
server_switches.with_drain): what a router answers is kept only while it is known and fresh."""
from __future__ import annotations

import datetime as dt
import http.server
import json
import threading

import pytest

from rankops.controller.inplace_pods import DrainAnswer, Executor, PodTarget, no_gates
from rankops.controller.server_switches import with_drain
from rankops.rollout import inplace
from rankops.triton.repository import RepositoryError

TAKEN_AT = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)


class _Router(http.server.BaseHTTPRequestHandler):
    answers: list[tuple[int, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        code, body = self.answers.pop(0)
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def router():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_an_ask_that_fails_forgets_the_last_answer_so_a_drain_is_waited_out_in_full(router):
    pod = PodTarget("a", "uid-a", "127.0.0.1", 1, route_port=router.server_address[1])
    executor = Executor("coarse", {"a": pod}, None, gates=no_gates)
    _Router.answers[:] = [(200, json.dumps({"open": 0, "staged": [1, 2]}).encode()),
                          (503, b'{"error": "too many connections"}'), (200, b"not json")]
    executor._drain(pod, 0)
    assert executor.drain_answers()["a"].open == 0 and executor.drain_answers()["a"].staged == frozenset({1, 2})
    for _ in range(2):      # refused, then garbage: neither leaves the earlier "0 open" standing
        with pytest.raises(Exception):
            executor._drain(pod, 30)
        assert "a" not in executor.drain_answers()
    executor.close()


def test_only_an_answer_to_a_drain_asked_after_the_pod_was_taken_says_how_many_connections_are_open():
    record = inplace.Record(version="2", from_version="1", phase=inplace.LOADING, since=TAKEN_AT.isoformat(),
                            load_pod="a", load_since=TAKEN_AT.isoformat(), swap=True)
    index = inplace.PodIndex("a", "uid-a", True, {})
    before = DrainAnswer(30, TAKEN_AT - dt.timedelta(seconds=1), 0, frozenset({1}))
    not_draining = DrainAnswer(0, TAKEN_AT + dt.timedelta(seconds=1), 0, frozenset({1}))
    fresh = DrainAnswer(30, TAKEN_AT + dt.timedelta(seconds=1), 3, frozenset({1, 2}))
    assert with_drain(index, before, record).drain_open is None
    assert with_drain(index, not_draining, record).drain_open is None
    assert with_drain(index, fresh, record).drain_open == 3 and with_drain(index, fresh, record).staged == {1, 2}
    other = inplace.PodIndex("b", "uid-b", True, {})
    assert with_drain(other, fresh, record).drain_open is None, "another pod's count is no evidence"
    with pytest.raises(RepositoryError):
        DrainAnswer.parse({"open": True}, 30, TAKEN_AT)
