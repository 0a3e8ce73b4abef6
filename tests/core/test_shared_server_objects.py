"""A shared Triton server's objects (render/shared_server), pure: one pod template, the server's
own, serving several RankingModels, each behind its own Service and port."""
from __future__ import annotations

import json

import pytest

from rankops.api.sharedserver import SharedServerSpec
from rankops.fetcher.members import parse_members
from rankops.render import names
from rankops.render.serving import pool_placement
from rankops.render.shared_server import (FIRST_MEMBER_PORT, PodEndpoint, ServerMember, assign_ports,
                                          member_endpoints, member_problems, server_objects)
from rankops.triton.route import parse_routes
from test_server_plan import member as member_view

SERVER = SharedServerSpec(gpuMemoryMiB=15360, failureTolerance=1, resources={"cpu": "4", "memory": "16Gi"},
                          modelCredentialsSecret="store")


def member(name: str, **spec) -> ServerMember:
    view = member_view(name, **spec)
    return ServerMember(view.name, view.spec, view.spec.version)


def render(members, ports=None, server=SERVER, replicas=3):
    ports = ports or assign_ports([m.name for m in members], {})
    return {(o["kind"], o["metadata"]["name"]): o
            for o in server_objects("ranking", "reco", server, members, ports, replicas, pool_placement(None, None))}


THREE = ("coarse", "fine", "rerank")


def test_each_member_gets_a_service_of_its_own_name_on_its_own_port():
    objects = render([member(n) for n in THREE])
    for name, port in zip(THREE, (9000, 9001, 9002)):
        svc = objects[("Service", name)]
        assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": port}]
        assert "selector" not in svc["spec"], "a member's endpoints are the pods where it serves"
    config = objects[("ConfigMap", "ranking-shared")]["data"]
    assert parse_routes(config["routes.json"]) == {9000: "coarse", 9001: "fine", 9002: "rerank"}
    staged = parse_members(config["members.json"], "ranking")
    assert [(m.model, m.expect, [v.uri for v in m.versions]) for m in staged] == [
        (n, "model.onnx", [f"s3://models/{n}/1"]) for n in THREE]
    pod = objects[("Deployment", "ranking-shared")]["spec"]["template"]
    triton, route, stage = pod["spec"]["containers"]
    assert "--model-control-mode=explicit" in triton["args"] and not any("--load-model" in a for a in triton["args"])
    assert triton["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1",
                                             "ephemeral-storage": triton["resources"]["limits"]["ephemeral-storage"]}
    assert route["command"][:2] == ["rankops", "route"] and stage["command"][:2] == ["rankops", "stage-members"]
    assert stage["envFrom"] == [{"secretRef": {"name": "store"}}]
    assert objects[("PodDisruptionBudget", "ranking-shared")]["spec"]["minAvailable"] == 2


def test_a_member_joining_or_leaving_never_changes_the_pod_template():
    # (the replicas may change: the cards the members need; they are not in the template)
    three = render([member(n) for n in THREE])
    four = render([member(n) for n in (*THREE, "extra")],
                  assign_ports([*THREE, "extra"], {"coarse": 9000, "fine": 9001, "rerank": 9002}))
    two = render([member("coarse"), member("rerank")], assign_ports(["coarse", "rerank"], {"rerank": 9002}))
    deployments = [objs[("Deployment", "ranking-shared")]["spec"]["template"] for objs in (three, four, two)]
    assert deployments[0] == deployments[1] == deployments[2]
    assert not any(n in json.dumps(deployments[0]) for n in (*THREE, "extra"))
    assert ("Service", "extra") in four and ("Service", "fine") not in two
    assert two[("Service", "rerank")]["spec"]["ports"][0]["targetPort"] == 9002   # rerank keeps its port


def test_ports_are_kept_and_freed():
    assert assign_ports(["a", "b", "c"], {"b": 9005}) == {"b": 9005, "a": 9000, "c": 9001}
    assert assign_ports(["a", "b"], {"a": 9001, "b": 9001}) == {"a": 9001, "b": 9000}
    assert assign_ports(["a"], {"a": 80}) == {"a": FIRST_MEMBER_PORT}, "a port outside the range is not kept"
    with pytest.raises(ValueError, match="at most 32"):
        assign_ports([f"m{i}" for i in range(33)], {})


