"""A status written by a newer rankops (fields this one does not know, kept by the newer CRD after
the operator was rolled back) is read without its unknown fields, said once, and the model goes
on: before, one unknown key in status.rollout made every reconcile raise, with no status written."""
from __future__ import annotations

import copy
import datetime as dt

from rankops.controller import models
from rankops.controller.patching import apply_merge_patch, merge_patch
from rankops.render import names

from tests.core.test_rollout_controller import SIBLINGS, T0, gpu_cluster, run_deployment, serving_v1


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
    assert result.status.to_wire()["rollout"]["phase"] == "Canary", "the rollout goes on"
    warned = [e for e in result.events if e.reason == "StatusFieldsUnknown"]
    assert len(warned) == 1 and warned[0].type == "Warning"
    for path in ("status.rollout.trafficShadow", "status.gates[0].confidence", "status.conditions[0].severity",
                 "status.trafficMirror"):
        assert path in warned[0].message, warned[0].message
    # The write removes them (the handlers' merge patch against what was stored) ...
    patch = merge_patch(stored, result.status.to_wire())
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
    degraded = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "trafficMirror" not in result.status.to_wire()
    assert [e.reason for e in result.events].count("StatusFieldsUnknown") == 1


def _warned(result) -> list:
    return [e for e in result.events if e.reason == "StatusFieldsUnknown"]


def _with_status(cluster, rm, status: dict, after_s: float):
    """A reconcile of the model with `status` stored, `after_s` after the model's own clock."""
    return models.reconcile(cluster, {**copy.deepcopy(rm.body), "status": status},
                            now=T0 + dt.timedelta(seconds=rm.t + after_s), memory=rm.memory)


def _written(stored: dict, result) -> dict:
    """What the handlers' merge patch against the stored status leaves."""
    return apply_merge_patch(stored, merge_patch(stored, result.status.to_wire()))


def test_a_rollout_phase_this_operator_does_not_know_starts_the_rollout_again_through_its_gates():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    target = SIBLINGS[0]
    rm.body["spec"]["version"] = target
    rm.reconcile()
    rm.to_canary()
    old_attempt = rm.rollout["attempt"]
    stored = copy.deepcopy(rm.body["status"])
    stored["phase"] = "Shadowing"
    stored["rollout"].update(phase="Shadowing", promoted=f"{target}/once")   # a manual promote acted on
    rm.body["metadata"]["annotations"]["rankops.io/promote"] = f"{target}/once"   # left in place
    body = {**copy.deepcopy(rm.body), "status": stored}
    result = models.reconcile(cluster, body, now=T0 + dt.timedelta(seconds=rm.t + 10), memory=rm.memory)
    warned = _warned(result)
    assert len(warned) == 1 and warned[0].type == "Warning"
    assert "status.rollout.phase=Shadowing" in warned[0].message and "status.phase=Shadowing" in warned[0].message
    rollout = result.status.to_wire()["rollout"]
    # (its canary's pods are up already: CanaryStarting moves on to the warmup gate in the same step)
    assert rollout["phase"] == "Warming" and rollout["attempt"] != old_attempt, \
        "a phase it cannot continue: a fresh attempt, its gates again"
    assert [e.reason for e in result.events if e.type == "Normal"][:2] == ["CanaryStarting", "Warming"]
    assert rollout["promoted"] == f"{target}/once", "the manual controls acted on are kept: none acts twice"
    assert result.status.to_wire()["phase"] == "Warming" and not result.status.to_wire().get("canaryWeight"), \
        "no traffic to the canary before its gates pass"
    assert result.status.to_wire()["stableVersion"] == "1"
    # Written back, nothing more to say; the rollout converges through its gates to Promoted.
    rm.body["status"] = _written(stored, result)
    rm.t += 10
    again = models.reconcile(cluster, copy.deepcopy(rm.body), now=T0 + dt.timedelta(seconds=rm.t + 10), memory=rm.memory)
    assert not _warned(again)
    rm.body["status"] = again.status.to_wire()
    rm.to_canary()
    for _ in range(20):
        if rm.reconcile(30)["rollout"]["phase"] == "Promoting":
            break
    run_deployment(cluster, names.STABLE)
    status = rm.reconcile()
    assert status["rollout"]["phase"] == "Promoted" and status["stableVersion"] == target, status["rollout"]


def test_an_unknown_rollout_phase_of_a_version_back_to_stable_is_closed_and_stable_serves():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    rm.to_canary()
    rm.body["spec"]["version"] = "1"   # back to stable, while a newer operator's phase is stored
    stored = copy.deepcopy(rm.body["status"])
    stored["rollout"]["phase"] = "Shadowing"
    body = {**copy.deepcopy(rm.body), "status": stored}
    result = models.reconcile(cluster, body, now=T0 + dt.timedelta(seconds=rm.t + 10), memory=rm.memory)
    assert [e.message for e in _warned(result)] and "status.rollout.phase=Shadowing" in _warned(result)[0].message
    assert result.status.to_wire()["rollout"]["phase"] == "Canceled" and "Shadowing" in result.status.to_wire()["rollout"]["message"]
    assert result.status.to_wire()["phase"] == "Ready" and result.status.to_wire()["stableVersion"] == "1"
    assert not result.status.to_wire().get("canaryVersion")
    assert not cluster.get("Deployment", "reco", names.deployment_name(rm.body["metadata"]["name"], names.CANARY)), \
        "the canary of the rollout not continued goes"
    again = _with_status(cluster, rm, _written(stored, result), 20)
    assert not _warned(again) and again.status.to_wire()["phase"] == "Ready"


def test_a_model_phase_this_operator_does_not_know_is_dropped_and_decided_anew():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    stored = {**copy.deepcopy(rm.body["status"]), "phase": "Hibernating"}
    body = {**copy.deepcopy(rm.body), "status": stored}
    result = models.reconcile(cluster, body, now=T0 + dt.timedelta(seconds=rm.t + 10), memory=rm.memory)
    warned = _warned(result)
    assert len(warned) == 1 and "status.phase=Hibernating" in warned[0].message, warned
    assert result.status.to_wire()["phase"] == "Ready"
    again = _with_status(cluster, rm, _written(stored, result), 20)
    assert not _warned(again) and again.status.to_wire()["phase"] == "Ready"


def test_an_invalid_spec_with_an_unknown_rollout_phase_is_degraded_not_a_crash():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    body = copy.deepcopy(rm.body)
    body["status"]["rollout"]["phase"] = "Shadowing"
    body["spec"]["replicas"] = -1
    result = models.reconcile(cluster, body, now=T0 + dt.timedelta(seconds=rm.t + 10), memory=rm.memory)
    degraded = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and result.status.to_wire()["phase"] == "Degraded"
    assert result.status.to_wire()["rollout"]["phase"] == "Canceled"
    assert [e.reason for e in result.events].count("StatusFieldsUnknown") == 1
