"""A member's version switch inside a shared server's running pods (server_switch.py through
serverplan.plan_server), pure: begun when spec.version is not the held version, loaded beside it in
one pod, gated there, loaded pod by pod, the held version unloaded last; or stopped (memory, a gate)
with the held version serving. Each round is fed what the previous one asked, as the shell would read it."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json

from rankops import serverplan
from rankops.fetcher.members import parse_members
from rankops.render.serving import pool_placement
from rankops.render.shared_server import MEMBERS_KEY
from rankops.rollout import inplace
from rankops.server_switch import SwitchSeen
from rankops.serverplan import PodView, plan_server
from rankops.triton.repository import IndexEntry
from tests.core.test_server_plan import SERVER, member

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
PODS = ("ranking-shared-a", "ranking-shared-b")


def entry(version: int, state: str = "READY", reason: str = "") -> IndexEntry:
    return IndexEntry("coarse", version, state, reason)


def pods(holding: dict[str, tuple[IndexEntry, ...]]) -> list[PodView]:
    return [PodView(name, True, f"10.0.0.{i}", None, (*holding[name], IndexEntry("fine", 1, "READY", "")),
                    uid=f"uid-{name}") for i, name in enumerate(PODS, 1)]


STAGED = frozenset({1, 2, 3})    # the version directories on each pod's volume, as its router says (a swap's)


def seen(holding: dict[str, tuple[IndexEntry, ...]], gates=None, p99: float | None = 5.0, staged=STAGED) -> SwitchSeen:
    return SwitchSeen(tuple(inplace.PodIndex(name, f"uid-{name}", True,
                                             {e.version: inplace.VersionState(e.state, e.reason) for e in holding[name]},
                                             staged=staged, drain_open=0)
                            for name in PODS), gates or {}, p99)


def round_(held: str, record, holding, gates=None, p99=5.0, version="2", weights_mib=2000, server=SERVER,
           manual=None, acted=None, now=NOW, staged=STAGED):
    coarse = dataclasses.replace(member("coarse", weights_mib, held=held, version=version), switch=record,
                                 manual=manual or {}, acted=acted or {})
    members = [coarse, member("fine", held="1")]
    return plan_server("ranking", "reco", server, members, pods(holding), {}, pool_placement(None, None),
                       switch_seen={"coarse": seen(holding, gates, p99, staged)} if record is not None else None,
                       now=now)


def staged_versions(result) -> list[int]:
    config_map = next(o for o in result.objects if o["kind"] == "ConfigMap")
    entry_, = [m for m in parse_members(config_map["data"][MEMBERS_KEY], "ranking") if m.model == "coarse"]
    return [v.dir for v in entry_.versions]


def line(result):
    return next(o for o in result.members if o.name == "coarse")


def test_a_new_version_is_loaded_beside_gated_in_one_pod_then_loaded_everywhere_and_the_old_one_unloaded():
    both = {p: (entry(1),) for p in PODS}
    begun = round_("1", None, both)
    switch = begun.switches["coarse"]
    assert switch.record.phase == inplace.LOADING and switch.held == "1" and not switch.actions
    assert [e.reason for e in switch.events] == ["InPlaceSwitchStarted"] and "coarse:" in switch.events[0].message
    assert staged_versions(begun) == [1, 2], "the incoming version's files are listed beside the held one's"
    assert line(begun).version == "1" and line(begun).state == serverplan.SERVING

    loading = round_("1", switch.record, both)
    assert loading.switches["coarse"].actions == (inplace.Load(PODS[0], "2", ("1", "2")),)
    assert "coarse" in loading.switch_configs
    assert all(a.nothing for a in loading.actions.values()), "the server's own loads leave a switching member alone"

    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    gating = round_("1", loading.switches["coarse"].record, one)
    assert gating.switches["coarse"].record.phase == inplace.GATING
    assert gating.switches["coarse"].actions == (inplace.RunGate("warmup", PODS[0], "2"),)
    assert all(a.nothing for a in gating.actions.values()), "two versions READY: no reload drops either"
    assert line(gating).state == serverplan.SERVING

    passed = {g: inplace.GateVerdict("pass", "ok", f"uid-{PODS[0]}") for g in ("warmup", "equivalence")}
    promoting = round_("1", gating.switches["coarse"].record, one, passed)
    assert promoting.switches["coarse"].record.phase == inplace.PROMOTING
    assert promoting.switches["coarse"].actions == (inplace.Load(PODS[1], "2", ("1", "2")),)

    everywhere = {p: (entry(1), entry(2)) for p in PODS}
    unloading = round_("1", promoting.switches["coarse"].record, everywhere, passed)
    assert unloading.switches["coarse"].record.phase == inplace.UNLOADING
    assert set(unloading.switches["coarse"].actions) == {inplace.Unload(p, "1", ("2",)) for p in PODS}

    # The held version unloaded everywhere: still Serving (its new version answers), never reloaded at 1.
    gone = {p: (entry(1, "UNAVAILABLE", "unloaded"), entry(2)) for p in PODS}
    assert line(round_("1", unloading.switches["coarse"].record, gone, passed)).state == serverplan.SERVING
    switched = round_("1", unloading.switches["coarse"].record, gone, passed)
    assert switched.switches["coarse"].record.phase == inplace.SWITCHED and switched.switches["coarse"].held == "2"
    assert line(switched).version == "2" and switched.configs["coarse"][0] == 2
    assert staged_versions(switched) == [2]
    assert [e.reason for e in switched.switches["coarse"].events] == ["InPlaceSwitched"]

    # The next round holds 2 and keeps the record; nothing more is asked of the pods.
    after = round_("2", switched.switches["coarse"].record, gone, passed)
    assert after.switches["coarse"].record.phase == inplace.SWITCHED and not after.switches["coarse"].actions
    assert all(a.nothing for a in after.actions.values())


def test_a_failing_gate_unloads_the_new_version_and_the_held_one_serves_on_until_spec_version_changes():
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    record = inplace.Record(version="2", from_version="1", phase=inplace.GATING, since="2026-12-06T11:59:00Z",
                            gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}", touched=(PODS[0],))
    failed = {"warmup": inplace.GateVerdict("fail", "p99 90 ms > 40 ms", f"uid-{PODS[0]}")}
    rolling = round_("1", record, one, failed)
    assert rolling.switches["coarse"].record.phase == inplace.ROLLING_BACK
    assert rolling.switches["coarse"].actions == (inplace.Unload(PODS[0], "2", ("1",)),)
    back = {PODS[0]: (entry(1), entry(2, "UNAVAILABLE", "unloaded")), PODS[1]: (entry(1),)}
    done = round_("1", rolling.switches["coarse"].record, back, failed)
    assert done.switches["coarse"].record.phase == inplace.ROLLED_BACK and line(done).version == "1"
    assert staged_versions(done) == [1]
    # Not tried again for the same spec.version: the message says what to do.
    again = round_("1", done.switches["coarse"].record, back)
    assert again.switches["coarse"].record.phase == inplace.ROLLED_BACK and not again.switches["coarse"].actions
    assert "was not switched in" in line(again).message and "Set spec.version back to '1'" in line(again).message
    # spec.version back to the held one clears it; a new spec.version begins anew.
    cleared = round_("1", done.switches["coarse"].record, back, version="1")
    assert cleared.switches["coarse"].record is None and "switch" not in line(cleared).message


def test_a_next_version_that_fits_neither_beside_the_members_nor_by_swapping_is_not_loaded_and_says_the_arithmetic():
    both = {p: (entry(1),) for p in PODS}
    result = round_("1", None, both, weights_mib=6000, server=SERVER.model_copy(update={"failure_tolerance": 0}))
    switch = result.switches["coarse"]
    assert switch.record.phase == inplace.FELL_BACK and not switch.actions and switch.held == "1"
    assert "does not fit" in switch.record.reason and "MiB" in switch.record.reason
    assert "nor swapped pod by pod" in switch.record.reason and "failureTolerance >= 1" in switch.record.reason
    assert [e.reason for e in switch.events] == ["InPlaceNotPossible"]
    assert staged_versions(result) == [1] and line(result).version == "1"
    assert "serve the model on pods of its own" in line(result).message


def test_a_spec_version_changed_mid_switch_rolls_the_switch_back_first():
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    record = inplace.Record(version="2", from_version="1", phase=inplace.GATING, since="2026-12-06T11:59:00Z",
                            gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}", touched=(PODS[0],))
    result = round_("1", record, one, version="1")
    switch = result.switches["coarse"]
    assert switch.record.phase == inplace.ROLLING_BACK and "spec.version is back to 1" in switch.record.reason
    assert switch.actions == (inplace.Unload(PODS[0], "2", ("1",)),)


def test_no_load_starts_without_the_held_versions_p99_and_a_round_that_read_nothing_moves_nothing():
    both = {p: (entry(1),) for p in PODS}
    begun = round_("1", None, both).switches["coarse"].record
    blind = round_("1", begun, both, p99=None).switches["coarse"]
    assert not blind.actions and "stable P99 is not read" in blind.record.message
    coarse = dataclasses.replace(member("coarse", held="1", version="2"), switch=begun)
    unread = plan_server("ranking", "reco", SERVER, [coarse], pods(both), {}, pool_placement(None, None), now=NOW)
    assert unread.switches["coarse"].record == begun and not unread.switches["coarse"].actions
    assert json.dumps(unread.switches["coarse"].record.to_status())


def test_a_paused_rollout_holds_a_switch_where_it_is_but_still_rolls_a_failed_gate_back():
    both = {p: (entry(1),) for p in PODS}
    paused = dict(rollout={"paused": True})
    coarse = dataclasses.replace(member("coarse", held="1", version="2", **paused), switch=None)
    waits = plan_server("ranking", "reco", SERVER, [coarse], pods(both), {}, pool_placement(None, None), now=NOW)
    assert waits.switches["coarse"].record is None and "rollout.paused" in line(waits).message
    begun = round_("1", None, both).switches["coarse"].record
    # paused before anything loaded: no switch is under way (it holds neither room nor the server's lock)
    let_go = _paused_round(begun, both)
    assert let_go.record is None and not let_go.actions and "rollout.paused" in let_go.note
    loading = dataclasses.replace(begun, gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}", touched=(PODS[0],),
                                  load_pod=PODS[0], load_since="2026-12-06T11:59:30Z")
    held_back = _paused_round(loading, {PODS[0]: (entry(1), entry(2, "LOADING")), PODS[1]: (entry(1),)})
    assert held_back.record == loading and not held_back.actions, "a load under way is held where it is"
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    gating = dataclasses.replace(begun, phase=inplace.GATING, gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}",
                                 touched=(PODS[0],))
    failed = {"warmup": inplace.GateVerdict("fail", "p99 90 ms", f"uid-{PODS[0]}")}
    rolled = _paused_round(gating, one, failed)
    assert rolled.record.phase == inplace.ROLLING_BACK and rolled.actions == (inplace.Unload(PODS[0], "2", ("1",)),)


def _paused_round(record, holding, gates=None):
    coarse = dataclasses.replace(member("coarse", held="1", version="2", rollout={"paused": True}), switch=record)
    return plan_server("ranking", "reco", SERVER, [coarse], pods(holding), {}, pool_placement(None, None),
                       switch_seen={"coarse": seen(holding, gates)}, now=NOW).switches["coarse"]


GATING = inplace.Record(version="2", from_version="1", phase=inplace.GATING, since="2026-12-06T11:59:00Z",
                        gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}", touched=(PODS[0],))


def test_one_switch_at_a_time_and_no_newcomer_while_one_holds_room_on_the_cards():
    """Two members' versions twice on one card would not fit (switch_fits counts one): fine waits for
    coarse's switch, and a newcomer waits for the room it holds."""
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    coarse = dataclasses.replace(member("coarse", held="1", version="2"), switch=GATING)
    fine = member("fine", held="1", version="2")
    result = plan_server("ranking", "reco", SERVER, [coarse, fine, member("rerank")], pods(one), {},
                         pool_placement(None, None), switch_seen={"coarse": seen(one)}, now=NOW)
    assert result.switches["coarse"].in_flight and not result.switches["fine"].in_flight
    fine_line = next(o for o in result.members if o.name == "fine")
    assert "coarse's version switch is in flight" in fine_line.message and fine_line.version == "1"
    rerank = next(o for o in result.members if o.name == "rerank")
    assert rerank.state == serverplan.PENDING and "coarse's version switch holds room" in rerank.message
    # two that begin in the same round: the first in arrival order
    both = {p: (entry(1),) for p in PODS}
    begun = plan_server("ranking", "reco", SERVER, [member("coarse", held="1", version="2"), fine], pods(both), {},
                        pool_placement(None, None), now=NOW)
    assert begun.switches["coarse"].in_flight and begun.switches["fine"].record is None


