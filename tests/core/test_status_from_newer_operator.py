"""A status written by a newer rankops (fields this one does not know, kept by the newer CRD after
the operator was rolled back) is read without its unknown fields, said once, and the model goes
on: before, one unknown key in status.rollout made every reconcile raise, with no status written."""
from __future__ import annotations

import copy
import datetime as dt

from rankops.controller import models
from rankops.controller.patching import apply_merge_patch, merge_patch
from rankops.render import names

from tests.core.test_rollout_controller import SIBLINGS, T0, gpu_cluster, serving_v1


def _newer(status: dict) -> dict:
    """What a newer operator would have added to this status."""
    newer = copy.deepcopy(status)
    newer["rollout"]["trafficShadow"] = {"percent": 5}
    newer["gates"][0]["confidence"] = 0.99
    newer["conditions"][0]["severity"] = "Info"
    newer["trafficMirror"] = {"percent": 3}
    return newer


def test_a_status_written_by_a_newer_operator_is_read_without_what_it_does_not_know():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    rm.to_canary()
    stored = _newer(rm.body["status"])
    body = {**copy.deepcopy(rm.body), "status": stored}
    result = models.reconcile(cluster, body, now=T0 + dt.timedelta(seconds=rm.t + 10), memory=rm.memory)
    assert result.status["rollout"]["phase"] == "Canary", "the rollout goes on"
    warned = [e for e in result.events if e.reason == "StatusFieldsUnknown"]
    assert len(warned) == 1 and warned[0].type == "Warning"
    for path in ("status.rollout.trafficShadow", "status.gates[0].confidence", "status.conditions[0].severity",
                 "status.trafficMirror"):
        assert path in warned[0].message, warned[0].message
    # The write removes them (the handlers' merge patch against what was stored) ...
    patch = merge_patch(stored, result.status)
    assert patch["trafficMirror"] is None and patch["rollout"]["trafficShadow"] is None
    written = apply_merge_patch(stored, patch)
    assert "trafficShadow" not in written["rollout"] and "trafficMirror" not in written
    # ... so the next reconcile has nothing to say.
    again = models.reconcile(cluster, {**copy.deepcopy(rm.body), "status": written},
                             now=T0 + dt.timedelta(seconds=rm.t + 20), memory=rm.memory)
    assert not [e for e in again.events if e.reason == "StatusFieldsUnknown"]
    assert cluster.get("Deployment", "reco", names.deployment_name(rm.body["metadata"]["name"], names.CANARY))


def test_an_invalid_spec_with_a_newer_status_is_degraded_not_a_crash():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    body = copy.deepcopy(rm.body)
    body["status"] = {**body["status"], "trafficMirror": {"percent": 3}}
    body["spec"]["replicas"] = -1
    result = models.reconcile(cluster, body, now=T0 + dt.timedelta(seconds=rm.t + 10), memory=rm.memory)
    degraded = next(c for c in result.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "trafficMirror" not in result.status
    assert [e.reason for e in result.events].count("StatusFieldsUnknown") == 1
