"""Hostile and oversized RankingModels against a live API server (issue 12, findings 5-7 and 10).

What can be refused is refused at apply (the CRD's schema and CEL rules, the admission policy
beside it) with the field named; what only a child write or a lookup shows is said in status
(Degraded with the API server's reason, Ready at the new generation saying it is not applied)
while the serving objects stay as they were; a model whose spec is large is still deletable.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from e2e import models, rollouts
from e2e.support import gone, wait_for
from rankops.gates.verdict import Verdict
from rankops.render import names

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")


def _kubectl_apply(cluster, namespace: str, body: dict) -> subprocess.CompletedProcess[str]:
    # create, not apply --server-side: server-side apply refuses a list with two equal items before
    # the CRD's rules run, with a message that names no rule.
    return subprocess.run([cluster.tool("kubectl"), "create", "-n", namespace, "-f", "-"],
                          input=yaml.safe_dump(body), env=cluster.env, capture_output=True, text=True,
                          timeout=60)


def _deployment(k8s, namespace: str, model: str):
    return k8s.apps.read_namespaced_deployment(names.deployment_name(model, names.STABLE), namespace)


HOSTILE = [
    pytest.param({"podAnnotations": {"bad key": "x"}}, "qualified names", id="annotation-key"),
    pytest.param({"podAnnotations": {"big": "x" * (1024 * 1024)}}, "spec.podAnnotations", id="annotation-1MiB"),
    pytest.param({"modelCredentialsSecret": "Bad_Secret!"}, "spec.modelCredentialsSecret", id="secret-name"),
    pytest.param({"nodePool": "a/../../b"}, "spec.nodePool", id="node-pool-path"),
    pytest.param({"inputs": [{"name": "x", "dataType": "FP32", "dims": [0]}]}, "-1 (variable) or at least 1",
                 id="dims-zero"),
    pytest.param({"inputs": [{"name": "x", "dataType": "FP64", "dims": [1000000, 1000000]}],
                  "candidates": None, "batching": {"maxBatchSize": 4096}}, "over 2 GiB", id="tensor-exabytes"),
    pytest.param({"tritonImage": "nvcr.io/nvidia/triton server:24.05"}, "spec.tritonImage", id="image-with-space"),
    pytest.param({"resources": {"cpu": "1", "memory": "100000000000000000000Ti"}}, "at most 16Ti",
                 id="memory-1e20Ti"),
    pytest.param({"versionList": [{"name": "1", "modelUri": "s3://m/1", "format": "onnx"},
                                  {"name": "1", "modelUri": "s3://m/2", "format": "onnx"}]},
                 "each version name may appear only once", id="duplicate-versions"),
    pytest.param({"batching": {"maxBatchSize": 512, "junk": "x" * 1000}}, "spec.batching may only hold",
                 id="batching-extra-key"),
    # CEL rules guard their types: a number where a word or object goes is a sentence, never
    # "got 'types.Int', expected iterable type".
    pytest.param({"rollout": {"equivalence": {"reference": 5}}}, "spec.rollout.equivalence.reference must be",
                 id="reference-number"),
    pytest.param({"rollout": {"equivalence": {"reference": ["stable"]}}},
                 "spec.rollout.equivalence.reference must be", id="reference-list"),
    pytest.param({"batching": 7}, "spec.batching must be", id="batching-number"),
]


@pytest.mark.parametrize("override, says", HOSTILE)
def test_hostile_input_is_refused_at_apply_naming_the_field(cluster, k8s, namespace, operator, override, says):
    override = dict(override)
    version_list = override.pop("versionList", None)
    body = models.model_manifest("hostile", **override)
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    if version_list:
        body["spec"]["versions"] = version_list
    done = _kubectl_apply(cluster, namespace, body)
    assert done.returncode != 0, f"accepted: {str(override)[:200]}"
    assert says in done.stderr, done.stderr[:2000]
    assert "expected iterable type" not in done.stderr and "no such overload" not in done.stderr, done.stderr[:2000]
    assert gone(lambda: models.get(k8s, namespace, "hostile"))


def test_a_253_character_name_is_refused_at_apply(cluster, k8s, namespace, operator):
    body = models.model_manifest("a" * 253)
    done = _kubectl_apply(cluster, namespace, body)
    assert done.returncode != 0 and "metadata.name must be a DNS label of at most 40 characters" in done.stderr, \
        done.stderr[:2000]


def _big_spec(name: str) -> dict:
    """A spec of about 300 KiB that every bound accepts: 4 annotation maps near their limit, and
    versions with long URIs."""
    near_limit = {f"example.com/note-{i}": "n" * 16_000 for i in range(4)}   # 64 076 of 65 536 characters
    body = models.model_manifest(name, podAnnotations=near_limit, rollout={
        "gateJobs": {"podAnnotations": near_limit}, "warmup": {"podAnnotations": near_limit},
        "equivalence": {"podAnnotations": near_limit}})
    body["spec"]["versions"] += [{"name": f"v{i}", "modelUri": f"s3://models/{name}/{i}/" + "p" * 2000,
                                  "format": "onnx"} for i in range(20)]
    return body


def test_a_model_with_a_big_accepted_spec_is_deleted_and_its_namespace_terminates(k8s, namespace, operator):
    body = _big_spec("big")
    assert len(json.dumps(body["spec"])) > 256 * 1024, "more than fits in the annotations of one object"
    models.create(k8s, namespace, body)
    models.wait_ready(k8s, namespace, "big")
    k8s.core.delete_namespace(namespace, propagation_policy="Background")
    wait_for(lambda: gone(lambda: k8s.core.read_namespace(namespace)), 120,
             f"namespace {namespace} with a ~300 KiB RankingModel terminated")


def _sim_pass(gate: str, duration: str) -> dict:
    """Pod annotations that make kwok end a gate pod with a passing verdict after `duration`."""
    verdict = Verdict(gate, "pass", "Passed", f"{gate} ok", {})
    return {"podAnnotations": {"sim.rankops.io/exit-code": str(verdict.exit_code),
                               "sim.rankops.io/termination-message": verdict.to_json(),
                               "sim.rankops.io/duration": duration}}


def test_deleting_a_namespace_with_a_model_mid_rollout_is_quiet(k8s, namespace, operator):
    """Finding 10: while a namespace was deleted, its models were still reconciled; each write into
    it (re-creating a child the namespace controller had just removed) was refused 'because it is
    being terminated' and kopf logged that at ERROR (179 lines over one run), which the e2e guard,
    looking for ' ERROR ', never saw. Now none is logged at any level. A finalizer of the test's
    holds the models (and so the namespace) in deletion long enough for those reconciles to happen."""
    hold = "e2e.rankops.io/hold"
    models.create(k8s, namespace, models.model_manifest("serving"))
    models.create(k8s, namespace, models.model_manifest("rolling", version="1", versions=("1", "2"), rollout={
        "warmup": _sim_pass("warmup", "1s"), "equivalence": _sim_pass("equivalence", "300s"),
        "gateJobs": {"timeoutSeconds": 600}}))
    models.wait_ready(k8s, namespace, "serving")
    models.wait_ready(k8s, namespace, "rolling")
    models.patch_spec(k8s, namespace, "rolling", {"version": "2"})
    rollouts.watch_phases(k8s, namespace, "rolling", "2", {"Verifying"}, timeout=60)  # a canary and gate Jobs

    def set_finalizers(name: str, change) -> None:
        current = models.get(k8s, namespace, name)["metadata"].get("finalizers") or []
        k8s.custom.patch_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.PLURAL, name, {
            "metadata": {"finalizers": change(current)}})

    for name in ("serving", "rolling"):
        set_finalizers(name, lambda fs: [*fs, hold])
    before = len(operator.errors())
    log_before = len(operator.log_path.read_text(errors="replace"))
    k8s.core.delete_namespace(namespace, propagation_policy="Background")
    try:
        # The namespace controller removes the children; the held models stay, being deleted.
        wait_for(lambda: not k8s.apps.list_namespaced_deployment(namespace).items
                 and not k8s.batch.list_namespaced_job(namespace).items, 120, "the children removed")
        # ...and the operator has run its deletion handlers (only the test's finalizer is left).
        wait_for(lambda: all(m.get("deletionTimestamp") and m.get("finalizers") == [hold] for m in (
            models.get(k8s, namespace, n)["metadata"] for n in ("serving", "rolling"))), 60, "the models held")
        time.sleep(5)   # the operator's timers and child watches had reconciled them here, into the namespace
        assert not k8s.apps.list_namespaced_deployment(namespace).items, "a child re-created in the dying namespace"
    finally:
        for name in ("serving", "rolling"):
            set_finalizers(name, lambda fs: [f for f in fs if f != hold])
    wait_for(lambda: gone(lambda: k8s.core.read_namespace(namespace)), 180,
             f"namespace {namespace} with a model mid-rollout terminated")
    assert operator.errors()[before:] == []
    refused = [line for line in operator.log_path.read_text(errors="replace")[log_before:].splitlines()
               if "being terminated" in line]
    assert refused == [], "writes into the terminating namespace"


def test_a_spec_too_big_to_serve_is_refused_at_apply_with_the_limit(cluster, k8s, namespace, operator):
    too_big = {f"example.com/note-{i}": "n" * 15_000 for i in range(6)}     # 90 000 characters in one map
    done = _kubectl_apply(cluster, namespace, models.model_manifest("huge", podAnnotations=too_big))
    assert done.returncode != 0
    assert "spec.podAnnotations" in done.stderr and "at most 65536 characters" in done.stderr, done.stderr[:2000]


def test_a_child_write_the_api_server_refuses_is_degraded_at_the_new_generation(k8s, namespace, operator):
    """gatewayAPI traffic where the chart grants no HTTPRoutes (and no Gateway API is installed)."""
    models.create(k8s, namespace, models.model_manifest("gw"))
    models.wait_ready(k8s, namespace, "gw")
    before = _deployment(k8s, namespace, "gw")
    config = k8s.core.read_namespaced_config_map(names.config_map_name("gw", names.STABLE), namespace)

    models.patch_spec(k8s, namespace, "gw", {"replicas": 2, "rollout": {"canary": {"traffic": "gatewayAPI"}}})
    rm = models.wait_status(k8s, namespace, "gw", lambda rm: rm["status"].get("observedGeneration") == 2
                            and models.condition(rm, "Degraded").get("reason") == "ChildRefused",
                            "the refused HTTPRoute said in status at generation 2")
    degraded = models.condition(rm, "Degraded")["message"]
    assert "refused HTTPRoute gw" in degraded and ("403 Forbidden" in degraded or "404" in degraded), degraded
    assert "spec.rollout.canary.traffic" in degraded and "next try in" in degraded, degraded
    ready = models.condition(rm, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "SpecNotApplied" and ready["observedGeneration"] == 2
    assert rm["status"]["phase"] == "Degraded"
    after = _deployment(k8s, namespace, "gw")
    assert after.metadata.resource_version == before.metadata.resource_version, "generation 2 not half-applied"
    assert k8s.core.read_namespaced_config_map(names.config_map_name("gw", names.STABLE), namespace) \
        .metadata.resource_version == config.metadata.resource_version
    models.wait_event(k8s, namespace, "gw", "ChildRefused")

    models.patch_spec(k8s, namespace, "gw", {"rollout": {"canary": {"traffic": "replicas"}}})
    rm = models.wait_ready(k8s, namespace, "gw")
    assert models.condition(rm, "Degraded")["status"] == "False"
    assert _deployment(k8s, namespace, "gw").spec.replicas == 2


def test_a_missing_credentials_secret_is_named_and_serving_is_left_alone(k8s, namespace, operator):
    models.create(k8s, namespace, models.model_manifest("creds"))
    models.wait_ready(k8s, namespace, "creds")
    before = _deployment(k8s, namespace, "creds")

    models.patch_spec(k8s, namespace, "creds", {"modelCredentialsSecret": "s3-creds"})
    rm = models.wait_status(k8s, namespace, "creds", lambda rm: models.condition(rm, "Degraded").get("reason")
                            == "CredentialsSecretNotFound", "the missing Secret said in status")
    message = models.condition(rm, "Degraded")["message"]
    assert "s3-creds" in message and "spec.modelCredentialsSecret" in message and "create secret" in message
    assert rm["status"]["observedGeneration"] == 2
    assert _deployment(k8s, namespace, "creds").metadata.resource_version == before.metadata.resource_version

    k8s.core.create_namespaced_secret(namespace, {"metadata": {"name": "s3-creds"},
                                                  "stringData": {"AWS_ACCESS_KEY_ID": "x"}})
    models.wait_ready(k8s, namespace, "creds")
    fetch = _deployment(k8s, namespace, "creds").spec.template.spec.init_containers[0]
    assert fetch.env_from[0].secret_ref.name == "s3-creds"
