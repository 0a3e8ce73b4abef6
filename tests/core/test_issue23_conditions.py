"""Issue 23, elsewhere: an invalid GpuNodePool's condition and Event only on transition (built with
set_condition), and promote/abort annotation values that mean nothing are named in a Warning."""
from __future__ import annotations

import types

from rankops.controller import pools
from rankops.controller.runtime import meaningless_manual_values

OPERATOR = types.SimpleNamespace(namespace="rankops-system", validator_service_account="sa", validator_image=None)


def test_an_invalid_pool_keeps_its_transition_time_and_warns_once() -> None:
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
            "metadata": {"name": "t4", "uid": "u1", "generation": 3}, "spec": {"nodeSelector": 5}}
    first = pools.reconcile(None, body, OPERATOR)
    stored = first.status.to_wire()
    [degraded] = stored["conditions"]
    assert (degraded["type"], degraded["status"], degraded["reason"]) == ("Degraded", "True", "InvalidSpec")
    assert [e.reason for e in first.events] == ["InvalidSpec"]
    old_time = degraded["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = pools.reconcile(None, {**body, "status": stored}, OPERATOR)
    assert again.status.to_wire()["conditions"][0]["lastTransitionTime"] == old_time
    assert again.events == []


def test_meaningless_promote_and_abort_values_are_named() -> None:
    versions = ["v1", "v2"]
    for value in ("yes", "true", "now", "all"):
        [message] = meaningless_manual_values({"rankops.io/promote": value}, versions)
        assert f"rankops.io/promote={value!r}" in message and "v1, v2" in message
    assert meaningless_manual_values({"rankops.io/abort": "v2", "rankops.io/promote": "v2/again"}, versions) == []
    assert len(meaningless_manual_values({"rankops.io/abort": "now", "rankops.io/promote": "all"}, versions)) == 2


def _model(**spec):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_render import base_doc
    from rankops.api.rankingmodel import RankingModel
    doc = base_doc()
    doc["spec"].update(spec)
    return RankingModel.model_validate({**doc, "metadata": {"name": "m", "namespace": "ns"}})


def test_the_reference_is_fetched_with_the_models_secret_and_bounds() -> None:
    from rankops.render.policy import TenantPolicy, spec_problems
    from rankops.rollout.jobs import gate_job
    rm = _model(modelCredentialsSecret="models-s3", fetch={"deadlineSeconds": 120, "stallSeconds": 10},
                rollout={"equivalence": {"reference": {"torchscriptUri": "s3://bucket/ref/model.pt"}}})
    job = gate_job(rm, "equivalence", "v2", "1", "v1")
    [init] = job["spec"]["template"]["spec"]["initContainers"]
    assert init["envFrom"] == [{"secretRef": {"name": "models-s3"}}]
    assert init["command"][-4:] == ["--deadline-s", "120", "--stall-s", "10"]
    local = _model(rollout={"equivalence": {"reference": {"torchscriptUri": "file:///srv/models/ref.pt"}}})
    assert any("torchscriptUri" in p and "file://" in p for p in spec_problems(local.spec, TenantPolicy()))
    assert spec_problems(local.spec, TenantPolicy.from_settings(["/srv/models"])) == []
    volumes = gate_job(local, "equivalence", "v2", "1", "v1")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "reference", "hostPath": {"path": "/srv/models/ref.pt", "type": "File"}} in volumes


def test_a_pvc_reference_is_refused() -> None:
    import pytest
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="torchscriptUri"):
        _model(rollout={"equivalence": {"reference": {"torchscriptUri": "pvc://claim/ref.pt"}}})
