"""The shared server's shell for its pods (controller/shared_pods.py): what it remembers per pod
and member for the plan (a load refused for missing files is a bounded wait, any other refusal a
failure with a backoff, a member that leaves is forgotten, a load never answered counts once the
index shows it), and reads bounded against pods that accept and never answer."""
from __future__ import annotations

import datetime
import threading
import time

from hostile import Endpoint

from rankops.controller.shared_pods import PodRecord, ServerPod, ServerPods
from rankops.controller.workqueue import RETRY_FIRST_S
from rankops.triton.repository import IndexEntry, RepositoryError

NOT_STAGED = "load of ghost refused: failed to poll from model repository"
REFUSED = "load of bad refused: unexpected inference output 'score'"


def test_a_load_refused_for_missing_files_waits_then_fails_and_backs_off():
    record = PodRecord()
    record.after_load("ghost", "d1", now=0.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    record.after_load("ghost", "d1", now=20.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    assert record.staging_over(["ghost"], 20.0, 30) == frozenset() and record.retry(["ghost"], 20.0) == {"ghost"}
    assert record.load_errors == {"ghost": NOT_STAGED} and record.next_due(["ghost"], 30, 20.0) == 30.0
    # the wait counts from the first refusal, not the last: over at 30 s, then a failure like any
    assert record.staging_over(["ghost"], 30.0, 30) == {"ghost"}
    record.after_load("ghost", "d1", now=31.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    assert record.retry(["ghost"], 31.0 + RETRY_FIRST_S - 0.1) == frozenset()
    assert record.retry(["ghost"], 31.0 + RETRY_FIRST_S) == {"ghost"}
    # what is over is not due again: no reconcile is asked for until a load is answered
    assert record.next_due(["ghost"], 30, 31.0) == 31.0 + RETRY_FIRST_S
    assert record.next_due(["ghost"], 30, 31.0 + RETRY_FIRST_S) is None


def test_the_stager_fetches_one_member_after_another_so_later_ones_wait_longer():
    record = PodRecord()
    for member in ("first", "third"):
        record.after_load(member, "d", now=0.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    order = ["first", "second", "third"]
    assert record.staging_over(order, 30.0, 30) == {"first"}
    assert record.staging_over(order, 89.0, 30) == {"first"}
    assert record.staging_over(order, 90.0, 30) == {"first", "third"}


def test_failures_in_a_row_double_the_wait_and_a_load_that_takes_starts_over():
    record = PodRecord(retry_first_s=1.0, retry_cap_s=4.0)
    waits = []
    for now in (0.0, 10.0, 20.0, 30.0):
        record.after_load("bad", "d1", now=now, error=REFUSED)
        waits.append(record.retry_at["bad"] - now)
    assert waits == [1.0, 2.0, 4.0, 4.0] and record.refused == {"bad": "d1"}
    assert record.retry(["bad", "good"], 31.0) == {"good"}, "per member"
    record.after_load("bad", "d2", now=40.0)
    assert record.load_errors == {} and record.loaded == {"bad": "d2"} and record.retry(["bad"], 40.0) == {"bad"}
    record.after_load("bad", "d2", now=50.0, error=REFUSED)
    assert record.retry_at["bad"] - 50.0 == 1.0, "a success starts the backoff over"
    # a refusal that is not for missing files ends any wait for them
    record.after_load("bad", "d2", now=60.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    record.after_load("bad", "d2", now=61.0, error=REFUSED)
    assert record.waiting_since == {}


def test_a_member_that_leaves_is_forgotten_and_comes_back_afresh():
    record = PodRecord()
    record.after_load("m", "d1", now=0.0, error=REFUSED)
    record.after_load("w", "d1", now=0.0, error=NOT_STAGED, staging=True, staging_wait_s=30)
    record.keep_only(["other"])
    assert (record.load_errors, record.retry_at, record.waiting_since, record.refused) == ({}, {}, {}, {})
    assert record.retry(["m"], 0.0) == {"m"} and record.next_due(["m", "w"], 30, 0.0) is None


class FakeTriton:
    """A pod's repository API as the shell sees it: an index, and loads answered as told."""

    def __init__(self):
        self.index: list[IndexEntry] = []
        self.answer = None                    # None: loaded; a RepositoryError: refused; another: no answer
        self.loads: list[str] = []

    def __call__(self, pod):
        return self

    def index_(self, deadline_s):
        return list(self.index)

    def load(self, model, config=None, deadline_s=0):
        self.loads.append(model)
        if self.answer is not None:
            raise self.answer


class Shell(ServerPods):
    def __init__(self, triton: FakeTriton, **kw):
        super().__init__(None, staging_wait_s=30, clock=lambda: self.now, **kw)
        self.now, self.triton = 100.0, triton

    def _repository(self, pod):
        triton = self.triton
        return type("Repo", (), {"index": lambda _s, deadline_s: triton.index_(deadline_s),
                                 "load": lambda _s, model, config=None, deadline_s=0: triton.load(model, config),
                                 "unload": lambda _s, model, deadline_s=0: None})()


POD = ServerPod("p0", "u0", "10.0.0.1", True)


def _view(shell: Shell, members=("m",)):
    return shell.read([POD], list(members))[0]


def test_a_load_never_answered_is_no_refusal_and_counts_once_the_index_shows_it():
    triton = FakeTriton()
    shell = Shell(triton)
    try:
        triton.answer = TimeoutError("no answer within its deadline")
        _view(shell)
        shell._load(POD, "m", "name: 'm'", "d1")
        view = _view(shell)
        assert view.load_errors == {} and view.loaded == {} and view.retry == {"m"}
        triton.index = [IndexEntry("m", 1, "READY", "")]
        assert _view(shell).loaded == {"m": "d1"}, "Triton went on and loaded it: its config is d1"
        # refused: said, with the digest refused, and the next try due after the backoff
        triton.answer = RepositoryError(REFUSED)
        shell._load(POD, "m", "name: 'm'", "d2")
        view = _view(shell)
        assert view.load_errors == {"m": REFUSED} and view.refused == {"m": "d2"} and view.retry == frozenset()
        assert shell.next_due_s() == RETRY_FIRST_S
        # the member leaves: forgotten
        assert _view(shell, ("other",)).load_errors == {} and shell.next_due_s() is None
    finally:
        shell.close()


def test_a_load_answered_after_the_read_is_not_sent_again_and_on_done_is_told():
    from tests.core.test_server_plan import member, plan

    triton, done = FakeTriton(), threading.Event()
    shell = Shell(triton, on_done=done.set)
    try:
        planned = shell.round(lambda pods: plan([member("coarse")], pods), [POD], ["coarse"])
        assert planned.actions["p0"].load == ("coarse",)
        shell.settle(5)
        assert done.is_set() and triton.loads == ["coarse"]
        # planned again from an index read before the load was answered: not sent twice
        shell.execute(planned)
        shell.settle(5)
        assert triton.loads == ["coarse"]
    finally:
        shell.close()


def test_pods_that_never_answer_cost_the_read_its_deadline_whatever_their_count():
    def stall(conn, stop):
        stop.wait(30)
    stalled = Endpoint(stall)
    shell = ServerPods(None, staging_wait_s=30, index_deadline_s=0.5, workers=1)
    try:
        pods = [*(ServerPod(f"p{i}", f"u{i}", "127.0.0.1", True, port=stalled.port) for i in range(3)),
                ServerPod("p8", "u8", "127.0.0.1", False, port=stalled.port),        # not ready: not asked
                ServerPod("p9", "u9", "", True, port=stalled.port)]                    # no address yet
        began = time.monotonic()
        views = shell.read(pods, ["m"])
        took = time.monotonic() - began
    finally:
        stalled.stop.set()
        shell.close()
    assert took < 0.5 + 1.0 + 1.0, took
    assert [v.index for v in views] == [None] * 5
    assert all(v.index_error for v in views[:3]) and not views[3].index_error and not views[4].index_error


def test_a_new_process_takes_the_config_a_serving_member_loaded_from_the_server_s_status():
    """After a restart no record says what config a pod loaded: the status's digest does, so an edit
    made meanwhile is loaded; a member the status says nothing of is left as it is."""
    triton = FakeTriton()
    triton.index = [IndexEntry("m", 1, "READY", ""), IndexEntry("n", 1, "READY", "")]
    shell = Shell(triton)
    try:
        view = shell.read([POD], ["m", "n"], {"m": "d0"})[0]
    finally:
        shell.close()
    assert view.loaded == {"m": "d0"}


AT = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.timezone.utc)


def metrics_page(body: str):
    def answer(conn, stop):
        data = body.encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    return answer


def test_the_load_read_takes_each_members_requests_bounded_against_pods_that_stall_or_lie():
    """Per member, success + failure; a page that stalls costs its deadline, one that is not Triton's
    is named, a pod past the most asked is counted as not asked, a pod not ready is not asked."""
    good = Endpoint(metrics_page('nv_inference_request_success{model="coarse",version="1"} 90\n'
                                 'nv_inference_request_failure{model="coarse",reason="REJECTED",version="1"} 10\n'
                                 'nv_inference_request_success{model="fine",version="1"} 5\n'
                                 'nv_inference_request_success{model="stranger",version="1"} 7\n'))
    liar = Endpoint(metrics_page('nv_inference_request_success{model="coarse",version="1"} -1\n'))
    stalled = Endpoint(lambda conn, stop: stop.wait(30))
    shell = ServerPods(None, staging_wait_s=30, index_deadline_s=0.5, workers=2)
    try:
        pods = [ServerPod("a", "ua", "127.0.0.1", True, metrics_port=good.port),
                ServerPod("b", "ub", "127.0.0.1", True, metrics_port=liar.port),
                ServerPod("c", "uc", "127.0.0.1", True, metrics_port=stalled.port),
                ServerPod("d", "ud", "127.0.0.1", False, metrics_port=good.port),
                ServerPod("e", "ue", "127.0.0.1", True, metrics_port=good.port)]
        began = time.monotonic()
        reading, problems, not_asked = shell.read_load(pods, ["coarse", "fine", "rerank"], now=lambda: AT, most=3)
        took = time.monotonic() - began
    finally:
        for endpoint in (good, liar, stalled):
            endpoint.close()
        shell.close()
    assert took < 0.5 + 1.0 + 1.0, took
    assert reading == {"a": {"at": "2026-12-06T12:00:00Z", "requests": {"coarse": 100.0, "fine": 5.0},
                             "rejected": {"coarse": 10.0}}}
    assert [p.split(":")[0] for p in problems] == ["b", "c"] and "not a 64-bit counter" in problems[0]
    assert not_asked == 1      # e: past the 3 asked (d is not ready)
