"""Issue 42's wiring: a SharedServer reconciled (controller/servers.py) against the operator's
in-memory API, and its members' own reconciles reading their line of its status
(modelplan.member_plan). No pod runs here (tests/triton/test_shared_server_pod.py drives a real
pod through the same shell); this is what the operator applies, deletes and writes."""
from __future__ import annotations

import copy

import pytest

from rankops.controller import models, runtime, servers
from rankops.controller.context import OperatorContext
from rankops.render import names
from tests.fakecluster import FakeCluster

NS, SERVER = "reco", "ranking"
SERVER_BODY = {"apiVersion": "rankops.io/v1alpha1", "kind": "SharedServer",
               "metadata": {"name": SERVER, "namespace": NS},
               "spec": {"gpuMemoryMiB": 15360, "maxReplicas": 4, "resources": {"cpu": "4", "memory": "16Gi"}}}


def member_body(name: str, created: str, **spec) -> dict:
    doc = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
           "metadata": {"name": name, "namespace": NS, "creationTimestamp": created},
           "spec": {"server": SERVER, "version": "1", "replicas": 2,
                    "versions": [{"name": "1", "modelUri": f"s3://models/{name}/1", "format": "onnx"}],
                    "inputs": [{"name": "x", "dataType": "FP32", "dims": [16]}],
                    "outputs": [{"name": "scores", "dataType": "FP32", "dims": [1]}],
                    "batching": {"maxBatchSize": 64, "preferredBatchSizes": [32, 64], "maxQueueDelayMicroseconds": 500},
                    "warmReplicas": {"enabled": False}, "slo": {"p99LatencyMs": 40, "targetQps": 100},
                    "planning": {"latencyProfile": {1: 1.0, 64: 4.0},
                                 "memory": {"weightsMiB": 2000, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}}}}
    doc["spec"].update(copy.deepcopy(spec))
    return doc


@pytest.fixture(autouse=True)
def posted(monkeypatch):
    """The Events posted: (kind, name, reason) (kopf posts only inside its own handlers' context)."""
    import kopf

    seen: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda body, **kw: seen.append(
        (body.get("kind", ""), body["metadata"]["name"], kw["reason"])))
    return seen


def reconcile(kube: FakeCluster, memory: servers.ServerMemory) -> servers.Result:
    body = kube.stored("SharedServer", NS, SERVER)
    return servers.reconcile(kube, body, kube.list("RankingModel", NS), kube.list("Pod", NS), memory)


def member_status(kube: FakeCluster, name: str, server: dict | None) -> models.Result:
    return models.reconcile(kube, kube.stored("RankingModel", NS, name), server_of=lambda ns, n: server)


