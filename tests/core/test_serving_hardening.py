"""Issue 37 (security review), the Triton serving pods: the model-control API behind a per-model key,
an optional NetworkPolicy, bounded node disk, no ServiceAccount token, read-only rankops containers,
and the operands' images set once for the cluster."""
from __future__ import annotations

import base64

import pydantic
import pytest

from rankops.api.rankingmodel import RankingModel
from rankops.controller import models, writes
from rankops.render import names
from rankops.render.desired import ServingState, desired_objects, resolve_shape
from rankops.render.policy import PolicyError, TenantPolicy, spec_problems
from rankops.render.serving import API_KEY_ENV, API_KEY_HEADER, API_KEY_SECRET_KEY
from rankops.rollout.jobs import gate_job
from tests.core.test_refused_writes import NAME, NS, UID, Cluster, body, reconcile

DIGEST = "sha256:" + "0f" * 32


def _rm(**spec) -> RankingModel:
    return RankingModel.model_validate(body(**spec))


def _objects(rm: RankingModel, policy: TenantPolicy = TenantPolicy()) -> list[dict]:
    return desired_objects(rm, ServingState(rm.spec.version), resolve_shape(rm.spec), policy=policy)


def _pod(rm: RankingModel, policy: TenantPolicy = TenantPolicy()) -> dict:
    [dep] = [o for o in _objects(rm, policy) if o["kind"] == "Deployment"]
    return dep["spec"]["template"]["spec"]


def _container(pod: dict, name: str) -> dict:
    return next(c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name)


def _gate_pods(rm: RankingModel, policy: TenantPolicy = TenantPolicy()) -> list[dict]:
    return [gate_job(rm, gate, "2", "a1", "1", policy=policy)["spec"]["template"]["spec"]
            for gate in ("warmup", "equivalence")]


# --- 1. Triton's model-control API -----------------------------------------------------------------

def test_triton_puts_its_control_apis_behind_the_models_key():
    triton = _container(_pod(_rm()), "triton")
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        [arg] = [a for a in triton["args"] if a.startswith(flag + "=")]
        apis, key = arg.split("=", 1)[1].split(":", 1)
        assert set(apis.split(",")) == {"model-repository", "logging", "trace", "shared-memory"}
        assert key == f"{API_KEY_HEADER}=$({API_KEY_ENV})", "the key is in no object but its Secret"
    assert {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {
        "name": names.api_key_secret_name(NAME), "key": API_KEY_SECRET_KEY}}} in triton["env"]
    assert "--model-control-mode=explicit" in triton["args"]


def test_the_operator_makes_each_models_key_once_random_and_owned_by_the_model():
    cluster = Cluster()
    reconcile(cluster, body())
    secret = cluster.objects[("Secret", NS, names.api_key_secret_name(NAME))]
    key = base64.b64decode(secret["data"][API_KEY_SECRET_KEY]).decode()     # stored as data, as by the API server
    assert len(key) == 64 and int(key, 16) >= 0
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    created = len(cluster.requests("create"))
    reconcile(cluster, body())
    assert len(cluster.requests("create")) == created, "made once, never rewritten"
    assert cluster.objects[("Secret", NS, names.api_key_secret_name(NAME))]["data"][API_KEY_SECRET_KEY] == secret["data"][API_KEY_SECRET_KEY]
    # A new operator process finds it and leaves it.
    cluster.memory = models.ModelMemory(writes.Writes(clock=lambda: cluster.now))
    reconcile(cluster, body())
    assert cluster.objects[("Secret", NS, names.api_key_secret_name(NAME))]["data"][API_KEY_SECRET_KEY] == secret["data"][API_KEY_SECRET_KEY]
    other = body()
    other["metadata"].update(name="other", uid="uid-2")
    reconcile(cluster, other)
    assert cluster.objects[("Secret", NS, names.api_key_secret_name("other"))]["data"][API_KEY_SECRET_KEY] != secret["data"][API_KEY_SECRET_KEY]


def test_a_network_policy_is_rendered_only_when_asked_with_its_clients_on_the_inference_ports():
    assert not [o for o in _objects(_rm()) if o["kind"] == "NetworkPolicy"]
    rm = _rm(networkPolicy={"enabled": True,
                            "clients": [{"podSelector": {"app": "web"}},
                                        {"namespaceSelector": {"kubernetes.io/metadata.name": "frontend"},
                                         "podSelector": {"app": "api"}}],
                            "metricsClients": [{"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"}}]})
    [policy] = [o for o in _objects(rm, TenantPolicy(operator_namespace="ops")) if o["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {names.LABEL_MODEL: NAME, "app.kubernetes.io/name": "triton"}
    assert spec["policyTypes"] == ["Ingress"]
    ports = lambda rule: sorted(p["port"] for p in rule["ports"])  # noqa: E731
    own, clients, metrics = spec["ingress"]
    assert own["from"] == [{"podSelector": {"matchLabels": {names.LABEL_MODEL: NAME}}}] and ports(own) == [8000, 8001, 8002]
    assert clients["from"] == [{"podSelector": {"matchLabels": {"app": "web"}}},
                               {"podSelector": {"matchLabels": {"app": "api"}},
                                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "frontend"}}}]
    assert ports(clients) == [8000, 8001], "clients never reach the metrics port"
    assert metrics["from"][0] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}
    assert ports(metrics) == [8002]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == UID
    # No clients named: the model's own namespace.
    [default] = [o for o in _objects(_rm(networkPolicy={"enabled": True})) if o["kind"] == "NetworkPolicy"]
    assert default["spec"]["ingress"][1]["from"] == [{"podSelector": {}}]
    # rollout.strategy inPlace: the operator loads and gates versions on the HTTP port, and only there.
    in_place = _rm(networkPolicy={"enabled": True}, rollout={"strategy": "inPlace"})
    [policy] = [o for o in _objects(in_place, TenantPolicy(operator_namespace="ops")) if o["kind"] == "NetworkPolicy"]
    *_, operator_http = policy["spec"]["ingress"]
    assert operator_http == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}],
                             "ports": [{"protocol": "TCP", "port": 8000}]}


