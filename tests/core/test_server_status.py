"""A shared server's status and Events from its plan (server_status.server_status), pure: each
member's line for its RankingModel, a member's change said once as an Event on the server, Ready
and Degraded for the server, and the status bounded whatever the tenants do."""
from __future__ import annotations

import dataclasses

from test_server_plan import THREE, member, plan, ready

from rankops import serverplan
from rankops.api.conditions import get_condition
from rankops.api.sharedserver import MAX_LISTED_MEMBERS, SharedServerStatus
from rankops.server_status import ALL_SERVING, MEMBER_LEFT, NO_MEMBERS, NOT_SERVING, server_status
from rankops.serverplan import PodView
from rankops.triton.repository import IndexEntry

T0, T1, T2 = "2026-12-06T04:00:00Z", "2026-12-06T04:00:10Z", "2026-12-06T04:00:20Z"


def pod(*entries):
    return PodView("ranking-shared-a", True, "10.0.0.1", "node-1", tuple(entries))


def events(decided):
    """(member named first in the message, or None), type, reason."""
    return [(e.message.split(":")[0] if e.message.split(":")[0] in ("coarse", "fine", "rerank", "huge") else None,
             e.type, e.reason) for e in decided.events]


def test_members_loading_then_serving_each_said_once():
    first = server_status(plan(THREE), SharedServerStatus(), 1, T0)
    assert [(m.name, m.state, m.reason, m.port, m.version) for m in first.status.members] == [
        ("coarse", "Loading", "NoReadyPod", 9000, "1"), ("fine", "Loading", "NoReadyPod", 9001, "1"),
        ("rerank", "Loading", "NoReadyPod", 9002, "1")]
    assert events(first) == [("coarse", "Normal", "NoReadyPod"), ("fine", "Normal", "NoReadyPod"),
                             ("rerank", "Normal", "NoReadyPod"), (None, "Normal", NOT_SERVING)]
    assert first.status.replicas >= 1 and first.status.observed_generation == 1
    again = server_status(plan(THREE), first.status, 1, T1)
    assert again.status == first.status and again.events == (), "the same observation says nothing"

    serving = plan(THREE, [pod(ready("coarse"), ready("fine"), ready("rerank"))])
    done = server_status(serving, first.status, 1, T2)
    assert {m.state for m in done.status.members} == {"Serving"}
    assert {m.last_transition_time for m in done.status.members} == {T2}
    ready_condition = get_condition(done.status.conditions, "Ready")
    assert (ready_condition.status, ready_condition.reason) == ("True", ALL_SERVING)
    assert events(done) == [("coarse", "Normal", "Serving"), ("fine", "Normal", "Serving"),
                            ("rerank", "Normal", "Serving"), (None, "Normal", ALL_SERVING)]