@pytest.mark.parametrize("spec, expected", [
    ({"modelCredentialsSecret": "other"}, "coarse: spec.modelCredentialsSecret is 'other' and the server fetches "
                                          "with 'store': a running pod cannot mount another Secret"),
    ({"tritonImage": "nvcr.io/nvidia/tritonserver:24.08-py3"}, "coarse: spec.tritonImage is"),
    ({"nodePool": "t4"}, "coarse: spec.nodePool is 't4' and the server's None"),
    ({"responseCache": True}, "coarse: spec.responseCache is true and the server runs no response cache"),
    ({"disruption": {"exitTimeoutSeconds": 120, "terminationGracePeriodSeconds": 200}},
     "coarse: spec.disruption.exitTimeoutSeconds is 120 and the server's 15"),
    ({"warmReplicas": {"enabled": True}}, "coarse: spec.warmReplicas.enabled is true"),
    ({"latencyIsolation": True, "resources": {"cpu": "2", "memory": "2Gi"}}, "coarse: spec.latencyIsolation is true"),
    ({"gpusPerReplica": 2}, "coarse: spec.gpusPerReplica is 2"),
    ({"autoscaling": {"enabled": True, "maxReplicas": 4}}, "coarse: spec.autoscaling.enabled is true: a member's pods "
                                                          "are the server's"),
    ({"networkPolicy": {"metricsClients": [{"podSelector": {"app": "prometheus"}}]}},
     "coarse: spec.networkPolicy.metricsClients is set: Triton's metrics port shows every member's counters"),
    ({"versions": [{"name": "1", "modelUri": "file:///models/coarse/1", "format": "onnx"}]},
     "coarse: spec.versions[0].modelUri is mounted, not fetched"),
])
def test_a_member_needing_what_the_server_does_not_give_is_refused_naming_the_field_and_fix(spec, expected):
    problems = member_problems(SERVER, member("coarse", **spec))
    assert len(problems) == 1 and expected in problems[0], problems
    assert member_problems(SERVER, member("coarse", modelCredentialsSecret="store")) == []
    assert member_problems(SERVER, member("coarse", warmReplicas={"enabled": False})) == []
    assert member_problems(SERVER, member("coarse", autoscaling={"maxAvgQueueMs": 20})) == []


def test_the_server_spreads_and_keeps_its_own_budget():
    server = SharedServerSpec(gpuMemoryMiB=15360, failureTolerance=2, disruption={"nodeSpread": "required"})
    objects = render([member(n) for n in THREE], server=server, replicas=4)
    assert objects[("PodDisruptionBudget", "ranking-shared")]["spec"]["minAvailable"] == 2
    spread = objects[("Deployment", "ranking-shared")]["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["whenUnsatisfiable"] == "DoNotSchedule"
    assert all(c["labelSelector"] == {"matchLabels": {names.LABEL_SERVER: "ranking"}} for c in spread)


def test_tritons_own_ports_admit_only_the_operator_and_each_member_port_its_own_clients():
    objects = render([member("coarse", networkPolicy={"clients": [{"podSelector": {"app": "feed"}}]}),
                      member("fine")])
    triton_rule, coarse_rule, fine_rule = objects[("NetworkPolicy", "ranking-shared")]["spec"]["ingress"]
    assert {p["port"] for p in triton_rule["ports"]} == {8000, 8002}
    assert triton_rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "rankops-system"}}}]
    assert coarse_rule == {"from": [{"podSelector": {"matchLabels": {"app": "feed"}}}],
                           "ports": [{"protocol": "TCP", "port": 9000}]}
    assert fine_rule == {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 9001}]}


def test_a_members_endpoints_are_ready_only_where_it_serves_and_the_pod_is_not_draining():
    slice_ = member_endpoints("coarse", "ranking", "reco", 9000, [
        PodEndpoint("ranking-shared-c", "", None, False),
        PodEndpoint("ranking-shared-b", "10.0.0.2", "node-2", False),
        PodEndpoint("ranking-shared-a", "10.0.0.1", "node-1", True),
        PodEndpoint("ranking-shared-d", "10.0.0.4", "node-1", True, terminating=True)])
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "coarse"
    assert slice_["addressType"] == "IPv4"
    assert slice_["ports"] == [{"name": "http", "port": 9000, "protocol": "TCP"}]
    assert [(e["addresses"], e["conditions"]) for e in slice_["endpoints"]] == [
        (["10.0.0.1"], {"ready": True, "serving": True, "terminating": False}),
        (["10.0.0.2"], {"ready": False, "serving": False, "terminating": False}),
        (["10.0.0.4"], {"ready": False, "serving": True, "terminating": True})]
    six = member_endpoints("coarse", "ranking", "reco", 9000, [PodEndpoint("a", "fd00::1", None, True),
                                                               PodEndpoint("b", "10.0.0.2", None, True)])
    assert six["addressType"] == "IPv6" and [e["addresses"] for e in six["endpoints"]] == [["fd00::1"]]


def test_configs_json_keeps_the_frozen_first_then_the_smallest_and_reads_back_only_maps_of_text():
    import json

    from rankops.render.shared_server import MAX_CONFIGS_BYTES, configs_json, parse_configs

    big = "x" * (MAX_CONFIGS_BYTES // 2)
    configs = {"a-large": big, "b-large": big, "c-small": "small", "z-frozen": big}
    kept = json.loads(configs_json(configs, first={"z-frozen"}))
    assert set(kept) == {"z-frozen", "c-small"}, "a frozen member's entry cannot be written again: it goes first"
    assert parse_configs(configs_json({"m": "text"})) == {"m": "text"}
    for hostile in ("[" * 100_000, '{"m": "\\ud800"}', '["m"]', '{"m": 1}', "not json", "x" * (3 * MAX_CONFIGS_BYTES)):
        assert parse_configs(hostile) == {}, hostile[:20]
