"""A shared server's plan (serverplan.plan_server), pure: which members it holds, the objects that
serve them, each pod's loads and unloads, and each member's state, from what was read."""
from __future__ import annotations

import copy
import dataclasses

from rankops import serverplan
from rankops.api.rankingmodel import RankingModel
from rankops.api.sharedserver import SharedServerSpec
from rankops.fetcher.members import parse_members
from rankops.render.serving import pool_placement
from rankops.serverplan import MemberView, PodView, plan_server
from rankops.triton.repository import IndexEntry

SERVER = SharedServerSpec(gpuMemoryMiB=15360, maxReplicas=4, resources={"cpu": "4", "memory": "16Gi"})


def member(name: str, weights_mib: int = 2000, held: str | None = None, **spec) -> MemberView:
    doc = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel", "metadata": {"name": name, "namespace": "reco"},
           "spec": {"version": "1", "replicas": 2,
                    "versions": [{"name": "1", "modelUri": f"s3://models/{name}/1", "format": "onnx"},
                                 {"name": "2", "modelUri": f"s3://models/{name}/2", "format": "onnx"}],
                    "inputs": [{"name": "x", "dataType": "FP32", "dims": [16]}],
                    "outputs": [{"name": "scores", "dataType": "FP32", "dims": [1]}],
                    "batching": {"maxBatchSize": 64, "preferredBatchSizes": [32, 64], "maxQueueDelayMicroseconds": 500},
                    # no warmReplicas: a member left out is not warmed (render.shared_server)
                    "slo": {"p99LatencyMs": 40, "targetQps": 100},
                    "planning": {"latencyProfile": {1: 1.0, 64: 4.0},
                                 "memory": {"weightsMiB": weights_mib, "activationMiBPerItem": 1,
                                            "runtimeReserveMiB": 1024}}}}
    doc["spec"].update(copy.deepcopy(spec))
    return MemberView(name, RankingModel.model_validate(doc).spec, held)


def plan(members, pods=(), ports=None, staged=()):
    return plan_server("ranking", "reco", SERVER, members, pods, ports or {}, pool_placement(None, None),
                       previous_staged=staged)


def kinds(result):
    return sorted((o["kind"], o["metadata"]["name"]) for o in result.objects)


def ready(name, version=1):
    return IndexEntry(name, version, "READY", "")


THREE = [member("coarse"), member("fine"), member("rerank")]


def test_members_that_fit_are_held_with_their_objects_and_wait_for_a_pod():
    result = plan(THREE)
    assert result.ports == {"coarse": 9000, "fine": 9001, "rerank": 9002}
    assert result.replicas == result.admission.cards >= 1
    assert kinds(result) == sorted([("ConfigMap", "ranking-shared"), ("Deployment", "ranking-shared"),
                                    ("PodDisruptionBudget", "ranking-shared"), ("NetworkPolicy", "ranking-shared"),
                                    *(("Service", n) for n in ("coarse", "fine", "rerank")),
                                    *(("EndpointSlice", f"{n}-shared") for n in ("coarse", "fine", "rerank"))])
    assert [(o.state, o.reason) for o in result.members] == [(serverplan.LOADING, serverplan.REASON_NO_READY_POD)] * 3
    assert set(result.configs) == {"coarse", "fine", "rerank"} and result.configs["fine"][0] == 1
    assert plan(THREE) == result, "the same reads give the same plan"