def test_a_rollback_still_unloads_when_the_spec_no_longer_lists_the_version_switched_in():
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    only_one = [{"name": "1", "modelUri": "s3://models/coarse/1", "format": "onnx"}]
    coarse = dataclasses.replace(member("coarse", held="1", version="1", versions=only_one), switch=GATING)
    result = plan_server("ranking", "reco", SERVER, [coarse], pods(one), {}, pool_placement(None, None),
                         switch_seen={"coarse": seen(one)}, now=NOW)
    assert result.switches["coarse"].actions == (inplace.Unload(PODS[0], "2", ("1",)),)
    assert result.switch_configs["coarse"] == result.configs["coarse"][1], "the held version's config is the base"


def test_a_member_frozen_mid_switch_keeps_serving_from_either_version_and_keeps_its_record():
    from rankops.render.shared_server import FrozenMember

    unloading = dataclasses.replace(GATING, phase=inplace.UNLOADING, touched=PODS)
    only_new = {p: (entry(1, "UNAVAILABLE", "unloaded"), entry(2)) for p in PODS}
    frozen = FrozenMember("coarse", "1", "spec.inputs: bad", config=None, switch=unloading)
    result = plan_server("ranking", "reco", SERVER, [member("fine", held="1")], pods(only_new), {},
                         pool_placement(None, None), frozen=(frozen,), now=NOW)
    assert line(result).state == serverplan.SERVING, line(result)
    assert all("coarse" not in a.load for a in result.actions.values()), "1 is not loaded over 2"
    assert result.switches["coarse"].record == unloading and not result.switches["coarse"].actions
    slice_ = next(o for o in result.objects if o["kind"] == "EndpointSlice" and o["metadata"]["name"] == "coarse-shared")
    assert all(e["conditions"]["ready"] for e in slice_["endpoints"])