def test_a_server_applies_its_objects_for_the_members_it_holds_and_says_each_ones_line():
    kube, memory = cluster_with_memory()
    try:
        result = reconcile(kube, memory)
    finally:
        memory.forget(kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"])
    uid = kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"]
    owned = lambda kind, name: (kube.stored(kind, NS, name)["metadata"]["ownerReferences"][0]["uid"]  # noqa: E731
                                if kube.stored(kind, NS, name) else None)
    for kind, name in [("ConfigMap", "ranking-shared"), ("Deployment", "ranking-shared"),
                       ("PodDisruptionBudget", "ranking-shared"), ("NetworkPolicy", "ranking-shared"),
                       ("Service", "coarse"), ("Service", "fine"), ("EndpointSlice", "coarse-shared"),
                       ("EndpointSlice", "fine-shared"), ("Secret", names.api_key_secret_name("ranking-shared"))]:
        assert owned(kind, name) == uid, (kind, name)
    assert kube.stored("Service", NS, "wide") is None, "a refused member gets no Service"
    assert "selector" not in kube.stored("Service", NS, "coarse")["spec"]
    lines = {m.name: (m.state, m.reason, m.port) for m in result.status.members}
    assert lines == {"coarse": ("Loading", "NoReadyPod", 9000), "fine": ("Loading", "NoReadyPod", 9001),
                     "wide": ("Refused", "NotShareable", None)}
    assert set(result.changed_members) == {"coarse", "fine", "wide"}
    assert result.requeue_after is None, "no pod is ready: a pod's event wakes it, not the clock"
    # the members render nothing of their own
    assert [d["metadata"]["name"] for d in kube.list("Deployment", NS)] == ["ranking-shared"]


def cluster_with_memory():
    kube = FakeCluster()
    kube.put({"kind": "Namespace", "metadata": {"name": NS}})
    kube.put(SERVER_BODY)
    kube.put(member_body("coarse", "2026-12-06T01:00:00Z"))
    kube.put(member_body("fine", "2026-12-06T02:00:00Z"))
    kube.put(member_body("wide", "2026-12-06T03:00:00Z", gpusPerReplica=2))
    return kube, servers.ServerMemory()


def test_each_member_reads_its_line_and_a_missing_server_is_named():
    kube, memory = cluster_with_memory()
    result = reconcile(kube, memory)
    memory.forget(kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"])
    server = {**kube.stored("SharedServer", NS, SERVER), "status": result.status.to_wire()}
    coarse = member_status(kube, "coarse", server)
    assert coarse.status.phase == "Pending" and not coarse.polls
    assert {c.type: (c.status, c.reason) for c in coarse.status.conditions}["Ready"] == ("False", "WaitingForServer")
    wide = member_status(kube, "wide", server)
    degraded = {c.type: c for c in wide.status.conditions}["Degraded"]
    assert wide.status.phase == "Degraded" and degraded.reason == "NotShareable" and "gpusPerReplica" in degraded.message
    assert [e.reason for e in wide.events] == ["NotShareable"]
    # serving: Ready, with the version the server holds
    served = copy.deepcopy(server)
    served["status"]["members"][0].update(state="Serving", reason="Serving", message="coarse 1 serves on 1 pod(s)")
    ready = member_status(kube, "coarse", served)
    assert ready.status.phase == "Ready" and ready.status.stable_version == "1"
    # no server: said, with the fix
    missing = member_status(kube, "fine", None)
    degraded = {c.type: c for c in missing.status.conditions}["Degraded"]
    assert missing.status.phase == "Degraded" and degraded.reason == "SharedServerNotFound"
    assert kube.list("Deployment", NS) and all(d["metadata"]["name"] == "ranking-shared"
                                               for d in kube.list("Deployment", NS))


def test_a_member_that_leaves_loses_its_service_and_endpoints_and_is_said_on_the_server():
    kube, memory = cluster_with_memory()
    uid = kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"]
    try:
        first = reconcile(kube, memory)
        kube.put({**kube.stored("SharedServer", NS, SERVER), "status": first.status.to_wire()})
        kube.delete("RankingModel", NS, "fine")
        second = reconcile(kube, memory)
    finally:
        memory.forget(uid)
    assert kube.stored("Service", NS, "fine") is None and kube.stored("EndpointSlice", NS, "fine-shared") is None
    assert kube.stored("Service", NS, "coarse") is not None
    assert [m.name for m in second.status.members] == ["coarse", "wide"]
    assert "fine" in second.changed_members
    assert any(e.reason == "MemberLeft" and "fine" in e.message for e in second.events)


def test_a_server_spec_that_does_not_validate_applies_nothing_and_says_why():
    kube, memory = cluster_with_memory()
    bad = copy.deepcopy(kube.stored("SharedServer", NS, SERVER))
    bad["spec"]["gpuMemoryMiB"] = 12          # below any card
    kube.put(bad)
    result = reconcile(kube, memory)
    degraded = {c.type: c for c in result.status.conditions}["Degraded"]
    assert degraded.reason == "InvalidSpec" and "gpuMemoryMiB" in degraded.message
    assert kube.list("Deployment", NS) == [] and kube.list("Service", NS) == []


def test_the_controller_writes_the_status_and_wakes_the_members_whose_line_changed(posted):
    kube, _ = cluster_with_memory()
    model_controller, _ = runtime.build(OperatorContext(kube=kube))
    controller = model_controller.servers
    woken: list = []
    model_controller.queue.kick = lambda key, urgent=False: woken.append(key)
    try:
        server = kube.stored("SharedServer", NS, SERVER)
        controller.server_event({"type": None, "object": server})
        controller.kicked((NS, SERVER, server["metadata"]["uid"]))
        stored = kube.stored("SharedServer", NS, SERVER)["status"]
        assert [m["name"] for m in stored["members"]] == ["coarse", "fine", "wide"]
        assert {key[1] for key in woken} == {"coarse", "fine", "wide"}
        assert ("SharedServer", SERVER, "NotShareable") in posted
        # a member's own event wakes its server; the member reads the server's status from its watch
        kicked: list = []
        controller.queue.kick = lambda key, urgent=False: kicked.append(key)
        model_controller.model_event({"type": "MODIFIED", "object": kube.stored("RankingModel", NS, "coarse")})
        assert kicked == [(NS, SERVER, server["metadata"]["uid"])]
        model_controller.kicked((NS, "coarse", kube.stored("RankingModel", NS, "coarse")["metadata"]["uid"]))
        assert kube.stored("RankingModel", NS, "coarse")["status"]["phase"] == "Pending"
    finally:
        controller.memory.forget(kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"])


def test_a_server_image_the_cluster_does_not_allow_is_refused_before_anything_runs():
    from rankops.render.policy import TenantPolicy

    kube, memory = cluster_with_memory()
    body = kube.stored("SharedServer", NS, SERVER)
    result = servers.reconcile(kube, body, kube.list("RankingModel", NS), [], memory,
                               TenantPolicy.from_settings(image_prefixes=["registry.corp/"]))
    degraded = {c.type: c for c in result.status.conditions}["Degraded"]
    assert degraded.reason == "NotAllowedOnThisCluster" and "spec.tritonImage" in degraded.message
    assert kube.list("Deployment", NS) == [] and kube.list("Secret", NS) == []


def test_a_held_member_whose_spec_no_longer_validates_is_frozen_and_the_others_go_on():
    """A new operator process knows no earlier spec of it: it serves as it was (never unloaded; its
    Service, port, files and clients kept), loaded on no new pod; the other members are planned as
    ever, and a newcomer waits while its room cannot be counted. Fixed, it is planned again."""
    from rankops.fetcher.members import parse_members
    from rankops.render.shared_server import MEMBERS_KEY, ROUTES_KEY

    kube, memory = cluster_with_memory()
    uid = kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"]
    config_name = names.server_name(SERVER)
    try:
        first = reconcile(kube, memory)
        kube.put({**kube.stored("SharedServer", NS, SERVER), "status": first.status.to_wire()})
        before = kube.stored("ConfigMap", NS, config_name)["data"]
        policy_before = kube.stored("NetworkPolicy", NS, config_name)["spec"]["ingress"]
        good = copy.deepcopy(kube.stored("RankingModel", NS, "coarse"))
        bad = kube.stored("RankingModel", NS, "coarse")
        bad["spec"]["slo"]["p99LatencyMs"] = -5         # past the CRD (say), not past pydantic
        kube.put(bad)
        kube.put(member_body("late", "2026-12-06T05:00:00Z"))
        memory.forget(uid)
        memory.last_valid.clear()                     # a restart
        frozen = reconcile(kube, memory)
        after = kube.stored("ConfigMap", NS, config_name)["data"]
        policy_after = kube.stored("NetworkPolicy", NS, config_name)["spec"]["ingress"]
        kube.put({**kube.stored("SharedServer", NS, SERVER), "status": frozen.status.to_wire()})
        kube.put({**good, "metadata": kube.stored("RankingModel", NS, "coarse")["metadata"]})
        fixed = reconcile(kube, memory)
    finally:
        memory.forget(uid)
    lines = {m.name: m for m in frozen.status.members}
    assert (lines["coarse"].state, lines["coarse"].reason, lines["coarse"].version) == ("Failed", "InvalidSpec", "1")
    assert "its spec does not validate" in lines["coarse"].message and "until the spec is fixed" in lines["coarse"].message
    assert lines["fine"].state == "Loading" and lines["fine"].port == first.status.members[1].port
    assert lines["late"].state == "Pending" and "coarse" in lines["late"].message, "no newcomer while coarse is uncounted"
    assert kube.stored("Service", NS, "coarse") is not None and kube.stored("EndpointSlice", NS, "coarse-shared")
    assert after[ROUTES_KEY] == before[ROUTES_KEY], "every port kept"
    assert sorted(m.model for m in parse_members(after[MEMBERS_KEY], SERVER)) == \
        sorted(m.model for m in parse_members(before[MEMBERS_KEY], SERVER)), "its files kept"
    by_port = lambda rules: sorted(rules, key=lambda r: r["ports"][0]["port"])  # noqa: E731
    assert by_port(policy_after) == by_port(policy_before), "its clients kept"
    again = {m.name: m for m in fixed.status.members}
    assert again["coarse"].state == "Loading" and again["coarse"].reason != "InvalidSpec"


def test_a_member_wakes_its_server_on_a_new_spec_or_manual_control_only_and_a_pool_wakes_the_servers_on_it():
    kube, _ = cluster_with_memory()
    model_controller, _ = runtime.build(OperatorContext(kube=kube))
    controller = model_controller.servers
    kicked: list = []
    controller.queue.kick = lambda key, urgent=False: kicked.append(key)
    try:
        server = kube.stored("SharedServer", NS, SERVER)
        controller.server_event({"type": None, "object": server})
        kicked.clear()
        coarse = kube.stored("RankingModel", NS, "coarse")
        controller.member_event(coarse, None)                 # kopf's listing: noted, the server lists anyway
        controller.member_event(coarse, "MODIFIED")           # a status write's echo: same generation
        assert kicked == []
        coarse["metadata"]["generation"] = 2
        controller.member_event(coarse, "MODIFIED")
        coarse["metadata"]["annotations"] = {"other": "x"}
        controller.member_event(coarse, "MODIFIED")           # an annotation the server does not read
        assert len(kicked) == 1
        coarse["metadata"]["annotations"] = {"rankops.io/abort": "2"}
        controller.member_event(coarse, "MODIFIED")           # its switch's manual control: read by the server
        assert len(kicked) == 2
        # it leaves: spec.server dropped, its server (which still holds its seat) is woken
        left = {**coarse, "metadata": {**coarse["metadata"], "generation": 3}, "spec": {**coarse["spec"]}}
        del left["spec"]["server"]
        assert controller.was_member(coarse["metadata"]["uid"])
        controller.member_event(left, "MODIFIED")
        assert len(kicked) == 3 and kicked[-1][1] == SERVER and not controller.was_member(coarse["metadata"]["uid"])
        controller.member_event(coarse, "MODIFIED")           # back on it
        controller.member_event(coarse, "DELETED")
        assert len(kicked) == 5
        kicked.clear()
        pooled = {**server, "spec": {**server["spec"], "nodePool": "t4"}}
        controller.server_event({"type": "MODIFIED", "object": pooled})
        kicked.clear()
        controller.pool_changed("t4")
        controller.pool_changed("a100")
        assert kicked == [(NS, SERVER, server["metadata"]["uid"])]
    finally:
        controller.memory.forget(kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"])


def test_a_newcomer_named_after_another_models_service_is_refused_and_the_others_still_written():
    """A non-shared RankingModel `foo` owns the Service `foo-stable`; a member named `foo-stable`
    would take it over (or fail every write of the server): it is refused, the rest applied."""
    kube, memory = cluster_with_memory()
    kube.put({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "foo-stable", "namespace": NS, "ownerReferences": [
            {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel", "name": "foo", "uid": "u-foo",
             "controller": True}]}, "spec": {"ports": [{"port": 8000}]}})
    kube.put(member_body("foo-stable", "2026-12-06T04:00:00Z"))
    uid = kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"]
    try:
        result = reconcile(kube, memory)
    finally:
        memory.forget(uid)
    lines = {m.name: m for m in result.status.members}
    assert lines["foo-stable"].state == "Refused" and "is RankingModel foo's" in lines["foo-stable"].message
    service = kube.stored("Service", NS, "foo-stable")
    assert service["metadata"]["ownerReferences"][0]["name"] == "foo", "another model's Service is left alone"
    assert kube.stored("Service", NS, "coarse") is not None and lines["coarse"].state == "Loading"


def test_a_server_that_autoscales_reads_each_pods_counters_and_follows_the_members_load(posted):
    """Two ready pods whose metrics pages (real HTTP on 127.0.0.x:8002) count each member's requests:
    the first reading keeps the pods (no rate yet); ten seconds and 20000 req/s a member later the
    Deployment grows, said in status.autoscaling and a Scaled Event; the next look is the next reading."""
    import datetime as dt

    from hostile import Endpoint

    from rankops.render.serving import METRICS_PORT

    counts = {"coarse": 0.0, "fine": 0.0}

    def page(conn, stop):
        body = "".join(f'nv_inference_request_success{{model="{m}",version="1"}} {n}\n' for m, n in counts.items())
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body.encode())
    pages = [Endpoint(page, address=f"127.0.0.{i}", port=METRICS_PORT) for i in (2, 3)]
    kube = FakeCluster()
    kube.put({"kind": "Namespace", "metadata": {"name": NS}})
    body = copy.deepcopy(SERVER_BODY)
    body["spec"].update(maxReplicas=6, autoscaling={"enabled": True})
    kube.put(body)
    for name, created in (("coarse", "2026-12-06T01:00:00Z"), ("fine", "2026-12-06T02:00:00Z")):
        kube.put(member_body(name, created, slo={"p99LatencyMs": 40, "targetQps": 3000}, planning={
            "latencyProfile": {1: 1.0, 64: 4.0}, "failureTolerance": 0,
            "memory": {"weightsMiB": 2000, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}}))
    for i in (2, 3):
        kube.put({"kind": "Pod", "metadata": {"name": f"ranking-shared-{i}", "namespace": NS, "uid": f"pod{i}",
                                              "labels": {names.LABEL_SERVER: SERVER}},
                  "spec": {"nodeName": "n1"},
                  "status": {"podIP": f"127.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]}})
    clock = [dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)]
    memory = servers.ServerMemory(wall_clock=lambda: clock[0])
    t0 = clock[0]
    uid = kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"]

    def round_at(at):
        clock[0] = at
        stored = kube.stored("SharedServer", NS, SERVER)
        result = servers.reconcile(kube, stored, kube.list("RankingModel", NS), kube.list("Pod", NS), memory, now=at)
        stored["status"] = result.status.to_wire()
        kube.put(stored)
        return result

    try:
        admitted = round_at(t0)         # the members are admitted: read from the next round on
        assert admitted.status.autoscaling.reason == "NoReading", admitted.status.autoscaling
        first = round_at(t0 + dt.timedelta(seconds=10))
        assert first.status.autoscaling.observed_qps == {}, "no member had a rate: none is said to be idle"
        assert "coarse no rate yet (its target 3000)" in first.status.autoscaling.message
        assert set(memory.readings[uid]) == {"ranking-shared-2", "ranking-shared-3"}, "each pod's counters, in memory"
        start = first.status.replicas
        assert first.requeue_after is not None and first.requeue_after <= 10
        # 10 s at 20000 req/s a member, half on each pod: the counters each page shows
        counts.update(coarse=100000.0, fine=100000.0)
        busy = round_at(t0 + dt.timedelta(seconds=20))
    finally:
        for endpoint in pages:
            endpoint.close()
        memory.forget(uid)
    scaling = busy.status.autoscaling
    assert scaling.observed_qps["coarse"] == pytest.approx(20000, rel=0.05), scaling
    assert busy.status.replicas > start and scaling.reason == "ScaledUp", scaling.message
    assert kube.stored("Deployment", NS, "ranking-shared")["spec"]["replicas"] == busy.status.replicas
    assert any(e.reason == "Scaled" for e in busy.events)


def test_a_frozen_member_is_loaded_on_new_pods_with_the_config_its_pods_serve_never_an_edited_one():
    """After a restart with its spec broken, a frozen member is loaded on a pod without it with the
    config configs.json keeps, but only while that text and its members.json entry hash to the
    servedSha256 the operator wrote in the server's status: whoever may edit the ConfigMap cannot
    load another config, or other files; a ConfigMap nested past any parser stops nothing."""
    import json

    from rankops.fetcher.members import parse_members
    from rankops.render.shared_server import CONFIGS_KEY, MEMBERS_KEY, served_sha256

    kube, memory = cluster_with_memory()
    uid = kube.stored("SharedServer", NS, SERVER)["metadata"]["uid"]
    config_name = names.server_name(SERVER)
    first = reconcile(kube, memory)
    data = kube.stored("ConfigMap", NS, config_name)["data"]
    entry = next(m for m in parse_members(data[MEMBERS_KEY], SERVER) if m.model == "coarse")
    text = "name: \"coarse\"\nmax_batch_size: 64\n"     # as a previous round wrote it, its pods serving it
    status = first.status.to_wire()
    for line in status["members"]:
        if line["name"] == "coarse":
            line["servedSha256"] = served_sha256(SERVER, text, entry)
    kube.put({**kube.stored("SharedServer", NS, SERVER), "status": status})
    bad = kube.stored("RankingModel", NS, "coarse")
    bad["spec"]["slo"]["p99LatencyMs"] = -5
    kube.put(bad)

    def restart_with(configs_text: str, members_text: str | None = None) -> str:
        stored = kube.stored("ConfigMap", NS, config_name)
        stored["data"][CONFIGS_KEY] = configs_text
        stored["data"][MEMBERS_KEY] = members_text or data[MEMBERS_KEY]
        kube.put(stored)
        memory.forget(uid)
        memory.last_valid.clear()
        return {m.name: m for m in reconcile(kube, memory).status.members}["coarse"].message
    try:
        known = restart_with(json.dumps({"coarse": text}))
        kept = json.loads(kube.stored("ConfigMap", NS, config_name)["data"][CONFIGS_KEY])
        edited = restart_with(json.dumps({"coarse": text + "instance_group [{count: 64}]\n"}))
        moved = json.loads(data[MEMBERS_KEY])
        for m in moved["members"]:
            if m["model"] == "coarse":
                m["versions"][0]["uri"] = "s3://elsewhere/coarse/1"
        other_files = restart_with(json.dumps({"coarse": text}), json.dumps(moved))
        nested = restart_with("[" * 100_000)
    finally:
        memory.forget(uid)
    assert "loads it with the config its pods serve" in known, known
    assert kept == {"coarse": text}, "kept while frozen"
    for message in (edited, other_files, nested):
        assert "loading it on no other until the spec is fixed" in message, message


def test_a_held_members_new_version_begins_its_switch_in_the_servers_status_and_lists_both_versions():
    """coarse holds 1; its spec.version moves to 2. The server's status line keeps the switch's
    record (what a restarted operator carries on from), members.json lists 2 beside 1 for the pods'
    stager, the switch is said in an Event and on the member's own status; the Deployment's template
    does not change (no pod restarts). A new process carries on from the status alone."""
    import json

    kube = FakeCluster()
    kube.put({"kind": "Namespace", "metadata": {"name": NS}})
    kube.put(copy.deepcopy(SERVER_BODY))
    versions = [{"name": v, "modelUri": f"s3://models/coarse/{v}", "format": "onnx"} for v in ("1", "2")]
    kube.put(member_body("coarse", "2026-12-06T01:00:00Z", versions=versions))
    memory = servers.ServerMemory()

    def round_(memory):
        stored = kube.stored("SharedServer", NS, SERVER)
        result = reconcile(kube, memory)
        stored["status"] = result.status.to_wire()
        kube.put(stored)
        return result

    first = round_(memory)
    assert first.status.members[0].version == "1" and first.status.members[0].switch is None
    template = kube.stored("Deployment", NS, "ranking-shared")["spec"]["template"]
    body = kube.stored("RankingModel", NS, "coarse")
    body["spec"]["version"] = "2"
    kube.put(body)
    begun = round_(memory)
    line = begun.status.members[0]
    assert line.version == "1" and line.switch.phase == "Loading" and line.switch.version == "2", line
    assert "switching to 2 in place" in line.message
    assert begun.requeue_after is not None and begun.requeue_after <= 2, "its loads and gates answer no event"
    assert any(e.reason == "InPlaceSwitchStarted" and e.message.startswith("coarse:") for e in begun.events)
    staged = json.loads(kube.stored("ConfigMap", NS, "ranking-shared")["data"]["members.json"])
    assert [v["name"] for v in staged["members"][0]["versions"]] == ["1", "2"]
    assert kube.stored("Deployment", NS, "ranking-shared")["spec"]["template"] == template
    own = member_status(kube, "coarse", kube.stored("SharedServer", NS, SERVER))
    progressing = next(c for c in own.status.conditions if c.type == "Progressing")
    assert progressing.status == "True" and "switching to 2 in place" in progressing.message, progressing
    # A new process: the record comes back from the status (no pod to read: nothing moves, nothing lost)
    again = round_(servers.ServerMemory())
    assert again.status.members[0].switch.phase == "Loading" and again.status.members[0].version == "1"
    # The member's rankops.io/abort naming 2 rolls the switch back; the value acted on is kept in its line
    body = kube.stored("RankingModel", NS, "coarse")
    body["metadata"]["annotations"] = {"rankops.io/abort": "2"}
    kube.put(body)
    aborted = round_(servers.ServerMemory()).status.members[0]
    assert aborted.aborted == "2" and aborted.switch.phase in ("RollingBack", "RolledBack"), aborted
    assert "rankops.io/abort=2" in aborted.switch.reason and aborted.version == "1"
    kept = round_(servers.ServerMemory()).status.members[0]
    assert kept.aborted == "2" and kept.switch.phase == "RolledBack" and "rankops.io/retry=2" in kept.message


def test_a_serving_members_progressing_says_where_its_version_switch_is():
    """model_status.member_status: serving 1 with spec.version 2, by the line's switch record."""
    import datetime as dt

    from rankops.api.rankingmodel import RankingModel, RankingModelStatus
    from rankops.api.sharedserver import MemberStatus
    from rankops.model_status import member_status

    versions = [{"name": v, "modelUri": f"s3://models/coarse/{v}", "format": "onnx"} for v in ("1", "2")]
    spec = RankingModel.model_validate({**member_body("coarse", "2026-12-06T01:00:00Z", versions=versions,
                                                      version="2")}).spec
    now = dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc).isoformat()

    def progressing(phase):
        switch = None if phase is None else {"version": "2", "fromVersion": "1", "phase": phase, "since": now}
        line = MemberStatus.model_validate({"name": "coarse", "state": "Serving", "reason": "Serving", "version": "1",
                                            "message": "m", **({"switch": switch} if switch else {})})
        decided = member_status(RankingModelStatus(), spec, SERVER, line, True, 1, now)
        condition = next(c for c in decided.status.conditions if c.type == "Progressing")
        return condition.status, condition.reason
    assert progressing("Gating") == ("True", "SwitchingInPlace")
    assert progressing("RolledBack") == ("False", "SwitchStopped")
    assert progressing(None) == ("True", "VersionWaits")