def test_each_pod_loads_what_it_lacks_and_a_failed_member_is_said_with_tritons_reason():
    pods = [PodView("ranking-shared-a", True, "10.0.0.1", "node-1",
                    (ready("coarse"), IndexEntry("rerank", 1, "UNAVAILABLE", "failed to load: bad onnx"),
                     ready("gone"))),
            PodView("ranking-shared-b", True, "10.0.0.2", "node-2", (ready("coarse"), ready("fine"), ready("rerank"))),
            PodView("ranking-shared-c", False, "10.0.0.3", "node-3")]
    result = plan(THREE, pods)
    assert result.actions["ranking-shared-a"] == serverplan.PodActions(load=("fine",), unload=("gone",))
    assert result.actions["ranking-shared-b"].nothing and "ranking-shared-c" not in result.actions
    states = {o.name: (o.state, o.reason) for o in result.members}
    assert states == {"coarse": (serverplan.SERVING, serverplan.REASON_SERVES),
                      "fine": (serverplan.LOADING, serverplan.REASON_LOADING),
                      "rerank": (serverplan.FAILED, serverplan.REASON_LOAD_FAILED)}
    rerank = next(o for o in result.members if o.name == "rerank")
    assert "ranking-shared-a: failed to load: bad onnx" in rerank.message and "1 of 2 pod(s)" in rerank.message
    slices = {o["metadata"]["name"]: o for o in result.objects if o["kind"] == "EndpointSlice"}
    ready_on = lambda name: [e["targetRef"]["name"] for e in slices[f"{name}-shared"]["endpoints"]  # noqa: E731
                             if e["conditions"]["ready"]]
    assert ready_on("coarse") == ["ranking-shared-a", "ranking-shared-b"]
    assert ready_on("fine") == ["ranking-shared-b"] and ready_on("rerank") == ["ranking-shared-b"]
    # its backoff over on pod a, the failed member is loaded again there
    retried = plan(THREE, [PodView("ranking-shared-a", True, "10.0.0.1", None, pods[0].index,
                                   retry=frozenset({"rerank"}))])
    assert retried.actions["ranking-shared-a"].load == ("fine", "rerank")


def test_a_member_that_does_not_fit_waits_with_the_arithmetic_and_evicts_no_one():
    big = member("big", weights_mib=12000)
    result = plan([*THREE, big])
    outcome = result.members[-1]
    assert (outcome.state, outcome.reason) == (serverplan.PENDING, serverplan.REASON_SERVER_FULL)
    assert outcome.message.startswith("big does not fit on one GPU beside") and "MiB" in outcome.message
    assert "big" not in result.ports and "big" not in result.configs
    # arriving first does not push out members that serve
    result = plan([big, member("coarse", held="1"), member("fine", held="1"), member("rerank", held="1")])
    assert [o.state for o in result.members] == [serverplan.PENDING] + [serverplan.LOADING] * 3


def test_a_member_that_cannot_share_the_pod_is_refused_and_not_staged():
    result = plan([*THREE, member("odd", modelCredentialsSecret="elsewhere")])
    odd = result.members[-1]
    assert (odd.state, odd.reason) == (serverplan.REFUSED, serverplan.REASON_NOT_SHAREABLE)
    assert "odd: spec.modelCredentialsSecret is 'elsewhere'" in odd.message
    config = next(o for o in result.objects if o["kind"] == "ConfigMap")
    assert "odd" not in config["data"]["members.json"] and "odd" not in config["data"]["routes.json"]
    unplannable = plan([member("noplan", planning=None)]).members[0]
    assert (unplannable.state, unplannable.reason) == (serverplan.REFUSED, serverplan.REASON_CANNOT_PACK)