def test_the_round_a_switch_ends_the_pods_keep_what_it_loaded_and_a_new_pod_loads_the_held_version_first():
    from rankops.render.serving import config_hash

    unloading = dataclasses.replace(GATING, phase=inplace.UNLOADING, touched=PODS)
    passed = {g: inplace.GateVerdict("pass", "ok", f"uid-{PODS[0]}") for g in ("warmup", "equivalence")}
    gone = {p: (entry(1, "UNAVAILABLE", "unloaded"), entry(2)) for p in PODS}
    coarse = dataclasses.replace(member("coarse", held="1", version="2"), switch=unloading)
    before = plan_server("ranking", "reco", SERVER, [member("coarse", held="1"), member("fine", held="1")],
                         pods(gone), {}, pool_placement(None, None), now=NOW)
    old_digest = config_hash(before.configs["coarse"][1])
    loaded = [dataclasses.replace(p, loaded={"coarse": old_digest}) for p in pods(gone)]
    ended = plan_server("ranking", "reco", SERVER, [coarse, member("fine", held="1")], loaded, {},
                        pool_placement(None, None), switch_seen={"coarse": seen(gone, passed)}, now=NOW)
    assert ended.switches["coarse"].record.phase == inplace.SWITCHED
    assert all(a.nothing for a in ended.actions.values()), "no pod reloads what the switch loaded"
    assert ended.adopted == {(p, "coarse"): config_hash(ended.configs["coarse"][1]) for p in PODS}

    # Promoting, and a new pod with neither version: the server loads 1 there; the switch waits for it
    promoting = dataclasses.replace(GATING, phase=inplace.PROMOTING)
    fresh = {PODS[0]: (entry(1), entry(2)), PODS[1]: ()}
    coarse = dataclasses.replace(member("coarse", held="1", version="2"), switch=promoting)
    result = plan_server("ranking", "reco", SERVER, [coarse, member("fine", held="1")], pods(fresh), {},
                         pool_placement(None, None), switch_seen={"coarse": seen(fresh, passed)}, now=NOW)
    assert result.actions[PODS[1]].load == ("coarse",)
    assert not [a for a in result.switches["coarse"].actions if getattr(a, "pod", None) == PODS[1]]


def test_a_records_message_in_status_is_bounded():
    from rankops.server_switch import MAX_SAID, MemberSwitch, status_of

    said = "x" * 100_000
    wire = status_of(MemberSwitch(dataclasses.replace(GATING, message=said, reason=said), "1"))
    assert len(wire.message) == len(wire.reason) == MAX_SAID


def test_while_another_member_misses_its_p99_no_load_starts_and_a_loaded_switch_rolls_back():
    """fine shares the cards: its P99 over its SLO (40 ms) holds coarse's switch before its first load,
    and rolls it back once 2 is loaded in a pod (coarse's own P99 is within its bound)."""
    both = {p: (entry(1),) for p in PODS}
    begun = round_("1", None, both).switches["coarse"].record
    slow_fine = dataclasses.replace(seen(both), others_p99_ms={"fine": 95.0})

    def with_seen(record, what, holding=both):
        coarse = dataclasses.replace(member("coarse", held="1", version="2"), switch=record)
        return plan_server("ranking", "reco", SERVER, [coarse, member("fine", held="1")], pods(holding), {},
                           pool_placement(None, None), switch_seen={"coarse": what}, now=NOW).switches["coarse"]
    waits = with_seen(begun, slow_fine)
    assert not waits.actions and waits.record.phase == inplace.LOADING
    assert "fine's P99 over its slo.p99LatencyMs 40 ms" in waits.record.message
    slower = with_seen(begun, dataclasses.replace(slow_fine, others_p99_ms={"fine": 97.3}))
    assert slower.record == waits.record, "no figure that moves each round: no status write each round"
    # waiting holds the server's one switch at a time: at most one load's deadline, then it stops
    long_ago = dataclasses.replace(begun, since="2026-12-06T11:49:00Z")
    stopped = with_seen(long_ago, slow_fine)
    assert stopped.record.phase == inplace.FELL_BACK and not stopped.actions and stopped.held == "1"
    assert "nothing of 2 loaded in 660 s (loadTimeout 600 s): fine's P99 95.0 ms" in stopped.record.reason
    assert [e.reason for e in stopped.events] == ["InPlaceNotPossible"]
    assert with_seen(begun, dataclasses.replace(slow_fine, others_p99_ms={"fine": 12.0})).actions, "within: it loads"
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    rolled = with_seen(GATING, dataclasses.replace(seen(one), others_p99_ms={"fine": 95.0}), one)
    assert rolled.record.phase == inplace.ROLLING_BACK and "fine's P99 95.0 ms" in rolled.record.reason
    assert rolled.actions == (inplace.Unload(PODS[0], "2", ("1",)),)