def test_a_network_policy_turned_off_is_deleted():
    cluster = Cluster()
    reconcile(cluster, body(networkPolicy={"enabled": True}))
    assert ("NetworkPolicy", NS, names.network_policy_name(NAME)) in cluster.objects
    reconcile(cluster, body(2, networkPolicy={"enabled": False}))
    assert ("NetworkPolicy", NS, names.network_policy_name(NAME)) not in cluster.objects


@pytest.mark.parametrize("peer,field", [
    ({}, "podSelector, namespaceSelector or both"),
    ({"podSelector": {"bad key!": "x"}}, "podSelector"),
    ({"podSelector": {"app": "-x-"}}, "podSelector"),
    ({"podSelector": {f"k{i}": "v" for i in range(17)}}, "podSelector"),
])
def test_a_tenants_network_peers_are_bounded_and_named(peer, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        _rm(networkPolicy={"enabled": True, "clients": [peer]})
    with pytest.raises(pydantic.ValidationError, match="clients"):
        _rm(networkPolicy={"enabled": True, "clients": [{"podSelector": {}}] * 17})


# --- 3. Node disk ----------------------------------------------------------------------------------

def test_the_model_volume_and_tmp_are_sized_requested_and_limited():
    pod = _pod(_rm(storage={"modelVolumeSize": "3Gi", "tmpSize": "1Gi"}))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-repository"]["emptyDir"] == {"sizeLimit": "3Gi"}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "1Gi"}
    assert all(v["emptyDir"].get("sizeLimit") for v in pod["volumes"] if "emptyDir" in v), "no unbounded emptyDir"
    triton = _container(pod, "triton")["resources"]
    assert triton["requests"]["ephemeral-storage"] == triton["limits"]["ephemeral-storage"] == "4Gi"
    fetch = _container(pod, "fetch-model")["resources"]
    assert fetch["requests"]["ephemeral-storage"] == fetch["limits"]["ephemeral-storage"] == "3328Mi"
    # The fetcher stops at the volume's size with its own line (tests/test_fetch_model.py).
    command = _container(pod, "fetch-model")["command"]
    assert command[command.index("--max-bytes") + 1] == str(3 * 2 ** 30)
    for container in pod["containers"] + pod["initContainers"]:
        assert "ephemeral-storage" in container["resources"]["limits"], container["name"]
    defaults = _pod(_rm())
    assert {v["name"]: v for v in defaults["volumes"]}["model-repository"]["emptyDir"] == {"sizeLimit": "10Gi"}


@pytest.mark.parametrize("storage,field", [
    ({"modelVolumeSize": "3Ti"}, "storage.modelVolumeSize"), ({"modelVolumeSize": "1Mi"}, "storage.modelVolumeSize"),
    ({"tmpSize": "1Ti"}, "storage.tmpSize"), ({"tmpSize": "lots"}, "tmpSize"),
])
def test_a_tenants_disk_sizes_are_bounded_and_named(storage, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        _rm(storage=storage)


# --- 4. Tokens, root filesystems, images -----------------------------------------------------------

def test_triton_and_gate_pods_mount_no_service_account_token():
    rm = _rm()
    for pod in [_pod(rm), *_gate_pods(rm)]:
        assert pod["automountServiceAccountToken"] is False


def test_rankops_containers_run_read_only_with_a_sized_tmp():
    rm = _rm(rollout={"equivalence": {"reference": {"torchscriptUri": "s3://models/ranker/ref.pt"}}})
    pod = _pod(rm)
    checked = [(pod, _container(pod, name)) for name in ("fetch-model", "warm")]
    checked += [(gate, c) for gate in _gate_pods(rm) for c in gate["containers"] + gate["initContainers"]]
    assert {c["name"] for _, c in checked} == {"fetch-model", "warm", "gate", "fetch-reference"}
    for owner, container in checked:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]
        [tmp] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        [volume] = [v for v in owner["volumes"] if v["name"] == tmp["name"]]
        assert volume["emptyDir"]["sizeLimit"], container["name"]


def test_the_clusters_fetcher_and_gates_images_win_over_the_specs():
    fetcher, gates = f"registry.corp/ml/rankops-operator@{DIGEST}", f"registry.corp/ml/rankops-gates@{DIGEST}"
    policy = TenantPolicy.from_settings(fetcher_image=fetcher, gates_image=gates,
                                        image_prefixes=["registry.corp/", "nvcr.io/nvidia/"])
    rm = _rm(fetcherImage="docker.io/someone/fetcher:1",
             rollout={"gateJobs": {"image": "docker.io/someone/gates:1"},
                      "equivalence": {"reference": {"torchscriptUri": "s3://models/ranker/ref.pt"}}})
    pod = _pod(rm, policy)
    assert _container(pod, "fetch-model")["image"] == _container(pod, "warm")["image"] == fetcher
    assert {c["image"] for gate in _gate_pods(rm, policy) for c in gate["containers"] + gate["initContainers"]} == {gates}
    assert spec_problems(rm.spec, policy) == [], "the spec's unused images are not held against it"
    assert spec_problems(rm.spec, TenantPolicy.from_settings(image_prefixes=["registry.corp/"]))
    with pytest.raises(PolicyError, match="--gates-image"):
        TenantPolicy.from_settings(gates_image="Not An Image")
