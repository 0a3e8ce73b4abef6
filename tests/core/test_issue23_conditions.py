"""Issue 23, elsewhere: an invalid GpuNodePool's condition and Event only on transition (built with
set_condition), and promote/abort annotation values that mean nothing are named in a Warning."""
from __future__ import annotations

import types

from rankops.controller import pools
from rankops.controller.handlers import meaningless_manual_values

OPERATOR = types.SimpleNamespace(namespace="rankops-system", validator_service_account="sa", validator_image=None)


def test_an_invalid_pool_keeps_its_transition_time_and_warns_once() -> None:
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
            "metadata": {"name": "t4", "uid": "u1", "generation": 3}, "spec": {"nodeSelector": 5}}
    first = pools.reconcile(None, body, OPERATOR)
    [degraded] = first.status["conditions"]
    assert (degraded["type"], degraded["status"], degraded["reason"]) == ("Degraded", "True", "InvalidSpec")
    assert [e.reason for e in first.events] == ["InvalidSpec"]
    old_time = degraded["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = pools.reconcile(None, {**body, "status": first.status}, OPERATOR)
    assert again.status["conditions"][0]["lastTransitionTime"] == old_time
    assert again.events == []


def test_meaningless_promote_and_abort_values_are_named() -> None:
    versions = ["v1", "v2"]
    for value in ("yes", "true", "now", "all"):
        [message] = meaningless_manual_values({"rankops.io/promote": value}, versions)
        assert f"rankops.io/promote={value!r}" in message and "v1, v2" in message
    assert meaningless_manual_values({"rankops.io/abort": "v2", "rankops.io/promote": "v2/again"}, versions) == []
    assert len(meaningless_manual_values({"rankops.io/abort": "now", "rankops.io/promote": "all"}, versions)) == 2