def test_a_failed_member_is_a_warning_and_degrades_the_server_the_others_serving():
    start = server_status(plan(THREE, [pod(ready("coarse"), ready("fine"), ready("rerank"))]),
                          SharedServerStatus(), 1, T0)
    broken = plan(THREE, [pod(ready("coarse"), ready("fine"), IndexEntry("rerank", 1, "UNAVAILABLE", "bad onnx"))])
    decided = server_status(broken, start.status, 1, T1)
    lines = {m.name: m for m in decided.status.members}
    assert (lines["rerank"].state, lines["rerank"].reason) == ("Failed", serverplan.REASON_LOAD_FAILED)
    assert "bad onnx" in lines["rerank"].message
    assert lines["coarse"].last_transition_time == T0, "a member that stays Serving keeps its time"
    degraded = get_condition(decided.status.conditions, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", serverplan.REASON_LOAD_FAILED)
    assert ("rerank", "Warning", serverplan.REASON_LOAD_FAILED) in events(decided)
    assert (None, "Warning", serverplan.REASON_LOAD_FAILED) in events(decided)
    assert not any(member in ("coarse", "fine") for member, _, _ in events(decided))


def test_the_worst_reason_names_degraded_and_a_member_that_left_is_said_on_the_server():
    huge = member("huge", weights_mib=40_000)
    decided = server_status(plan([*THREE, huge]), SharedServerStatus(), 1, T0)
    lines = {m.name: m for m in decided.status.members}
    assert lines["huge"].state in ("Pending", "Refused") and lines["huge"].port is None
    assert ("huge", "Warning", lines["huge"].reason) in events(decided)
    # a failure outranks a wait
    failed = dataclasses.replace(plan(THREE), members=(
        *plan(THREE).members[:2],
        serverplan.MemberOutcome("rerank", serverplan.FAILED, serverplan.REASON_LOAD_FAILED, "x", "1", 9002),
        serverplan.MemberOutcome("huge", serverplan.PENDING, serverplan.REASON_SERVER_FULL, "y", None)))
    assert get_condition(server_status(failed, decided.status, 1, T1).status.conditions, "Degraded").reason == \
        serverplan.REASON_LOAD_FAILED

    left = server_status(plan(THREE[:2]), decided.status, 1, T1)
    assert (None, "Normal", MEMBER_LEFT) in events(left)
    said = next(e.message for e in left.events if e.reason == MEMBER_LEFT and "rerank" in e.message)
    assert "port 9002 freed" in said
    none = server_status(plan([]), left.status, 2, T2)
    assert none.status.members == [] and none.status.replicas == 0
    assert get_condition(none.status.conditions, "Ready").reason == NO_MEMBERS


def test_the_status_stays_bounded_however_many_models_name_the_server():
    many = dataclasses.replace(plan(THREE), members=tuple(
        serverplan.MemberOutcome(f"m{i}", serverplan.REFUSED, serverplan.REASON_NOT_SHAREABLE, "z" * 10_000, None)
        for i in range(MAX_LISTED_MEMBERS + 5)))
    decided = server_status(many, SharedServerStatus(), 1, T0)
    assert len(decided.status.members) == MAX_LISTED_MEMBERS
    assert max(len(m.message) for m in decided.status.members) <= 1024
    assert "5 more member(s) not listed" in get_condition(decided.status.conditions, "Ready").message
    assert len(get_condition(decided.status.conditions, "Ready").message) <= 1024
    SharedServerStatus.model_validate(decided.status.model_dump(by_alias=True))   # what is written reads back


def test_a_member_s_config_digest_is_written_once_every_pod_serves_it():
    serving = plan(THREE, [pod(ready("coarse"), ready("fine"), ready("rerank"))])
    lines = {m.name: m for m in server_status(serving, SharedServerStatus(), 1, T0).status.members}
    from rankops.render.serving import config_hash
    assert lines["coarse"].config_digest == config_hash(serving.configs["coarse"][1])
    loading = server_status(plan(THREE), SharedServerStatus(), 1, T0).status
    assert all(m.config_digest is None for m in loading.members)


def test_the_members_to_wake_are_those_whose_line_changed_or_that_left():
    from rankops.server_status import changed_members, held_versions

    first = server_status(plan(THREE), SharedServerStatus(), 1, T0).status
    assert changed_members(SharedServerStatus(), first) == ("coarse", "fine", "rerank")
    assert changed_members(first, server_status(plan(THREE), first, 1, T1).status) == ()
    two = server_status(plan(THREE[:2]), first, 1, T1).status
    assert changed_members(first, two) == ("rerank",)
    assert held_versions(first) == {"coarse": "1", "fine": "1", "rerank": "1"}
    waiting = first.model_copy(update={"members": [first.members[0].model_copy(update={"state": "Pending"})]})
    assert held_versions(waiting) == {}, "a Pending line holds nothing"


def test_every_held_member_is_listed_however_many_wait_before_it():
    refused = [serverplan.MemberOutcome(f"r{i}", serverplan.REFUSED, serverplan.REASON_NOT_SHAREABLE, "no", None)
               for i in range(MAX_LISTED_MEMBERS + 5)]
    serving = serverplan.MemberOutcome("late", serverplan.SERVING, serverplan.REASON_SERVES, "ok", "1", 9000)
    decided = server_status(dataclasses.replace(plan(THREE), members=(*refused, serving)), SharedServerStatus(), 1, T0)
    assert decided.status.members[0].name == "late" and len(decided.status.members) == MAX_LISTED_MEMBERS
    from rankops.server_status import held_versions
    assert held_versions(decided.status) == {"late": "1"}, "still held on the next reconcile"

    # A member past the listing reads as waiting on its own status, not as "not listed yet".
    from rankops.modelplan import ServerView
    body = {"status": decided.status.model_dump(by_alias=True, exclude_none=True)}
    line = ServerView.of(body, "r200").line
    assert (line.state, line.reason) == ("Pending", "ServerFull") and "first 128 members" in line.message
    assert ServerView.of(body, "late").line.state == "Serving"
