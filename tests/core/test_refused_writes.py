"""Child writes the API server refuses (issue 12, finding 5): said in status with the API server's
reason and the field, nothing of the new generation written, retried with a growing delay; and
names checked before they reach a request path."""
from __future__ import annotations

import copy
import json

import pytest

from rankops.controller import models, refusal, writes
from rankops.controller.kube import KINDS, ApiError, InvalidName
from rankops.render import names
from tests.fakecluster import FakeCluster, roll_out

NS, NAME, UID = "reco", "ranker", "uid-1"


def body(generation: int = 1, status: dict | None = None, **spec) -> dict:
    doc = {
        "apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": generation},
        "spec": {
            "version": "1",
            "versions": [{"name": "1", "modelUri": "s3://models/ranker/1", "format": "onnx"}],
            "inputs": [{"name": "x", "dataType": "FP32", "dims": [16]}],
            "outputs": [{"name": "score", "dataType": "FP32", "dims": [1]}],
            "batching": {"maxBatchSize": 8},
            "resources": {"cpu": "1", "memory": "2Gi"},
            **spec,
        },
    }
    if status is not None:
        doc["status"] = status
    return doc


def invalid(kind: str, field: str, message: str) -> ApiError:
    exc = ApiError(status=422, reason="Unprocessable Entity")
    exc.body = json.dumps({
        "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
        "message": f"{kind} is invalid: {field}: {message}",
        "details": {"kind": kind.lower() + "s", "causes": [
            {"reason": "FieldValueInvalid", "message": message, "field": field}]}})
    return exc


class Cluster(FakeCluster):
    """A cluster whose Deployments roll out as soon as they are applied (their pods never listed),
    with what the operator watching it remembers across reconciles, on a clock of the test's."""

    def __init__(self):
        super().__init__()
        self.now = 1000.0
        self.memory = models.ModelMemory(writes.Writes(clock=lambda: self.now))
        self.after("apply", "Deployment", lambda call: roll_out(self, call.namespace, call.name))

    @property
    def writes(self) -> list[tuple[str, bool]]:
        """The applies asked for, refused ones too: (kind, dry run)."""
        return [(c.kind, c.dry_run) for c in self.requests("apply")]

    def refuse(self, kind: str, error: Exception) -> None:
        """Every write of `kind` answered with `error` until `accept(kind)`."""
        self.fail("apply", kind, error)

    def accept(self, kind: str) -> None:
        self.heal("apply", kind)


def kinds_and_names(cluster: Cluster) -> list[tuple[str, str]]:
    return [(kind, name) for kind, _, name in cluster.objects]


def reconcile(cluster: Cluster, model: dict) -> models.Result:
    return models.reconcile(cluster, model, memory=cluster.memory)


def serve(cluster: Cluster) -> dict:
    """Reconcile generation 1 until it is Ready; return its status."""
    status = None
    for _ in range(2):
        status = reconcile(cluster, body(1, status)).status.to_wire()
    assert status["phase"] == "Ready", status
    return status


