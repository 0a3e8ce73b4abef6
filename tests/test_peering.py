"""The standby replica's pure parts: which kopf peering objects `rankops run --peering` needs
(the e2e test, e2e/test_standby.py, runs two replicas for real)."""
from __future__ import annotations

from rankops.cli import build_parser
from rankops.controller import peering


def test_cluster_wide_needs_one_cluster_peering_and_namespaced_one_per_namespace():
    assert peering.peering_objects("rankops-operator", []) == [
        (None, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "rankops-operator"}})]
    objs = peering.peering_objects("p", ["reco", "ads"])
    assert [(ns, o["kind"], o["metadata"]) for ns, o in objs] == [
        ("reco", "KopfPeering", {"name": "p", "namespace": "reco"}),
        ("ads", "KopfPeering", {"name": "p", "namespace": "ads"})]


def test_replicas_draw_distinct_positive_priorities():
    drawn = {peering.random_priority() for _ in range(200)}
    assert len(drawn) == 200 and all(1 <= p <= peering.MAX_PRIORITY for p in drawn)


def test_run_flags_default_to_standalone():
    args = build_parser().parse_args(["run"])
    assert args.peering is None and args.priority is None and args.peering_lifetime == 30
    args = build_parser().parse_args(["run", "--peering", "x", "--priority", "0", "--peering-lifetime", "10"])
    assert (args.peering, args.priority, args.peering_lifetime) == ("x", 0, 10)


def _kopf_peering_source() -> str:
    import inspect

    from kopf._core.engines import peering as kopf_peering
    return inspect.getsource(kopf_peering)


def test_the_pause_state_follows_kopfs_own_pause_and_resume_lines():
    import logging

    source = _kopf_peering_source()   # the words this follows are kopf's: a kopf that changes them fails here
    assert all(f'f"{words}' in source for words in (*peering.PAUSING, peering.RESUMING)), \
        "kopf's peering no longer logs its pauses as PauseState expects"
    state = peering.PauseState()
    logger = logging.getLogger(peering.KOPF_PEERING_LOGGER)
    try:
        peering.follow_pauses(state)
        assert state.paused, "a peered operator starts paused"
        logger.info("Resuming operations after the pause. Conflicting operators with the same priority are gone.")
        assert not state.paused
        logger.info("Pausing operations in favour of [<Peer other: priority=7>].")
        assert state.paused
        logger.info("Resuming operations after the pause. Conflicting operators with the same priority are gone.")
        logger.warning("Possibly conflicting operators with the same priority: [...].")
        assert not state.paused, "a warning alone does not pause"
        logger.warning("Pausing all operators, including self: [...]")
        assert state.paused
    finally:
        logger.removeFilter(state)
    assert not peering.PauseState().paused, "standalone: never paused"


def test_a_paused_replica_kicks_nothing_not_even_a_retry():
    import threading
    import time

    from rankops.controller.workqueue import WorkQueue

    state = peering.PauseState()
    runs, failed = [], threading.Event()

    def run(key):
        runs.append(key)
        if len(runs) == 1:
            failed.set()
            raise RuntimeError("API said 500")

    kicks = WorkQueue(run, workers=2, retry_s=0.3, paused=lambda: state.paused)
    kicks.kick("m")
    assert failed.wait(5)
    state.set(True)            # paused before its retry timer fires
    kicks.kick("n")
    time.sleep(0.6)
    assert runs == ["m"], "the retry and the new kick ran on a standby"
    state.set(False)          # resumed: kicks act again
    kicks.kick("n")
    deadline = time.monotonic() + 5
    while runs == ["m"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runs == ["m", "n"]


def test_a_kick_queued_before_the_pause_does_not_run_after_it():
    import time

    from rankops.controller.workqueue import WorkQueue

    state, runs = peering.PauseState(), []
    kicks = WorkQueue(runs.append, workers=2, delay_s=0.2, paused=lambda: state.paused)
    kicks.kick("m")
    state.set(True)
    time.sleep(0.5)
    assert runs == []