def test_a_held_member_keeps_its_version_while_its_new_one_begins_to_switch_in():
    result = plan([member("coarse", held="1", version="2")],
                  [PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"),))])
    coarse, = result.members
    assert coarse.state == serverplan.SERVING and coarse.version == "1"
    assert "switching to 2 in place (Loading)" in coarse.message
    assert result.configs["coarse"][0] == 1 and result.actions["ranking-shared-a"].nothing


def test_ports_are_kept_when_a_member_leaves():
    first = plan(THREE)
    after = plan([member("coarse"), member("rerank")], ports=first.ports)
    assert after.ports == {"coarse": 9000, "rerank": 9002}


def test_a_member_whose_files_have_not_come_is_loaded_again_until_the_wait_is_over():
    refusal = "load of coarse refused: failed to load 'coarse', failed to poll from model repository"
    pod = PodView("ranking-shared-a", True, "10.0.0.1", None, (), load_errors={"coarse": refusal})
    result = plan([member("coarse")], [pod])
    assert result.actions["ranking-shared-a"].load == ("coarse",)
    coarse, = result.members
    assert coarse.state == serverplan.LOADING and "waiting for its files on ranking-shared-a" in coarse.message
    waited = plan([member("coarse")], [PodView(pod.name, True, pod.ip, None, (), load_errors=pod.load_errors,
                                               staging_over=frozenset({"coarse"}))])
    coarse, = waited.members
    assert (coarse.state, coarse.reason) == (serverplan.FAILED, serverplan.REASON_LOAD_FAILED)
    assert "failed to poll from model repository" in coarse.message and waited.actions[pod.name].nothing


def test_a_held_member_whose_spec_turns_bad_keeps_serving_and_newcomers_wait_while_it_cannot_be_counted():
    pods = [PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"),))]
    result = plan([member("coarse", held="1", responseCache=True)], pods)
    coarse, = result.members
    assert coarse.state == serverplan.SERVING and "responseCache is true" in coarse.message
    assert result.actions["ranking-shared-a"].nothing and result.ports == {"coarse": 9000}
    # its planning gone: it still serves, its room is unknown, so a newcomer waits rather than take it
    result = plan([member("coarse", held="1", planning=None), member("newbie")], pods)
    coarse, newbie = result.members
    assert coarse.state == serverplan.SERVING and "cannot be counted" in coarse.message
    assert (newbie.state, newbie.reason) == (serverplan.PENDING, serverplan.REASON_SERVER_FULL)
    assert "coarse already serve(s) here" in newbie.message and result.actions["ranking-shared-a"].nothing


def test_a_member_that_left_keeps_its_files_until_no_pod_may_hold_it():
    from rankops.fetcher.members import parse_members
    first = plan(THREE)
    staged = parse_members(next(o for o in first.objects if o["kind"] == "ConfigMap")["data"]["members.json"],
                           "ranking")
    two = [member("coarse", held="1"), member("rerank", held="1")]

    def listed(result):
        config = next(o for o in result.objects if o["kind"] == "ConfigMap")["data"]
        return sorted(m.model for m in parse_members(config["members.json"], "ranking")), config["routes.json"]

    loaded = PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"), ready("fine"), ready("rerank")))
    result = plan(two, [loaded], ports=first.ports, staged=staged)
    assert result.actions["ranking-shared-a"].unload == ("fine",)
    files, routes = listed(result)
    assert files == ["coarse", "fine", "rerank"] and "fine" not in routes      # no door, files kept
    assert ("Service", "fine") not in kinds(result)
    unread = PodView("ranking-shared-b", True, "10.0.0.2", None, None, index_error="timed out")
    assert listed(plan(two, [unread], ports=first.ports, staged=staged))[0] == ["coarse", "fine", "rerank"]
    gone = PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"), ready("rerank")))
    assert listed(plan(two, [gone], ports=first.ports, staged=staged))[0] == ["coarse", "rerank"]


def test_no_member_no_pod_and_a_member_listed_twice_is_an_error():
    empty = plan([])
    assert empty.replicas == 0 and not empty.members
    assert next(o for o in empty.objects if o["kind"] == "Deployment")["spec"]["replicas"] == 0
    import pytest
    with pytest.raises(ValueError, match="listed twice"):
        plan([member("coarse"), member("coarse")])


def test_a_config_edit_reloads_the_member_on_pods_that_loaded_the_old_one():
    from rankops.render.serving import config_hash
    current = plan([member("coarse", held="1")])
    digest = config_hash(current.configs["coarse"][1])
    pod = lambda loaded: PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"),),  # noqa: E731
                                 loaded=loaded)
    assert plan([member("coarse", held="1")], [pod({"coarse": digest})]).actions["ranking-shared-a"].nothing
    assert plan([member("coarse", held="1")], [pod({"coarse": "older"})]).actions["ranking-shared-a"].load == ("coarse",)
    assert plan([member("coarse", held="1")], [pod({})]).actions["ranking-shared-a"].nothing   # no record: kept


def test_a_draining_pod_gets_no_loads_and_no_new_requests():
    pods = [PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"),), terminating=True)]
    result = plan([member("coarse")], pods)
    assert "ranking-shared-a" not in result.actions
    endpoint, = next(o for o in result.objects if o["kind"] == "EndpointSlice")["endpoints"]
    assert endpoint["conditions"] == {"ready": False, "serving": False, "terminating": True}


def test_a_held_member_whose_new_spec_drops_its_version_keeps_serving_and_its_files():
    """spec.version 2 with versions [2]: the server still holds 1 (its switch is not built), so 1 stays
    loaded where it is (never unloaded, no config to load it anew) and its files stay staged."""
    first = plan([member("coarse")], [PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"),))])
    staged = parse_members(next(o for o in first.objects if o["kind"] == "ConfigMap")["data"]["members.json"],
                           "ranking")
    moved = member("coarse", held="1", version="2",
                   versions=[{"name": "2", "modelUri": "s3://models/coarse/2", "format": "onnx"}])
    result = plan([moved], [PodView("ranking-shared-a", True, "10.0.0.1", None, (ready("coarse"),))], staged=staged)
    assert result.actions["ranking-shared-a"].nothing, "never unloaded"
    coarse, = result.members
    assert coarse.state == serverplan.SERVING and coarse.version == "1" and "no config" in coarse.message
    slice_ = next(o for o in result.objects if o["kind"] == "EndpointSlice")
    assert [e["conditions"]["ready"] for e in slice_["endpoints"]] == [True]
    kept = next(o for o in result.objects if o["kind"] == "ConfigMap")["data"]["members.json"]
    assert "s3://models/coarse/1" in kept


def test_a_ready_pod_whose_index_read_missed_keeps_its_endpoints_by_its_last_index():
    last = (ready("coarse"), ready("fine"), ready("rerank"))
    slow = PodView("ranking-shared-a", True, "10.0.0.1", None, None, index_error="index not read within 3 s",
                   last_index=last)
    result = plan(THREE, [slow])
    slices = {o["metadata"]["name"]: o for o in result.objects if o["kind"] == "EndpointSlice"}
    assert all(s["endpoints"][0]["conditions"]["ready"] for s in slices.values())
    assert "ranking-shared-a" not in result.actions, "nothing is sent on what was not read"
    gone = plan(THREE, [dataclasses.replace(slow, ready=False)])
    assert not any(o["endpoints"][0]["conditions"]["ready"] for o in gone.objects if o["kind"] == "EndpointSlice")


# --- what the shell asks the core: the members to plan, and when to look again -----------------

def test_a_member_whose_spec_stops_validating_serves_as_it_was_only_while_held():
    coarse, fine = member("coarse"), member("fine")
    found = [serverplan.MemberRead("coarse", "u1", None, "spec.batching: bad"),
             serverplan.MemberRead("fine", "u2", fine.spec)]
    # Not held: left out (its own status says why); the others are planned.
    views, frozen = serverplan.member_views(found, {}, {"u1": coarse.spec})
    assert [v.name for v in views] == ["fine"] and frozen == []
    # Held: it serves as it was, at its last valid spec and the version the server holds.
    views, frozen = serverplan.member_views(found, {"coarse": "1"}, {"u1": coarse.spec})
    assert [(v.name, v.spec, v.held_version) for v in views] == [("coarse", coarse.spec, "1"), ("fine", fine.spec, None)]
    # Held, and no valid spec of it known (a new process): frozen, the others planned.
    views, frozen = serverplan.member_views(found, {"coarse": "1"}, {})
    assert [v.name for v in views] == ["fine"] and [(f.name, f.error) for f in frozen] == [("coarse", "spec.batching: bad")]


def test_the_next_look_is_soon_only_while_something_moves():
    loading = plan(THREE, pods=[PodView("ranking-shared-a", True, "10.0.0.1", "node-1", ())])
    assert any(m.state == serverplan.LOADING and m.reason != serverplan.REASON_NO_READY_POD for m in loading.members)
    assert serverplan.next_look_s(loading, unread=False, due_s=None) == serverplan.POLL_S
    assert serverplan.next_look_s(loading, unread=False, due_s=0.5) == 0.5
    no_pod = plan(THREE)            # waiting for a pod: its Ready event wakes the server
    assert serverplan.next_look_s(no_pod, unread=False, due_s=None) is None
    assert serverplan.next_look_s(no_pod, unread=True, due_s=None) == serverplan.POLL_S
    assert serverplan.next_look_s(no_pod, unread=False, due_s=30.0) == 30.0


def test_newcomers_past_the_servers_seats_wait_and_held_members_keep_theirs():
    from rankops.render.shared_server import MAX_MEMBERS

    crowd = [member(f"m{i:02d}", weights_mib=10) for i in range(MAX_MEMBERS + 8)]
    first = plan(crowd)                       # any tenant may name the server: the reconcile still plans
    states = {m.name: (m.state, m.reason) for m in first.members}
    held = [n for n, (state, _) in states.items() if state == serverplan.LOADING]
    assert held == [m.name for m in crowd[:MAX_MEMBERS]]
    waiting = [m for m in first.members if m.state == serverplan.PENDING]
    assert [m.name for m in waiting] == [m.name for m in crowd[MAX_MEMBERS:]]
    assert all(m.reason == serverplan.REASON_SERVER_FULL and f"at most {MAX_MEMBERS} members" in m.message
               for m in waiting)
    # One held member leaves: the first in line takes its seat; the held ones keep their ports.
    again = [dataclasses.replace(m, held_version="1") if m.name in held else m for m in crowd if m.name != "m03"]
    second = plan(again, ports=first.ports)
    assert {m.name for m in second.members if m.state == serverplan.LOADING} == set(held) - {"m03"} | {f"m{MAX_MEMBERS:02d}"}
    assert all(second.ports[n] == first.ports[n] for n in held if n != "m03")


def grown_past_the_room():
    """a and b serve on one pod; a's spec then grows past what the card has left. (the first plan, the
    pod, the members as the next round reads them)"""
    from rankops.render.serving import config_hash

    first = plan([member("a", weights_mib=5000), member("b", weights_mib=5000)])
    served = {n: config_hash(text) for n, (_, text) in first.configs.items()}
    pod = PodView("ranking-shared-a", True, "10.0.0.1", "node-1", (ready("a"), ready("b")), loaded=served)
    grown = member("a", weights_mib=9000, held="1",
                   batching={"maxBatchSize": 1024, "preferredBatchSizes": [512, 1024], "maxQueueDelayMicroseconds": 500},
                   planning={"latencyProfile": {1: 1.0, 1024: 8.0},
                             "memory": {"weightsMiB": 9000, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}})
    views = [dataclasses.replace(grown, served_digest=served["a"]),
             dataclasses.replace(member("b", weights_mib=5000, held="1"), served_digest=served["b"])]
    return first, pod, views


def test_an_edit_that_grows_a_member_makes_it_the_one_over_never_a_member_that_did_not_change():
    first, pod, views = grown_past_the_room()
    assert {m.state for m in first.members} == {serverplan.LOADING}
    second = plan(views, pods=[pod], ports=first.ports)
    assert [n for n, _ in second.admission.over] == ["a"], second.admission
    outcome = {m.name: m for m in second.members}
    assert outcome["b"].state == serverplan.SERVING and "more than the server has left" not in outcome["b"].message
    assert outcome["a"].state == serverplan.SERVING and "more than the server has left" in outcome["a"].message
    assert second.actions[pod.name].load == (), "a's grown config is sent nowhere; b is not touched"
    fresh = PodView("ranking-shared-b", True, "10.0.0.2", "node-2", ())
    assert plan(views, pods=[pod, fresh], ports=first.ports).actions[fresh.name].load == ("b",), \
        "nor to a new pod, where it would overfill the card"


def test_a_newcomer_that_cannot_be_counted_takes_no_seat():
    from rankops.render.shared_server import MAX_MEMBERS

    unplanned = [member(f"u{i:02d}", planning=None) for i in range(MAX_MEMBERS)]
    result = plan([*unplanned, member("late", weights_mib=10)])
    states = {m.name: m.state for m in result.members}
    assert all(states[m.name] == serverplan.REFUSED for m in unplanned) and states["late"] == serverplan.LOADING


def test_members_that_left_linger_on_the_volume_at_most_as_many_as_the_seats():
    """A pod not read may still hold every member that left: they stay listed for the stager, but
    never more than the file has room for beside the held ones."""
    from rankops.fetcher.members import MAX_ENTRIES, MAX_MEMBERS, Member
    from rankops.fetcher.stager import Wanted

    departed = [Member(f"gone{i:02d}", "model.onnx", (Wanted("1", 1, f"s3://models/gone{i}/1", None),))
                for i in range(MAX_MEMBERS + 8)]
    unread = PodView("ranking-shared-a", True, "10.0.0.1", "node-1", None)
    result = plan(THREE, pods=[unread], staged=departed)
    [config] = [o for o in result.objects if o["kind"] == "ConfigMap"]
    listed = [m.model for m in parse_members(config["data"]["members.json"], "ranking")]
    assert listed[:3] == ["coarse", "fine", "rerank"] and listed[3:] == [m.model for m in departed[:MAX_MEMBERS]]
    assert len(listed) <= MAX_ENTRIES


def test_a_newcomer_named_after_a_service_the_server_does_not_own_is_refused_alone():
    result = plan_server("ranking", "reco", SERVER, THREE, (), {}, pool_placement(None, None),
                         taken={"fine": "RankingModel foo"})
    outcome = {m.name: m for m in result.members}
    assert (outcome["fine"].state, outcome["fine"].reason) == (serverplan.REFUSED, serverplan.REASON_NOT_SHAREABLE)
    assert "the Service fine it would answer at is RankingModel foo's" in outcome["fine"].message
    assert {outcome["coarse"].state, outcome["rerank"].state} == {serverplan.LOADING}
    assert ("Service", "fine") not in {(o["kind"], o["metadata"]["name"]) for o in result.objects}
    assert serverplan.next_look_s(result, unread=False, due_s=None) == serverplan.NAME_TAKEN_RECHECK_S
    held = [dataclasses.replace(m, held_version="1") for m in THREE]
    assert all(m.state == serverplan.LOADING for m in plan_server(
        "ranking", "reco", SERVER, held, (), {}, pool_placement(None, None), taken={"fine": "no owner"}).members), \
        "a member the server holds keeps its place"


OLD_POD = PodView("ranking-shared-a", True, "10.0.0.1", "node-1", (ready("coarse"), ready("fine"), ready("rerank")))
NEW_POD = PodView("ranking-shared-b", True, "10.0.0.2", "node-2", ())


def coarse_frozen(first, frozen, **kw):
    """The round after a restart with coarse's spec broken: fine and rerank held, a pod that serves all
    three and a new one that holds none."""
    held = [dataclasses.replace(m, held_version="1") for m in THREE[1:]]
    return plan_server("ranking", "reco", SERVER, held, (OLD_POD, NEW_POD), first.ports, pool_placement(None, None),
                       previous_staged=parse_members(next(o for o in first.objects if o["kind"] == "ConfigMap")
                                                     ["data"]["members.json"], "ranking"),
                       frozen=frozen, replicas_now=4, **kw)


def test_a_frozen_member_is_never_unloaded_nor_loaded_anew_and_keeps_its_cards():
    from rankops.render.shared_server import FrozenMember, clients_by_port

    first = plan(THREE)
    feed = ({"podSelector": {"matchLabels": {"app": "feed"}}},)
    result = coarse_frozen(first, [FrozenMember("coarse", "1", "spec.slo: bad", feed)])
    old_pod, new_pod = OLD_POD, NEW_POD
    assert result.actions[old_pod.name].unload == () and "coarse" not in result.actions[new_pod.name].load
    assert set(result.actions[new_pod.name].load) == {"fine", "rerank"}
    assert result.ports["coarse"] == first.ports["coarse"] and result.replicas == 4
    outcome = {m.name: m for m in result.members}["coarse"]
    assert (outcome.state, outcome.reason, outcome.version) == (serverplan.FAILED, "InvalidSpec", "1")
    assert "serves 1 as it was on 1 of 2 pod(s)" in outcome.message
    objects = {(o["kind"], o["metadata"]["name"]): o for o in result.objects}
    assert ("Service", "coarse") in objects and ("EndpointSlice", "coarse-shared") in objects
    policy = objects[("NetworkPolicy", "ranking-shared")]
    assert clients_by_port(policy)[first.ports["coarse"]] == feed
    assert "coarse" in [m.model for m in parse_members(objects[("ConfigMap", "ranking-shared")]["data"]["members.json"],
                                                        "ranking")]


def test_an_over_member_stays_over_round_after_round_and_waits_for_nothing():
    """Its status keeps the digest its pods serve (not its new config's), so the next round still
    places it after the members that did not change; a pod without it is not waited for."""
    from rankops.api.sharedserver import SharedServerStatus
    from rankops.render.serving import config_hash
    from rankops.server_status import server_status

    first = plan([member("a", weights_mib=5000), member("b", weights_mib=5000)])
    served = {n: config_hash(text) for n, (_, text) in first.configs.items()}
    pod = PodView("ranking-shared-a", True, "10.0.0.1", "node-1", (ready("a"), ready("b")), loaded=served)
    fresh = PodView("ranking-shared-b", True, "10.0.0.2", "node-2", (ready("b"),))
    grown = member("a", weights_mib=9000, held="1",
                   batching={"maxBatchSize": 1024, "preferredBatchSizes": [512, 1024], "maxQueueDelayMicroseconds": 500},
                   planning={"latencyProfile": {1: 1.0, 1024: 8.0},
                             "memory": {"weightsMiB": 9000, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}})
    status = SharedServerStatus(members=[
        {"name": n, "state": "Serving", "reason": "Serving", "message": "", "version": "1", "port": first.ports[n],
         "configDigest": served[n]} for n in ("a", "b")])
    for _ in range(3):
        digests = {line.name: line.config_digest for line in status.members}
        views = [dataclasses.replace(grown, served_digest=digests["a"]),
                 dataclasses.replace(member("b", weights_mib=5000, held="1"), served_digest=digests["b"])]
        result = plan(views, pods=[pod, fresh], ports=first.ports)
        assert [n for n, _ in result.admission.over] == ["a"] and result.actions[fresh.name].load == ()
        status = server_status(result, status, 1, "2026-12-06T04:00:00Z").status
        assert {line.name: line.config_digest for line in status.members}["a"] == served["a"], "the old config serves"
    outcome = {m.name: m for m in result.members}["a"]
    assert outcome.state == serverplan.SERVING and "not loaded on ranking-shared-b" in outcome.message
    assert serverplan.next_look_s(result, unread=False, due_s=None) is None, "nothing is on its way: no polling"


def test_a_held_member_with_no_config_is_listed_once_for_the_stager():
    from rankops.fetcher.members import parse_members as parse

    first = plan(THREE)
    staged = parse(next(o for o in first.objects if o["kind"] == "ConfigMap")["data"]["members.json"], "ranking")
    auto = dataclasses.replace(member("coarse", held="1", batching="auto",
                                      slo={"p99LatencyMs": 0.01, "targetQps": 100000}))
    result = plan([auto, *[dataclasses.replace(m, held_version="1") for m in THREE[1:]]], ports=first.ports,
                  staged=staged)
    [config] = [o for o in result.objects if o["kind"] == "ConfigMap"]
    listed = [m.model for m in parse(config["data"]["members.json"], "ranking")]
    assert sorted(listed) == ["coarse", "fine", "rerank"]


def test_a_frozen_member_whose_served_config_is_known_is_loaded_on_a_pod_without_it():
    import json

    from rankops.render.serving import config_hash
    from rankops.render.shared_server import CONFIGS_KEY, FrozenMember

    first = plan(THREE)
    assert json.loads(next(o for o in first.objects if o["kind"] == "ConfigMap")["data"][CONFIGS_KEY]) == {}, \
        "nothing serves yet: nothing is written"
    loaded = {n: config_hash(text) for n, (_, text) in first.configs.items()}
    serving = dataclasses.replace(OLD_POD, loaded=loaded)
    held = [dataclasses.replace(m, held_version="1", served_digest=loaded[m.name]) for m in THREE]
    second = plan_server("ranking", "reco", SERVER, held, (serving,), first.ports, pool_placement(None, None))
    served = json.loads(next(o for o in second.objects if o["kind"] == "ConfigMap")["data"][CONFIGS_KEY])
    assert served == {n: text for n, (_, text) in first.configs.items()}, "each as its pods serve it"
    assert set(second.served_sha256) == set(served)
    frozen = [FrozenMember("coarse", "1", "spec.slo: bad", (), served["coarse"])]
    result = coarse_frozen(second, frozen, previous_configs=served)
    old_pod, new_pod = OLD_POD, NEW_POD
    assert set(result.actions[new_pod.name].load) == {"coarse", "fine", "rerank"}
    assert result.actions[old_pod.name].unload == () and result.configs["coarse"] == (1, served["coarse"])
    data = next(o for o in result.objects if o["kind"] == "ConfigMap")["data"]
    assert "coarse" in json.loads(data[CONFIGS_KEY]), "kept while frozen"
    assert "coarse" in [m.model for m in parse_members(data["members.json"], "ranking")], "its files stay listed"


def test_the_configs_written_are_those_the_pods_serve_while_an_edit_is_not_yet_served():
    import json

    from rankops.render.serving import config_hash
    from rankops.render.shared_server import CONFIGS_KEY

    first = plan(THREE)
    old_text = first.configs["coarse"][1]
    edited = member("coarse", held="1", batching={"maxBatchSize": 32, "preferredBatchSizes": [32],
                                                   "maxQueueDelayMicroseconds": 500})
    views = [dataclasses.replace(edited, served_digest=config_hash(old_text)),
             *(dataclasses.replace(m, held_version="1") for m in THREE[1:])]
    pod = dataclasses.replace(OLD_POD, loaded={"coarse": config_hash(old_text)})
    result = plan_server("ranking", "reco", SERVER, views, (pod,), first.ports, pool_placement(None, None),
                         previous_configs={"coarse": old_text})
    written = json.loads(next(o for o in result.objects if o["kind"] == "ConfigMap")["data"][CONFIGS_KEY])
    assert result.actions[pod.name].load == ("coarse",), "the edit is being loaded"
    assert result.configs["coarse"][1] != old_text and written["coarse"] == old_text, "the old one serves yet"