def test_the_gates_verdicts_on_the_gate_pod_are_the_lines_and_the_members_own_status_gates():
    from rankops.api.rankingmodel import RankingModelStatus
    from rankops.api.sharedserver import MemberStatus
    from rankops.model_status import member_status
    from rankops.server_switch import gates_of

    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    verdicts = {"warmup": inplace.GateVerdict("pass", "warm P99 12 ms", f"uid-{PODS[0]}"),
                "equivalence": inplace.GateVerdict("fail", "top-50 overlap 0.4", f"uid-{PODS[1]}")}
    gated = round_("1", GATING, one, verdicts).switches["coarse"]
    assert set(gated.verdicts) == {"warmup"}, "a verdict on another pod is no evidence"
    lines = gates_of(gated, None, "2026-12-06T12:00:00Z")
    assert [(g.gate, g.version, g.outcome) for g in lines] == [("warmup", "2", "pass")]
    assert "(on pod ranking-shared-a)" in lines[0].summary
    # past gating, the line's verdicts for the same version stand; gating again with none held (a new
    # process gates again), they go; none without a record
    line = MemberStatus(name="coarse", state="Serving", reason="Serving", version="1", gates=lines)
    promoting = dataclasses.replace(gated.record, phase=inplace.PROMOTING)
    passed = {"warmup": verdicts["warmup"], "equivalence": inplace.GateVerdict("pass", "ok", f"uid-{PODS[0]}")}
    later = round_("1", promoting, one, passed).switches["coarse"]
    assert [g for g in gates_of(later, line, "2026-12-06T12:01:00Z") if g.gate == "warmup"] == lines
    regating = round_("1", gated.record, one).switches["coarse"]
    assert regating.record.phase == inplace.GATING and gates_of(regating, line, "2026-12-06T12:01:00Z") == []
    assert gates_of(round_("1", None, {p: (entry(1),) for p in PODS}, version="1").switches.get("coarse"), line,
                    "now") == []
    own = member_status(RankingModelStatus(), member("coarse", held="1", version="2").spec, "ranking", line, True, 1,
                        "2026-12-06T12:01:00Z")
    assert [g.gate for g in own.status.gates] == ["warmup"]


def test_a_held_member_with_autoscaling_enabled_is_told_it_has_no_effect_and_still_switches():
    """Refused to a newcomer (render.shared_server.member_problems), said to a member held from before."""
    both = {p: (entry(1),) for p in PODS}
    coarse = member("coarse", held="1", version="2", autoscaling={"enabled": True, "maxReplicas": 4})
    result = plan_server("ranking", "reco", SERVER, [coarse, member("fine", held="1")], pods(both), {},
                         pool_placement(None, None), now=NOW)
    assert result.switches["coarse"].record.phase == inplace.LOADING
    assert "spec.autoscaling.enabled has no effect on a shared server" in line(result).message
    assert "cannot be applied" not in line(result).message
    newcomer = plan_server("ranking", "reco", SERVER, [member("coarse", autoscaling={"enabled": True,
                                                                                    "maxReplicas": 4})],
                           (), {}, pool_placement(None, None), now=NOW)
    assert line(newcomer).state == serverplan.REFUSED


def test_a_pod_not_started_holds_no_promotion_it_loads_the_version_held_when_it_starts():
    """A third pod Pending (no GPU free: no address): promotion completes on the pods that run."""
    passed = {g: inplace.GateVerdict("pass", "ok", f"uid-{PODS[0]}") for g in ("warmup", "equivalence")}
    everywhere = {p: (entry(1), entry(2)) for p in PODS}
    coarse = dataclasses.replace(member("coarse", held="1", version="2"), switch=dataclasses.replace(
        GATING, phase=inplace.PROMOTING))
    pending = PodView("ranking-shared-c", False, "", None, None, uid="uid-c")
    result = plan_server("ranking", "reco", SERVER, [coarse, member("fine", held="1")], [*pods(everywhere), pending],
                         {}, pool_placement(None, None), switch_seen={"coarse": seen(everywhere, passed)}, now=NOW)
    switch = result.switches["coarse"]
    assert switch.record.phase == inplace.UNLOADING, switch.record.message


ABORT, RETRY = "rankops.io/abort", "rankops.io/retry"


def test_the_abort_annotation_naming_the_version_switching_in_rolls_it_back_once_per_value():
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    # a value naming another version, or one already acted on, does nothing
    for manual, acted in (({ABORT: "3"}, {}), ({ABORT: "2"}, {"aborted": "2"})):
        left = round_("1", GATING, one, manual=manual, acted=acted).switches["coarse"]
        assert left.record.phase == inplace.GATING and left.actions == (inplace.RunGate("warmup", PODS[0], "2"),)
    aborted = round_("1", GATING, one, manual={ABORT: "2"})
    switch = aborted.switches["coarse"]
    assert switch.record.phase == inplace.ROLLING_BACK and "rankops.io/abort=2" in switch.record.reason
    assert switch.actions == (inplace.Unload(PODS[0], "2", ("1",)),) and switch.acted == {"aborted": "2"}
    assert [e.reason for e in switch.events] == ["InPlaceRollingBack"]
    assert line(aborted).version == "1"
    # paused: an abort still acts (it only makes the switch safer)
    paused = dataclasses.replace(member("coarse", held="1", version="2", rollout={"paused": True}), switch=GATING,
                                 manual={ABORT: "2/now"})
    held = plan_server("ranking", "reco", SERVER, [paused], pods(one), {}, pool_placement(None, None),
                       switch_seen={"coarse": seen(one)}, now=NOW).switches["coarse"]
    assert held.record.phase == inplace.ROLLING_BACK and held.acted == {"aborted": "2/now"}


