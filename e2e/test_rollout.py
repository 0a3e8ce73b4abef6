"""Gated rollout where the gates' timing must be controlled: resume after a kill mid-gate, a
version superseding a running rollout, a gate that never finishes, a forged status.

Promotion and rollback on real verdicts are in test_rollout_real.py (pods that really run). Here
the pods are kwok's: each gate Job's pod reports what a real gate would, for as long as the test
needs: the test sets, through the user-facing `rollout.<gate>.podAnnotations`, the exit code, the
termination message (a real verdict, built with the gates' own Verdict) and the duration that
kwok's pod-sim-exit stage plays back. Everything else (Deployments, Jobs, phases, status, Events)
is the operator's own doing.
"""
from __future__ import annotations

import pytest

from e2e import models, rollouts
from e2e.support import wait_for
from rankops.gates.verdict import Verdict
from rankops.render import names

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")



def _sim(verdict: Verdict, duration: str | None = None) -> dict[str, str]:
    """Pod annotations that make kwok end a gate pod the way this verdict would."""
    annotations = {"sim.rankops.io/exit-code": str(verdict.exit_code),
                   "sim.rankops.io/termination-message": verdict.to_json()}
    if duration:
        annotations["sim.rankops.io/duration"] = duration
    return annotations


WARMUP_PASS = Verdict("warmup", "pass", "WithinBound", "2000 requests, 0 errors, p99 6.1 ms <= 15 ms",
                      {"requests": 2000, "errors": 0, "p99Ms": 6.1})
EQUIVALENCE_PASS = Verdict("equivalence", "pass", "Equivalent",
                           "max abs 1.1e-04, top-50 overlap 0.998, kendall tau 0.997",
                           {"maxAbsError": 1.1e-4, "topKOverlap": 0.998, "rankCorrelation": 0.997})


def _rollout(equivalence: Verdict = EQUIVALENCE_PASS, equivalence_duration: str | None = None) -> dict:
    return {
        "warmup": {"podAnnotations": _sim(WARMUP_PASS)},
        "equivalence": {"podAnnotations": _sim(equivalence, equivalence_duration)},
        # kwok's pods serve nothing, so no canary analysis can judge them: these tests of the
        # machine's timing move on at the end of the hold by explicit policy (said in status.gates).
        "canary": {"weight": 50, "durationSeconds": 3, "analysis": {"onNoVerdict": "promote", "maxExtensionSeconds": 0}},
        "gateJobs": {"timeoutSeconds": 120},
    }


def test_operator_killed_while_verifying_resumes_without_duplicate_jobs(k8s, namespace, operator):
    models.create(k8s, namespace, models.model_manifest("resume", version="1", versions=("1", "2"),
                                                        rollout=_rollout(equivalence_duration="8s")))
    models.wait_ready(k8s, namespace, "resume")
    models.patch_spec(k8s, namespace, "resume", {"version": "2"})
    seen, _, _ = rollouts.watch_phases(k8s, namespace, "resume", "2", {"Verifying"}, timeout=60)
    operator.kill()
    try:
        jobs_before = {j.metadata.name: j.metadata.uid for j in rollouts.gate_jobs(k8s, namespace, "resume")}
        assert len(jobs_before) == 2, jobs_before
    finally:
        operator.start()
    seen_after, rm, _ = rollouts.watch_phases(k8s, namespace, "resume", "2", {"Promoted", "RolledBack"})
    assert seen_after[-1] == "Promoted", (seen_after, rm["status"])
    jobs_after = {j.metadata.name: j.metadata.uid for j in rollouts.gate_jobs(k8s, namespace, "resume")}
    assert jobs_after == jobs_before  # the same two Jobs, not re-created
    models.wait_status(k8s, namespace, "resume", lambda rm: rm["status"].get("stableVersion") == "2"
                       and rm["status"].get("phase") == "Ready", "v2 stable after the resumed rollout")


def test_a_new_version_mid_rollout_supersedes_it_cleanly(k8s, namespace, operator):
    rollout = _rollout(equivalence_duration="300s")   # v2's equivalence gate would run for 5 minutes
    models.create(k8s, namespace, models.model_manifest("switch", version="1", versions=("1", "2", "3"),
                                                        rollout=rollout))
    models.wait_ready(k8s, namespace, "switch")
    models.patch_spec(k8s, namespace, "switch", {"version": "2"})
    rollouts.watch_phases(k8s, namespace, "switch", "2", {"Verifying"}, timeout=60)
    v2_jobs = {j.metadata.name for j in rollouts.gate_jobs(k8s, namespace, "switch")}

    fast = _rollout()
    fast["equivalence"]["podAnnotations"]["sim.rankops.io/duration"] = None   # a merge patch keeps absent keys
    models.patch_spec(k8s, namespace, "switch", {"version": "3", "rollout": fast})
    seen, rm, _ = rollouts.watch_phases(k8s, namespace, "switch", "3", {"Promoted", "RolledBack"})
    assert seen[-1] == "Promoted", (seen, rm["status"])
    # v2's unfinished gate Job was stopped, not left loading the cluster; v3 ran its own.
    jobs = {j.metadata.name: j for j in rollouts.gate_jobs(k8s, namespace, "switch")}
    v2_equivalence = [n for n in v2_jobs if "equivalence" in n]
    assert v2_equivalence and not set(v2_equivalence) & set(jobs), sorted(jobs)
    v3_gates = {g["gate"]: g["outcome"] for g in rm["status"]["gates"] if g.get("version") == "3"}
    # The canary step moved on without a verdict, by the policy these kwok tests set (and says so).
    assert v3_gates == {"warmup": "pass", "equivalence": "pass", "canary": "inconclusive"}, rm["status"]["gates"]
    models.wait_event(k8s, namespace, "switch", "RolloutSuperseded")
    models.wait_status(k8s, namespace, "switch", lambda rm: rm["status"].get("stableVersion") == "3"
                       and rm["status"].get("phase") == "Ready", "v3 stable after superseding v2")


