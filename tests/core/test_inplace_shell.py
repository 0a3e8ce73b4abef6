"""Issue 41: the in-place shell's bookkeeping (controller/inplace_shell.py): one executor per model
and attempt, let go when the switch ends or the model goes, and a status it wrote read back."""
from __future__ import annotations

from rankops.api.rankingmodel import InPlaceSwitchStatus, RankingModel
from rankops.controller import inplace_shell
from rankops.controller.inplace_pods import PodTarget
from rankops.controller.model_memory import ModelMemory
from rankops.rollout import inplace
from test_inplace_rollout import model

RM = RankingModel.model_validate({**model().model_dump(by_alias=True), "metadata": {
    "name": "ctr", "namespace": "reco", "uid": "uid-1"}})


def _record(phase: str) -> InPlaceSwitchStatus:
    # as status holds it: with what the pods said last beside the switch's own record
    return InPlaceSwitchStatus.model_validate({"version": "2", "fromVersion": "1", "phase": phase,
                                               "since": "2026-12-05T12:00:00Z", "servedBy": "2 on 0/4 pods, 1 on 4/4"})


def test_a_status_the_shell_wrote_is_read_back_and_its_actions_start():
    memory = ModelMemory()
    executor = inplace_shell.executor_of(memory, "uid-1", "ctr", "a1")
    sent = []
    executor._load = lambda pod, keep: sent.append((pod.name, keep))   # no pod here: what would be sent
    executor.pods = {"ctr-stable-a": PodTarget("ctr-stable-a", "u-a", "10.0.0.1", 8000)}
    inplace_shell.execute(memory, RM, _record("Loading"),
                          (inplace.Load("ctr-stable-a", "2", ("1", "2")), inplace.Load("ctr-stable-gone", "2", ("2",))),
                          "a1")
    executor.settle(5)
    assert sent == [("ctr-stable-a", ("1", "2"))] and executor.errors == {}


def test_one_executor_per_attempt_let_go_when_the_switch_ends():
    memory = ModelMemory()
    first = inplace_shell.executor_of(memory, "uid-1", "ctr", "a1")
    assert inplace_shell.executor_of(memory, "uid-1", "ctr", "a1") is first
    first.verdicts[("warmup", "2")] = inplace.GateVerdict("pass", "warm", "u-a")
    second = inplace_shell.executor_of(memory, "uid-1", "ctr", "a2")     # another attempt: no verdict carried
    assert second is not first and second.gate_verdicts("2") == {} and first.closed
    inplace_shell.execute(memory, RM, _record("Switched"), (inplace.RemoveFiles("ctr-stable-a", "1"),), "a2")
    assert "uid-1" not in memory.in_place and second.closed


def test_a_pod_that_refuses_the_key_is_said_so_by_type_not_by_its_words():
    from rankops.controller.inplace_pods import Executor
    from test_repository_client import http, send
    from tests.hostile import Endpoint

    refused = Endpoint(send(http(b'{"error":"This API is restricted, expecting header \'rankops-api-key\'"}',
                                 "HTTP/1.1 403 Forbidden\r\n")))
    other = Endpoint(send(http(b'{"error": "403 restricted 401"}', "HTTP/1.1 400 Bad Request\r\n")))
    pods = {"a": PodTarget("a", "u-a", "127.0.0.1", refused.port), "b": PodTarget("b", "u-b", "127.0.0.1", other.port)}
    executor = Executor("ctr", pods, stage=None, gates=None)
    try:
        a, b = executor.read()
        assert a.key_refused and a.versions is None and "restricted" in a.unread
        assert not b.key_refused and b.versions is None      # its words mention 403: not a refused key
    finally:
        executor.close()
        refused.close()
        other.close()