def test_the_retry_annotation_begins_a_stopped_switch_again_once_per_value():
    both = {p: (entry(1),) for p in PODS}
    stopped = dataclasses.replace(GATING, phase=inplace.ROLLED_BACK, reason="warmup failed", touched=())
    kept = round_("1", stopped, both, manual={RETRY: "2"}, acted={"retried": "2"}).switches["coarse"]
    assert kept.record == stopped, "a value acted on stays acted on"
    assert "rankops.io/retry=2/again" in kept.note, "the retry it suggests is one that acts"
    again = round_("1", stopped, both, manual={RETRY: "2/again"}, acted={"retried": "2", "aborted": "2"})
    switch = again.switches["coarse"]
    assert switch.record.phase == inplace.LOADING and switch.record.touched == ()
    assert [e.reason for e in switch.events] == ["InPlaceSwitchRetried", "InPlaceSwitchStarted"]
    assert switch.acted == {"retried": "2/again", "aborted": "2"}
    assert staged_versions(again) == [1, 2]
    # the values acted on are the member's status line's, and stay there once the switch is cleared
    from rankops import server_switch
    from rankops.api.sharedserver import MemberStatus
    status = MemberStatus(name="coarse", state="Serving", reason="Serving",
                          **server_switch.acted_of(switch, None))
    assert (status.aborted, status.retried) == ("2", "2/again")
    assert server_switch.acted_of(None, status) == {"aborted": "2", "retried": "2/again"}
    assert server_switch.acted_in(MemberStatus(name="coarse", state="Serving", reason="Serving")) == {}


def test_a_value_set_before_a_switch_begins_is_used_up_by_it_and_an_abort_while_it_rolls_back_too():
    """rankops.io/retry: "2" and rankops.io/abort: "2" kept in a manifest beside spec.version 2 neither
    abort the switch that begins nor begin it again once it stops; an abort that arrives while the
    switch already rolls back is used up there, so it does not abort a switch retried later."""
    both = {p: (entry(1),) for p in PODS}
    begun = round_("1", None, both, manual={RETRY: "2", ABORT: "2"}).switches["coarse"]
    assert begun.record.phase == inplace.LOADING and begun.acted == {"retried": "2", "aborted": "2"}
    loading = round_("1", begun.record, both, manual={RETRY: "2", ABORT: "2"}, acted=begun.acted)
    assert loading.switches["coarse"].record.phase == inplace.LOADING and loading.switches["coarse"].actions
    stopped = dataclasses.replace(GATING, phase=inplace.ROLLED_BACK, reason="warmup failed", touched=())
    again = round_("1", stopped, both, manual={RETRY: "2"}, acted=begun.acted).switches["coarse"]
    assert again.record == stopped and not again.actions
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    rolling = dataclasses.replace(GATING, phase=inplace.ROLLING_BACK, reason="warmup failed")
    late = round_("1", rolling, one, manual={ABORT: "2/late"}).switches["coarse"]
    assert late.record.phase == inplace.ROLLING_BACK and late.acted == {"aborted": "2/late"}
    assert "aborted" not in (late.record.reason or "")


def test_a_load_takes_no_more_pods_out_than_the_server_tolerates_and_its_deadline_is_bounded():
    """coarse tolerates one pod lost (its planning), the server none: with one of two pods not serving,
    no load starts (a load that kills a pod takes every member in it). A day's loadTimeoutSeconds is
    held to MAX_LOAD_TIMEOUT_S."""
    from rankops import server_switch

    both = {p: (entry(1),) for p in PODS}
    begun = round_("1", None, both).switches["coarse"].record
    coarse = dataclasses.replace(member("coarse", held="1", version="2",
                                        rollout={"inPlace": {"loadTimeoutSeconds": 86400}}), switch=begun)
    down = [dataclasses.replace(p, ready=p.name == PODS[0]) for p in pods(both)]
    half = SwitchSeen(tuple(dataclasses.replace(i, serving=i.name == PODS[0]) for i in seen(both).pods), {}, 5.0)
    for tolerance, loads in ((0, False), (1, True)):
        spec = SERVER.model_copy(update={"failure_tolerance": tolerance})
        planned = plan_server("ranking", "reco", spec, [coarse], down, {}, pool_placement(None, None),
                              switch_seen={"coarse": half}, now=NOW).switches["coarse"]
        assert bool(planned.actions) == loads, (tolerance, planned.record.message)
    policy = server_switch._policy(coarse.spec, 2, 0)
    assert policy.load_timeout_s == server_switch.MAX_LOAD_TIMEOUT_S and policy.failure_tolerance == 0


def test_the_switch_waits_for_a_load_of_the_held_version_under_way_on_a_new_pod():
    """A new pod loading the held version (LOADING in its index): the switch's load there would race it."""
    record = inplace.Record(version="2", from_version="1", phase=inplace.PROMOTING, since="2026-12-06T11:59:00Z",
                            gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}", touched=(PODS[0],))
    passed = {g: inplace.GateVerdict("pass", "ok", f"uid-{PODS[0]}") for g in ("warmup", "equivalence")}
    racing = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1, "LOADING"),)}
    held_back = round_("1", record, racing, passed).switches["coarse"]
    assert not [a for a in held_back.actions if getattr(a, "pod", None) == PODS[1]]
    ready = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    goes = round_("1", record, ready, passed).switches["coarse"]
    assert goes.actions == (inplace.Load(PODS[1], "2", ("1", "2")),)


def test_only_a_config_the_switch_sent_is_taken_as_loaded_when_it_ends():
    """ServerPlan.adopted names the config wanted now; one edited after the switch's last loads (or
    a switch whose loads another process sent) is loaded again, not taken as loaded."""
    from rankops.controller.server_switches import Switches
    from rankops.render.serving import config_hash

    switches = Switches(load_config=lambda text: {"text": text})
    record = dataclasses.replace(GATING, phase=inplace.UNLOADING)
    try:
        assert switches.confirmed({("pod-a", "coarse"): config_hash("sent")}) == {}, "nothing sent by this process"
        switches._executor("coarse", record, "sent")
        assert switches.confirmed({("pod-a", "coarse"): config_hash("sent"),
                                   ("pod-a", "fine"): config_hash("sent")}) == {("pod-a", "coarse"): config_hash("sent")}
        assert switches.confirmed({("pod-a", "coarse"): config_hash("edited since")}) == {}
        switches.forget("coarse")
        assert switches.confirmed({("pod-a", "coarse"): config_hash("sent")}) == {}
    finally:
        switches.close()