def condition(status: dict, kind: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_a_refused_edit_is_degraded_with_the_reason_and_field_and_the_serving_objects_stay():
    cluster = Cluster()
    status = serve(cluster)
    before = copy.deepcopy(cluster.objects)

    cluster.refuse("Deployment", invalid("Deployment", "spec.template.metadata.annotations",
                                         "Invalid value: \"bad key\": name part must consist of alphanumerics"))
    result = reconcile(cluster, body(2, status, replicas=3, podAnnotations={"ok": "1"}))

    assert cluster.objects == before, "nothing of generation 2 may be written"
    status = result.status.to_wire()
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ChildRefused"
    for said in ("422 Invalid", "Deployment ranker-stable", "spec.template.metadata.annotations", "spec.podAnnotations",
                 "Generation 2 is not applied"):
        assert said in degraded["message"], (said, degraded["message"])
    assert status["observedGeneration"] == 2 and status["phase"] == "Degraded"
    ready = condition(status, "Ready")
    assert ready["status"] == "True", "version 1 still serves: Ready tells the truth"
    assert ready["reason"] == models.SPEC_NOT_APPLIED and ready["observedGeneration"] == 2
    assert "generation 2 is not applied" in ready["message"]
    assert [e.reason for e in result.events] == ["ChildRefused"]


def test_a_new_set_of_children_is_dry_run_first_and_a_known_one_is_not_written():
    cluster = Cluster()
    status = serve(cluster)
    cluster.calls.clear()
    reconcile(cluster, body(1, status))   # the same children again: all as observed
    assert cluster.writes == []
    edited = cluster.stored("ConfigMap", NS, names.config_map_name(NAME, names.STABLE))
    cluster.put({**edited, "data": {"config.pbtxt": "edited"}})
    reconcile(cluster, body(1, status))   # a hand edit is drift: that child alone is written again
    assert cluster.writes == [("ConfigMap", False)]
    cluster.calls.clear()
    reconcile(cluster, body(2, status, replicas=2))
    dry = [k for k, d in cluster.writes if d]
    real = [k for k, d in cluster.writes if not d]
    # The stable's budget keeps replicas - failureTolerance: it follows the replicas.
    assert dry == real == ["Deployment", "PodDisruptionBudget"], cluster.writes
    assert cluster.writes.index((real[0], False)) == len(dry), "every dry run before the first write"


def test_retries_back_off_and_a_new_generation_tries_at_once():
    cluster = Cluster()
    status = serve(cluster)
    cluster.refuse("Deployment", invalid("Deployment", "spec.template.spec.containers[0].image", "bad"))
    refused = reconcile(cluster, body(2, status, replicas=2)).status.to_wire()
    assert "next try in 10 s" in condition(refused, "Degraded")["message"]

    cluster.calls.clear()
    for _ in range(5):   # timer ticks inside the delay: no request, no new status
        again = reconcile(cluster, body(2, refused, replicas=2))
        assert again.status.to_wire() == refused and again.events == []
    assert cluster.writes == []

    cluster.now += 10
    refused = reconcile(cluster, body(2, refused, replicas=2)).status.to_wire()
    assert cluster.writes, "tried again once the delay passed"
    assert "next try in 20 s" in condition(refused, "Degraded")["message"]

    cluster.calls.clear()
    reconcile(cluster, body(3, refused, replicas=1, podAnnotations={"a": "b"}))
    assert cluster.writes, "a new generation does not wait for the delay"


def test_once_fixed_the_children_are_applied_and_degraded_clears():
    cluster = Cluster()
    status = serve(cluster)
    cluster.refuse("Deployment", invalid("Deployment", "spec.template.metadata.annotations", "bad"))
    status = reconcile(cluster, body(2, status, replicas=2)).status.to_wire()
    cluster.accept("Deployment")          # e.g. the admission policy that refused it was fixed
    cluster.now += refusal.RETRY_MAX_S
    for _ in range(2):
        status = reconcile(cluster, body(2, status, replicas=2)).status.to_wire()
    assert condition(status, "Degraded")["status"] == "False"
    assert condition(status, "Ready")["reason"] == "ReplicasReady"
    assert cluster.stored("Deployment", NS, names.deployment_name(NAME, names.STABLE))["spec"]["replicas"] == 2


def test_transient_errors_are_not_refusals():
    cluster = Cluster()
    cluster.refuse("ConfigMap", ApiError(status=503, reason="Service Unavailable"))
    with pytest.raises(ApiError):
        reconcile(cluster, body(1))
    assert cluster.memory.writes.refused == {}


def test_an_api_the_cluster_does_not_serve_is_a_refusal_naming_the_traffic_field():
    from rankops.controller.kube import ApiMissing

    cluster = Cluster()
    status = serve(cluster)
    before = copy.deepcopy(cluster.objects)
    cluster.refuse("HTTPRoute", ApiMissing("/apis/gateway.networking.k8s.io/v1/..."))
    status = reconcile(cluster, body(2, status, rollout={"canary": {"traffic": "gatewayAPI"}})).status.to_wire()
    assert cluster.objects == before
    message = condition(status, "Degraded")["message"]
    assert "HTTPRoute" in message and "not served by this cluster" in message
    assert "spec.rollout.canary.traffic" in message


def test_api_error_parsing_names_the_field_and_the_spec_field():
    found = refusal.from_api_error({"kind": "Job", "metadata": {"name": "j"}}, 422, "Unprocessable Entity",
                                   invalid("Job", "spec.template.metadata.annotations", "too long").body)
    assert (found.reason, found.field) == ("Invalid", "spec.template.metadata.annotations")
    assert found.spec_field.startswith("spec.rollout.gateJobs.podAnnotations")
    forbidden = refusal.from_api_error({"kind": "HTTPRoute", "metadata": {"name": "r"}}, 403, "Forbidden",
                                       b'{"kind":"Status","reason":"Forbidden","message":"httproutes is forbidden"}')
    assert forbidden.field is None and forbidden.reason == "Forbidden"
    assert "traffic.gatewayApi=true" in forbidden.message(4, None)
    assert [refusal.retry_delay(n) for n in (1, 2, 3, 6, 20)] == [10, 20, 40, 300, 300]


def test_a_missing_credentials_secret_is_degraded_naming_the_field_and_serving_is_left():
    cluster = Cluster()
    status = serve(cluster)
    before = copy.deepcopy(cluster.objects)
    status = reconcile(cluster, body(2, status, modelCredentialsSecret="s3-creds")).status.to_wire()
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "CredentialsSecretNotFound"
    assert "spec.modelCredentialsSecret" in degraded["message"] and "create secret generic s3-creds" in degraded["message"]
    assert cluster.objects == before
    cluster.put({"kind": "Secret", "metadata": {"name": "s3-creds", "namespace": NS}})
    for _ in range(2):
        status = reconcile(cluster, body(2, status, modelCredentialsSecret="s3-creds")).status.to_wire()
    assert condition(status, "Degraded")["status"] == "False"
    dep = cluster.stored("Deployment", NS, names.deployment_name(NAME, names.STABLE))
    fetch = dep["spec"]["template"]["spec"]["initContainers"][0]
    assert fetch["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]


@pytest.mark.parametrize("name", ["a/../../b", "..", "x?watch=1", "a%2Fb", "", "A B"])
def test_names_that_are_not_one_path_segment_never_reach_a_url(name):
    with pytest.raises(InvalidName):
        KINDS["GpuNodePool"].path(None, name or " ")
    with pytest.raises(InvalidName):
        KINDS["ConfigMap"].path(name or " ", "ok")
    assert KINDS["GpuNodePool"].path(None, "t4.pool-1") == "/apis/rankops.io/v1alpha1/gpunodepools/t4.pool-1"


def test_a_new_models_children_are_written_without_a_dry_run_deployments_last():
    cluster = Cluster()
    reconcile(cluster, body(1))
    assert cluster.writes and not [k for k, dry in cluster.writes if dry], cluster.writes
    assert cluster.writes[-1] == ("Deployment", False), "no pod starts before its siblings are accepted"
    assert ("ConfigMap", names.config_map_name(NAME, names.STABLE)) in kinds_and_names(cluster)


@pytest.mark.parametrize("refused_kind", ["Deployment", "Service"])
def test_a_refused_new_model_leaves_no_child_and_its_retries_dry_run_first(refused_kind):
    cluster = Cluster()
    cluster.refuse(refused_kind, invalid(refused_kind, "metadata.annotations", "bad"))
    status = reconcile(cluster, body(1)).status.to_wire()
    assert cluster.objects == {}, "what the refused pass created is deleted"
    assert ("Deployment", False) not in cluster.writes[:-1], "the Deployment is written last, if at all"
    assert condition(status, "Degraded")["reason"] == "ChildRefused"

    cluster.calls.clear()
    cluster.now += refusal.RETRY_MAX_S
    reconcile(cluster, body(1, status))
    assert cluster.writes and all(dry for _, dry in cluster.writes), "a model once refused dry-runs first"
    assert cluster.objects == {}

    cluster.accept(refused_kind)
    cluster.now += refusal.RETRY_MAX_S
    for _ in range(2):
        status = reconcile(cluster, body(1, status)).status.to_wire()
    assert status["phase"] == "Ready" and condition(status, "Degraded")["status"] == "False"


def test_a_refused_new_model_leaves_alone_what_another_manager_made_under_a_childs_name():
    cluster = Cluster()
    # Someone else makes a ConfigMap under the child's name after the reconcile looked and before it applies.
    cluster.before("apply", "ConfigMap", lambda call: cluster.put(
        {"kind": "ConfigMap", "metadata": {"name": call.name, "namespace": call.namespace}, "data": {"theirs": "1"}}))
    cluster.refuse("Deployment", invalid("Deployment", "metadata.annotations", "bad"))
    reconcile(cluster, body(1))
    assert [kind for kind, _ in kinds_and_names(cluster)] == ["ConfigMap"], "only what this pass made is deleted"