def test_a_gate_job_that_never_finishes_times_out_into_a_rollback(k8s, namespace, operator):
    rollout = _rollout()
    rollout["warmup"]["podAnnotations"]["sim.rankops.io/duration"] = "3600s"   # a hung gate
    rollout["gateJobs"] = {"timeoutSeconds": 30}
    models.create(k8s, namespace, models.model_manifest("hung", version="1", versions=("1", "2"), rollout=rollout))
    models.wait_ready(k8s, namespace, "hung")
    stable_generation = rollouts.stable(k8s, namespace, "hung").metadata.generation
    models.patch_spec(k8s, namespace, "hung", {"version": "2"})
    seen, rm, serving = rollouts.watch_phases(k8s, namespace, "hung", "2", {"Promoted", "RolledBack"}, timeout=90)
    assert seen[-1] == "RolledBack" and not serving, (seen, serving)
    warmup = [g for g in rm["status"]["gates"] if g["gate"] == "warmup"][-1]
    assert warmup["outcome"] == "error" and "30s" in warmup["summary"], warmup
    assert "30s" in models.condition(rm, "Degraded")["message"]
    assert rollouts.stable(k8s, namespace, "hung").metadata.generation == stable_generation


def _patch_status(api_client, namespace: str, name: str, status: dict) -> None:
    from kubernetes import client

    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        models.GROUP, models.VERSION, namespace, models.PLURAL, name, {"status": status},
        _content_type="application/merge-patch+json")


def _refused(patch) -> str | None:
    """The API server's message when `patch()` is refused by admission, None when it is accepted."""
    from kubernetes.client.exceptions import ApiException

    try:
        patch()
    except ApiException as exc:
        assert exc.status in (403, 422), exc.body
        return exc.body
    return None


def test_only_the_operator_may_write_status_and_a_forged_stable_version_never_serves(
        cluster, k8s, namespace, operator, tmp_path):
    """The chart's status policy refuses everyone but the operator's ServiceAccount, even an account
    RBAC allows and the cluster admin; and a stableVersion written with the operator's own rights
    is checked by the operator: nothing vouches for it, so it is ignored and v1 keeps serving."""
    from kubernetes import client, config

    from rankops_dev.operator_process import service_account_kubeconfig

    models.create(k8s, namespace, models.model_manifest("guarded", version="1", versions=("1", "2"),
                                                        rollout=_rollout()))
    models.wait_ready(k8s, namespace, "guarded")   # the operator's own status writes are accepted
    stable_generation = rollouts.stable(k8s, namespace, "guarded").metadata.generation
    # A ServiceAccount that RBAC allows to patch RankingModel status.
    k8s.core.create_namespaced_service_account(namespace, {"metadata": {"name": "ci-bot"}})
    rbac = client.RbacAuthorizationV1Api(k8s.api_client)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "status-writer"}, "rules": [
        {"apiGroups": ["rankops.io"], "resources": ["rankingmodels", "rankingmodels/status"],
         "verbs": ["get", "patch"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "status-writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "status-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "ci-bot", "namespace": namespace}]})
    bot = config.new_client_from_config(str(service_account_kubeconfig(
        cluster.kubeconfig, tmp_path / "bot", namespace=namespace, name="ci-bot")))
    as_operator = config.new_client_from_config(operator.kubeconfig)
    forged = {"stableVersion": "2"}
    try:
        # RBAC lets ci-bot in (a new binding takes a moment), the policy then says no. Until both
        # are in force a forged write may land: the operator's check below covers that too.
        def policy_refuses(api) -> str | None:
            message = _refused(lambda: _patch_status(api, namespace, "guarded", forged))
            return message if message and "written only by the rankops operator" in message else None

        message = wait_for(lambda: policy_refuses(bot), 30, "the status policy refusing ci-bot")
        assert f"system:serviceaccount:{namespace}:ci-bot" in message, message
        assert policy_refuses(k8s.api_client), "the cluster admin is refused too"
        # The operator's ServiceAccount passes the policy, even with a forged version...
        assert _refused(lambda: _patch_status(as_operator, namespace, "guarded", forged)) is None
    finally:
        bot.close()
        as_operator.close()
    # ...which the operator does not take: no Promoted rollout of 2, and v1 is what runs.
    models.wait_event(k8s, namespace, "guarded", "StatusRejected")  # the forged stableVersion refused
    models.wait_status(k8s, namespace, "guarded", lambda rm: rm["status"].get("stableVersion") == "1"
                       and rm["status"].get("phase") == "Ready", "v1 stable and Ready again")
    stable = rollouts.stable(k8s, namespace, "guarded")
    assert stable.metadata.generation == stable_generation
    assert stable.spec.template.metadata.labels[names.LABEL_VERSION] == "1"