def test_an_edit_of_the_incoming_versions_entry_mid_switch_rolls_it_back():
    """What was gated is what the pods load: spec.versions[2].modelUri edited after the gate pod loaded
    2 rolls the switch back (a pod that fetches later would load files never gated)."""
    both = {p: (entry(1),) for p in PODS}
    begun = round_("1", None, both).switches["coarse"].record
    assert begun.artifact and begun.to_status()["artifact"] == begun.artifact
    gating = dataclasses.replace(GATING, artifact=begun.artifact)
    one = {PODS[0]: (entry(1), entry(2)), PODS[1]: (entry(1),)}
    same = round_("1", gating, one).switches["coarse"]
    assert same.record.phase == inplace.GATING
    versions = [{"name": v, "modelUri": f"s3://models/coarse/{v}{'-retrained' if v == '2' else ''}", "format": "onnx"}
                for v in ("1", "2")]
    edited = dataclasses.replace(member("coarse", held="1", version="2", versions=versions), switch=gating)
    rolled = plan_server("ranking", "reco", SERVER, [edited, member("fine", held="1")], pods(one), {},
                         pool_placement(None, None), switch_seen={"coarse": seen(one)}, now=NOW).switches["coarse"]
    assert rolled.record.phase == inplace.ROLLING_BACK and "changed mid-switch" in rolled.record.reason
    assert rolled.actions == (inplace.Unload(PODS[0], "2", ("1",)),)


def work(actions) -> tuple:
    """A switch's actions on the pods' Tritons and files (a swap's router drains are checked apart)."""
    return tuple(a for a in actions if not isinstance(a, inplace.Drain))


def drains(actions) -> tuple:
    return tuple(a for a in actions if isinstance(a, inplace.Drain))


def endpoint_pods(result, model="coarse") -> set[str]:
    """The pods `model`'s EndpointSlice sends requests to."""
    slice_ = next(o for o in result.objects if o["kind"] == "EndpointSlice"
                  and o["metadata"]["labels"].get("kubernetes.io/service-name", "").endswith(model))
    return {e["targetRef"]["name"] for e in slice_["endpoints"] if e["conditions"]["ready"]}


def test_a_version_that_does_not_fit_beside_the_held_one_is_swapped_pod_by_pod_each_drained_first():
    later = lambda s: NOW + dt.timedelta(seconds=s)     # noqa: E731
    old = {p: (entry(1),) for p in PODS}
    begun = round_("1", None, old, weights_mib=6000)
    record = begun.switches["coarse"].record
    assert record.phase == inplace.LOADING and record.swap and "swapping 1 for 2 pod by pod" in record.message
    assert "does not fit" in record.message and [e.reason for e in begun.switches["coarse"].events] == \
        ["InPlaceSwitchStarted"]

    # The first pod is taken: out of coarse's endpoints (fine's stay), nothing unloaded while it drains.
    taken = round_("1", record, old, weights_mib=6000)
    record = taken.switches["coarse"].record
    assert record.load_pod == PODS[0] and record.touched == (PODS[0],)
    assert not work(taken.switches["coarse"].actions)
    assert drains(taken.switches["coarse"].actions) == (inplace.Drain(PODS[0], inplace.DRAIN_HOLD_S),
                                                         inplace.Drain(PODS[1], 0)), \
        "its router closes coarse's keep-alive connections; the other's is told not to"
    assert endpoint_pods(taken) == {PODS[1]} and endpoint_pods(taken, "fine") == set(PODS)
    budget = lambda result: next(o for o in result.objects if o["kind"] == "PodDisruptionBudget")["spec"]  # noqa: E731
    assert budget(begun)["minAvailable"] == 1 and budget(taken)["minAvailable"] == 2, \
        "while a pod is taken, an eviction waits: the budget counts it as gone"
    assert "draining" in record.message
    drained = round_("1", record, old, weights_mib=6000, now=later(6))
    assert work(drained.switches["coarse"].actions) == (inplace.Unload(PODS[0], "1", ()),)
    assert endpoint_pods(drained) == {PODS[1]}

    # Unloaded there: the server's own loads leave the taken pod to the switch, which loads 2 alone.
    empty = {PODS[0]: (entry(1, "UNAVAILABLE", "unloaded"),), PODS[1]: (entry(1),)}
    loading = round_("1", record, empty, weights_mib=6000, now=later(8))
    assert work(loading.switches["coarse"].actions) == (inplace.Load(PODS[0], "2", ("2",)),)
    assert all(a.nothing for a in loading.actions.values())
    assert line(loading).state == serverplan.SERVING, "the taken pod is not judged while it is swapped"

    # READY alone: back in the endpoints, gated there; equivalence compares with 1 on the other pod.
    one = {PODS[0]: (entry(1, "UNAVAILABLE", "unloaded"), entry(2)), PODS[1]: (entry(1),)}
    gating = round_("1", loading.switches["coarse"].record, one, weights_mib=6000, now=later(20))
    record = gating.switches["coarse"].record
    assert record.phase == inplace.GATING and record.load_pod is None
    assert drains(gating.switches["coarse"].actions) == tuple(inplace.Drain(p, 0) for p in PODS), \
        "back in: the drain ends"
    assert work(gating.switches["coarse"].actions) == (inplace.RunGate("warmup", PODS[0], "2", PODS[1]),)
    assert endpoint_pods(gating) == set(PODS)

    # Gates passed: the second pod is taken the same way.
    passed = {g: inplace.GateVerdict("pass", "ok", f"uid-{PODS[0]}") for g in ("warmup", "equivalence")}
    promoting = round_("1", record, one, passed, weights_mib=6000, now=later(30))
    record = promoting.switches["coarse"].record
    assert record.phase == inplace.PROMOTING and record.load_pod == PODS[1]
    assert not work(promoting.switches["coarse"].actions)
    assert endpoint_pods(promoting) == {PODS[0]}
    unload = round_("1", record, one, passed, weights_mib=6000, now=later(36))
    assert work(unload.switches["coarse"].actions) == (inplace.Unload(PODS[1], "1", ()),)
    half = {PODS[0]: one[PODS[0]], PODS[1]: (entry(1, "UNAVAILABLE", "unloaded"),)}
    load = round_("1", record, half, passed, weights_mib=6000, now=later(38))
    assert work(load.switches["coarse"].actions) == (inplace.Load(PODS[1], "2", ("2",)),)

    # Every pod holds 2 alone: switched, 1's files go, nothing more is loaded.
    new = {p: (entry(1, "UNAVAILABLE", "unloaded"), entry(2)) for p in PODS}
    switched = round_("1", record, new, passed, weights_mib=6000, now=later(50))
    assert switched.switches["coarse"].record.phase == inplace.SWITCHED and switched.switches["coarse"].held == "2"
    assert set(work(switched.switches["coarse"].actions)) == {inplace.RemoveFiles(p, "1") for p in PODS}
    assert endpoint_pods(switched) == set(PODS)


