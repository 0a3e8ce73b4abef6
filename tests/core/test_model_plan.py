"""The model's plan (rankops.modelplan): one precedence list for every reason a generation is not
applied or a model is Degraded, and an invalid pool said, not taken as "no requirements"."""
from __future__ import annotations

import copy
import datetime as dt

from rankops import modelplan
from rankops.controller import models
from rankops.api.phases import DegradedReason
from rankops.rollout import warming
from rankops.model_status import DEGRADED_PRECEDENCE, NOT_APPLIED_REASONS, SERVING_REASONS, first_problem

from tests.core.test_render_is_the_plan import _model
from tests.core.test_rollout_controller import gpu_cluster

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def test_the_first_problem_is_the_most_serious_whatever_the_order_found():
    found = [("RequestsNotBatched", "b"), ("PlanFailed", "p"), ("RolledBack", "r"), ("SomethingNew", "n")]
    assert first_problem(found) == ("PlanFailed", "p")
    assert first_problem([("SomethingNew", "n"), ("RequestsNotBatched", "b")]) == ("RequestsNotBatched", "b")
    assert first_problem([]) is None
    assert DEGRADED_PRECEDENCE[:len(NOT_APPLIED_REASONS)] == NOT_APPLIED_REASONS


def test_the_precedence_is_the_degraded_reasons_enum_in_its_order():
    assert DEGRADED_PRECEDENCE == tuple(DegradedReason)[:-1] and tuple(DegradedReason)[-1] == "AsExpected"
    assert NOT_APPLIED_REASONS + SERVING_REASONS == DEGRADED_PRECEDENCE
    assert NOT_APPLIED_REASONS[-1] == "ChildRefused" and SERVING_REASONS[0] == "RolledBack"
    assert DegradedReason.WARMUP_FAILING == warming.WARMUP_FAILING, "the warm container's reason, said by Degraded"
    assert modelplan.POLICY_REASON in NOT_APPLIED_REASONS


def test_an_invalid_pool_is_said_and_nothing_is_applied():
    cluster = gpu_cluster()
    cluster.put({"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool", "metadata": {"name": "t4"},
                 "spec": {"nodeSelector": {"a": "b"}, "requirements": {"minDriverVersion": 535}}})
    body = _model("pooled", nodePool="t4")
    body["metadata"].update(uid="u", generation=1)
    result = models.reconcile(cluster, body, now=T0)
    degraded = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "NodePoolInvalid" and "GpuNodePool t4 has an invalid spec" in degraded["message"]
    assert "minDriverVersion" in degraded["message"]
    assert cluster.applied == [], "its requirements cannot place the model: nothing is applied"
    ready = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "SpecNotApplied"


def test_a_missing_secret_outranks_a_missing_pool_and_stops_the_reading_there():
    cluster = gpu_cluster()
    body = _model("pooled", nodePool="absent", modelCredentialsSecret="store")
    body["metadata"].update(uid="u", generation=1)
    result = models.reconcile(cluster, body, now=T0)
    degraded = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "CredentialsSecretNotFound"
    observed = models.observe(cluster, modelplan.parse(body)[0], {}, T0)
    assert observed.credentials_secret_exists is False and observed.pool is None, "the pool is not read after that"


def test_render_of_a_model_the_policy_refuses_fails_as_the_operator_refuses_it():
    body = _model("hostpath")
    body["spec"]["versions"][0]["modelUri"] = "file:///etc/shadow"
    done = modelplan.as_new(copy.deepcopy(body))
    assert done.not_applied == "NotAllowedOnThisCluster" and done.applies == ()