def test_a_swap_takes_no_pod_while_the_others_serving_would_fall_below_the_floor():
    old = {PODS[0]: (entry(1),), PODS[1]: (entry(1, "LOADING"),)}       # the other pod not serving coarse yet
    record = inplace.Record(version="2", from_version="1", phase=inplace.LOADING, since=NOW.isoformat(), swap=True)
    waiting = round_("1", record, old, weights_mib=6000)
    assert waiting.switches["coarse"].record.load_pod is None and not work(waiting.switches["coarse"].actions)
    assert endpoint_pods(waiting) == {PODS[0]}
    assert "waiting" in waiting.switches["coarse"].record.message


def test_a_swap_that_fails_its_gate_swaps_the_held_version_back_one_pod_at_a_time():
    later = lambda s: NOW + dt.timedelta(seconds=s)     # noqa: E731
    one = {PODS[0]: (entry(1, "UNAVAILABLE", "unloaded"), entry(2)), PODS[1]: (entry(1),)}
    record = inplace.Record(version="2", from_version="1", phase=inplace.GATING, since=NOW.isoformat(),
                            gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}", touched=(PODS[0],), swap=True)
    failed = {"equivalence": inplace.GateVerdict("fail", "top-50 overlap 0.6", f"uid-{PODS[0]}"),
              "warmup": inplace.GateVerdict("pass", "ok", f"uid-{PODS[0]}")}
    rolling = round_("1", record, one, failed, weights_mib=6000)
    record = rolling.switches["coarse"].record
    assert record.phase == inplace.ROLLING_BACK and record.load_pod == PODS[0]
    assert not work(rolling.switches["coarse"].actions)
    assert endpoint_pods(rolling) == {PODS[1]}, "drained before 2 is unloaded there"
    unload = round_("1", record, one, failed, weights_mib=6000, now=later(6))
    assert work(unload.switches["coarse"].actions) == (inplace.Unload(PODS[0], "2", ()),)
    empty = {PODS[0]: (entry(1, "UNAVAILABLE", "unloaded"), entry(2, "UNAVAILABLE", "unloaded")), PODS[1]: (entry(1),)}
    back = round_("1", record, empty, failed, weights_mib=6000, now=later(8))
    assert work(back.switches["coarse"].actions) == (inplace.Load(PODS[0], "1", ("1",)),)
    assert all(a.nothing for a in back.actions.values()), "the switch loads 1 back there, not the server too"
    old = {p: (entry(1), entry(2, "UNAVAILABLE", "unloaded")) for p in PODS}
    done = round_("1", record, old, failed, weights_mib=6000, now=later(12))
    assert done.switches["coarse"].record.phase == inplace.ROLLED_BACK and done.switches["coarse"].held == "1"
    assert work(done.switches["coarse"].actions) == (inplace.RemoveFiles(PODS[0], "2"),)
    assert endpoint_pods(done) == set(PODS)


# --- a swap, after a hostile review: each test drives plan_server with pods not Ready, missing, or
# failing, as the review reproduced them

A, B, C = "ranking-shared-a", "ranking-shared-b", "ranking-shared-c"
SWAPPED = (entry(1, "UNAVAILABLE", "unloaded"), entry(2))


def swap_round(record, holding, *, ready=None, gates=None, now=NOW, names=(A, B), no_ip=(), **spec):
    """`holding`: pod -> coarse's entries (None: index unread); `ready`: pod -> Ready; `no_ip`: pods
    not started (Pending)."""
    ready = ready or {}
    views, indexes = [], []
    for i, name in enumerate(names, 1):
        is_ready, entries = ready.get(name, True), holding.get(name)
        index = None if entries is None or not is_ready else (*entries, IndexEntry("fine", 1, "READY", ""))
        ip = "" if name in no_ip else f"10.0.0.{i}"
        views.append(PodView(name, is_ready, ip, None, index, uid=f"uid-{name}"))
        if ip:
            indexes.append(inplace.PodIndex(name, f"uid-{name}", is_ready, None if index is None else
                                            {e.version: inplace.VersionState(e.state, e.reason) for e in entries},
                                            staged=STAGED, drain_open=0))
    coarse = dataclasses.replace(member("coarse", 6000, held="1", version="2", **spec), switch=record)
    return plan_server("ranking", "reco", SERVER, [coarse, member("fine", held="1")], views, {},
                       pool_placement(None, None), switch_seen={"coarse": SwitchSeen(tuple(indexes), gates or {}, 5.0)},
                       now=now)


def swap_record(phase, **fields):
    return inplace.Record(version="2", from_version="1", phase=phase, since=NOW.isoformat(), swap=True, **fields)


def test_a_swap_s_rollback_takes_no_pod_that_would_leave_the_member_without_an_endpoint():
    errored = {"equivalence": inplace.GateVerdict("error", "reference pod unreachable", f"uid-{A}"),
               "warmup": inplace.GateVerdict("pass", "ok", f"uid-{A}")}
    record = swap_record(inplace.GATING, gate_pod=A, gate_pod_uid=f"uid-{A}", touched=(A,))
    out = swap_round(record, {A: SWAPPED, B: None}, ready={B: False}, gates=errored)
    switch = out.switches["coarse"]
    assert switch.record.phase == inplace.ROLLING_BACK and switch.record.load_pod is None
    assert endpoint_pods(out) == {A}, "2 serves on until another pod serves coarse"
    back = swap_round(switch.record, {A: SWAPPED, B: (entry(1),)}, gates=errored, now=NOW + dt.timedelta(seconds=3))
    assert back.switches["coarse"].record.load_pod == A and endpoint_pods(back) == {B}


def test_a_swap_counts_the_pods_the_server_wants_and_lacks_against_its_tolerance():
    record = swap_record(inplace.PROMOTING, gate_pod=A, gate_pod_uid=f"uid-{A}", touched=(A,))
    out = swap_round(record, {A: SWAPPED, B: (entry(1),), C: (entry(1),)}, names=(A, B, C), no_ip=(C,), replicas=3)
    assert out.switches["coarse"].record.load_pod is None and endpoint_pods(out) == {A, B}
    assert "at least 1" in out.switches["coarse"].record.message


def test_a_swap_whose_gate_pod_was_lost_for_a_round_gates_the_pod_already_swapped_again():
    record = swap_record(inplace.GATING, gate_pod=A, gate_pod_uid=f"uid-{A}", touched=(A,))
    holding = {A: SWAPPED, B: (entry(1),)}
    lost = swap_round(record, holding, ready={A: False}).switches["coarse"].record
    assert lost.phase == inplace.LOADING and lost.gate_pod is None
    again = swap_round(lost, holding, now=NOW + dt.timedelta(seconds=3)).switches["coarse"]
    assert again.record.phase == inplace.GATING and again.record.gate_pod == A
    assert work(again.actions) == (inplace.RunGate("warmup", A, "2", B),)


def test_a_swap_paused_with_a_pod_taken_finishes_that_pod_and_takes_no_other():
    record = swap_record(inplace.PROMOTING, gate_pod=A, gate_pod_uid=f"uid-{A}", touched=(A, B), load_pod=B,
                         load_since=(NOW - dt.timedelta(seconds=10)).isoformat())
    empty = {A: SWAPPED, B: (entry(1, "UNAVAILABLE", "unloaded"),)}
    out = swap_round(record, empty, rollout={"paused": True})
    assert work(out.switches["coarse"].actions) == (inplace.Load(B, "2", ("2",)),)
    record = swap_record(inplace.PROMOTING, gate_pod=A, gate_pod_uid=f"uid-{A}", touched=(A, B), load_pod=B,
                         load_since=(NOW - dt.timedelta(seconds=10)).isoformat())
    three = {A: SWAPPED, B: SWAPPED, C: (entry(1),)}
    done = swap_round(record, three, names=(A, B, C), rollout={"paused": True}, replicas=3)
    assert done.switches["coarse"].record.load_pod is None and not work(done.switches["coarse"].actions)
    assert endpoint_pods(done) == {A, B, C}, "B back in; C not taken while paused"


def test_a_swap_back_that_fails_hands_the_pod_to_the_server_s_loads_and_the_rollback_ends():
    record = swap_record(inplace.ROLLING_BACK, gate_pod=A, gate_pod_uid=f"uid-{A}", touched=(A,), load_pod=A,
                         load_since=NOW.isoformat(), reason="gate failed")
    holding = {A: (entry(1, "UNAVAILABLE", "failed to load: CUDA out of memory"), entry(2, "UNAVAILABLE", "unloaded")),
               B: (entry(1),)}
    out = swap_round(record, holding, now=NOW + dt.timedelta(seconds=10))
    switch = out.switches["coarse"]
    assert switch.record.phase == inplace.ROLLED_BACK and switch.record.load_pod is None
    assert "InPlaceSwapBackFailed" in [e.reason for e in switch.events]


def test_a_swap_takes_a_pod_only_once_its_router_says_the_new_version_s_files_are_on_its_volume():
    old = {p: (entry(1),) for p in PODS}
    record = inplace.Record(version="2", from_version="1", phase=inplace.LOADING, since=NOW.isoformat(), swap=True)
    fetching = round_("1", record, old, weights_mib=6000, staged=frozenset({1}))
    assert fetching.switches["coarse"].record.load_pod is None and endpoint_pods(fetching) == set(PODS)
    assert "files on its volume" in fetching.switches["coarse"].record.message
    staged = round_("1", record, old, weights_mib=6000, staged=frozenset({1, 2}))
    assert staged.switches["coarse"].record.load_pod == PODS[0]
    # routers that do not say: no pod is taken, and after loadTimeout the swap stops (nothing was unloaded)
    unknown = round_("1", record, old, weights_mib=6000, staged=None)
    assert unknown.switches["coarse"].record.load_pod is None
    stopped = round_("1", record, old, weights_mib=6000, staged=None, now=NOW + dt.timedelta(seconds=601))
    assert stopped.switches["coarse"].record.phase == inplace.FELL_BACK and stopped.switches["coarse"].held == "1"
    assert "files on its volume" in stopped.switches["coarse"].record.reason


def test_a_swap_unloads_the_held_version_once_no_connection_of_the_member_is_open_on_the_pod_taken():
    record = inplace.Record(version="2", from_version="1", phase=inplace.LOADING, since=NOW.isoformat(), swap=True,
                            gate_pod=PODS[0], gate_pod_uid=f"uid-{PODS[0]}", load_pod=PODS[0],
                            load_since=NOW.isoformat(), touched=(PODS[0],))
    old = {p: (entry(1),) for p in PODS}

    def at(seconds, open_now):
        switch_seen = seen(old)
        indexes = tuple(dataclasses.replace(p, drain_open=open_now) for p in switch_seen.pods)
        coarse = dataclasses.replace(member("coarse", 6000, held="1", version="2"), switch=record)
        return plan_server("ranking", "reco", SERVER, [coarse, member("fine", held="1")], pods(old), {},
                           pool_placement(None, None),
                           switch_seen={"coarse": dataclasses.replace(switch_seen, pods=indexes)},
                           now=NOW + dt.timedelta(seconds=seconds)).switches["coarse"]
    assert not work(at(6, 2).actions) and "2 connection(s) of it still open" in at(6, 2).record.message
    assert not work(at(6, None).actions), "no answer since it was taken: waited out in full"
    assert work(at(6, 0).actions) == (inplace.Unload(PODS[0], "1", ()),)
    assert work(at(inplace.MAX_DRAIN_S, 2).actions) == (inplace.Unload(PODS[0], "1", ()),), "at most MAX_DRAIN_S"



def test_a_member_that_asks_for_the_pods_strategy_is_told_it_switches_inside_the_server_s_pods():
    record = swap_record(inplace.LOADING)
    asked = swap_round(record, {A: (entry(1),), B: (entry(1),)}, rollout={"strategy": "pods"})
    assert "rollout.strategy pods is not used on a shared server" in line(asked).message
    left_out = swap_round(record, {A: (entry(1),), B: (entry(1),)})
    assert "rollout.strategy" not in line(left_out).message, "the default is not held against it"
