"""The rollout through controller.models.reconcile against an in-memory cluster: what it reads.

The machine decides on observations; these tests check the observations are the right ones: a
gate verdict only from this attempt's own Job (issue 12, finding 1), canary readiness only from
live pods on live nodes of the rolled-out version (finding 9).
"""
from __future__ import annotations

import copy
import datetime as dt

from rankops.controller import models
from rankops.gates.verdict import Verdict
from rankops.render import names
from rankops.rollout.jobs import is_gate_job_of
from rankops.rollout.machine import attempt_id
from tests import fakecluster as fake
from tests import wire
from tests.fakecluster import FakeCluster, ready_node

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
MODEL = "ranker-for-the-home-feed-europe-west-01"             # 39 characters
SIBLINGS = ("release-2026-11-01a", "release-2026-11-01b")      # 19 characters, differ only at the end


def gpu_cluster() -> FakeCluster:
    """A cluster with one Ready GPU node, gpu-1."""
    return FakeCluster(ready_node("gpu-1"))


def run_deployment(cluster: FakeCluster, track: str, node: str = "gpu-1") -> None:
    """The model's `track` Deployment rolled out, its pods up and Ready on `node`."""
    fake.run_deployment(cluster, "reco", names.deployment_name(MODEL, track), node)


def finish_job(cluster: FakeCluster, name: str, verdict: Verdict) -> None:
    fake.finish_job(cluster, "reco", name, verdict)


def unavailable_stable(cluster: FakeCluster, model: "Model") -> dict:
    """The model's stable Deployment un-Available since now (its pods not Ready): the labels its
    pods carry, for a test to put one."""
    name = names.deployment_name(MODEL, names.STABLE)
    dep = cluster.stored("Deployment", "reco", name)
    since = (T0 + dt.timedelta(seconds=model.t)).isoformat().replace("+00:00", "Z")
    cluster.set_status("Deployment", "reco", name, {
        "observedGeneration": dep["metadata"]["generation"], "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1,
        "conditions": [{"type": "Available", "status": "False", "lastTransitionTime": since}]})
    return dict(dep["spec"]["template"]["metadata"]["labels"])


def passing(gate: str) -> Verdict:
    return Verdict(gate, "pass", "Passed", f"{gate} ok", {})


def failing(gate: str) -> Verdict:
    return Verdict(gate, "fail", "RankingDisagrees", f"{gate} disagrees", {})


class Model:
    """One RankingModel object, reconciled the way the handlers do (status written back)."""

    def __init__(self, cluster: FakeCluster, version: str = SIBLINGS[0], versions=("1", *SIBLINGS)):
        self.cluster = cluster
        self.body = {
            "apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": MODEL, "namespace": "reco", "uid": "rm-uid", "generation": 1, "annotations": {}},
            "spec": {"replicas": 1, "version": version,
                     "versions": [{"name": v, "modelUri": f"s3://m/{v}", "format": "onnx"} for v in versions],
                     "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
                     "outputs": [{"name": "s", "dataType": "FP32", "dims": [1]}],
                     "batching": {"maxBatchSize": 8},
                     # No Triton here to read: each hold ends on the clock, by explicit policy.
                     "rollout": {"canary": {"weight": 50, "durationSeconds": 60, "analysis": {
                         "onNoVerdict": "promote", "maxExtensionSeconds": 0}}}},
        }
        self.t = 0
        self.pull_secrets: tuple[str, ...] = ()   # rankops run --image-pull-secret
        self.memory = models.ModelMemory()        # the operator process's, across reconciles

    def reconcile(self, seconds: int = 10) -> dict:
        self.t += seconds
        result = models.reconcile(self.cluster, copy.deepcopy(self.body), now=T0 + dt.timedelta(seconds=self.t),
                                  pull_secrets=self.pull_secrets, memory=self.memory)
        self.body["status"] = result.status.to_wire()   # as the operator writes it
        return self.body["status"]

    @property
    def rollout(self) -> dict:
        return self.body["status"]["rollout"]

    def job(self, gate: str) -> str:
        return names.gate_job_name(MODEL, gate, self.rollout["version"], attempt_id(wire.rollout(self.rollout)))

    def to_canary(self) -> None:
        run_deployment(self.cluster, names.CANARY)
        assert self.reconcile()["rollout"]["phase"] == "Warming"
        finish_job(self.cluster, self.job("warmup"), passing("warmup"))
        assert self.reconcile()["rollout"]["phase"] == "Verifying"
        finish_job(self.cluster, self.job("equivalence"), passing("equivalence"))
        assert self.reconcile()["rollout"]["phase"] == "Canary"


def serving_v1(cluster: FakeCluster) -> Model:
    rm = Model(cluster, version="1")
    rm.reconcile()
    run_deployment(cluster, names.STABLE)
    assert rm.reconcile()["phase"] == "Ready"
    return rm


def test_a_sibling_version_is_not_promoted_on_another_versions_jobs():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    rm.to_canary()
    first_jobs = {j["metadata"]["name"] for j in cluster.list("Job", "reco")}
    # The sibling version replaces it mid-canary: it must run its own gates, not read these.
    rm.body["spec"]["version"] = SIBLINGS[1]
    rm.reconcile()
    run_deployment(cluster, names.CANARY)
    assert rm.reconcile()["rollout"]["phase"] == "Warming"
    assert rm.reconcile()["rollout"]["phase"] == "Warming", "no verdict of its own yet"
    jobs = {j["metadata"]["name"] for j in cluster.list("Job", "reco")}
    assert len(jobs - first_jobs) == 1 and all(len(n) <= 63 for n in jobs), jobs


def test_a_retry_does_not_read_the_failed_attempts_verdict():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    run_deployment(cluster, names.CANARY)
    rm.reconcile()
    finish_job(cluster, rm.job("warmup"), failing("warmup"))
    assert rm.reconcile()["rollout"]["phase"] == "RolledBack"
    rm.body["metadata"]["annotations"]["rankops.io/retry"] = SIBLINGS[0]
    assert rm.reconcile()["rollout"]["phase"] == "CanaryStarting"
    run_deployment(cluster, names.CANARY)
    assert rm.reconcile()["rollout"]["phase"] == "Warming"
    assert rm.reconcile()["rollout"]["phase"] == "Warming", "the new attempt waits for its own Job"
    finish_job(cluster, rm.job("warmup"), passing("warmup"))
    assert rm.reconcile()["rollout"]["phase"] == "Verifying"


def test_a_job_that_only_has_the_name_is_not_read():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    run_deployment(cluster, names.CANARY)
    rm.reconcile()
    name = rm.job("warmup")
    ours = cluster.get("Job", "reco", name)
    assert is_gate_job_of(ours, MODEL, "rm-uid", "warmup", SIBLINGS[0], attempt_id(wire.rollout(rm.rollout)))
    # Someone else's Job under that name, with a passing pod: labels of another version.
    cluster.delete("Job", "reco", name)
    cluster.put({**ours, "metadata": {**ours["metadata"], "uid": None,
                                      "labels": {**ours["metadata"]["labels"], names.LABEL_VERSION: SIBLINGS[1]}}})
    finish_job(cluster, name, passing("warmup"))
    status = rm.reconcile()
    assert status["rollout"]["phase"] == "RolledBack" and status["stableVersion"] == "1"
    warmup = status["gates"][-1]
    assert warmup["outcome"] == "error" and warmup["reason"] == "ForeignJob" and name in warmup["summary"]
    # Right labels but not owned by this RankingModel: not read either.
    assert not is_gate_job_of({**ours, "metadata": {**ours["metadata"], "ownerReferences": []}},
                              MODEL, "rm-uid", "warmup", SIBLINGS[0], attempt_id(wire.rollout(rm.rollout)))


def test_the_canary_is_not_promoted_when_its_pods_node_is_gone():
    cluster = gpu_cluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    rm.to_canary()
    rm.reconcile(1)    # traffic follows the recorded Canary phase
    canary = cluster.list("Pod", "reco", {names.LABEL_TRACK: names.CANARY})
    assert [p["metadata"]["labels"][names.LABEL_TRAFFIC] for p in canary] == ["on"]
    cluster.delete("Node", None, "gpu-1")       # the pod stays, Ready as last reported
    status = rm.reconcile(120)                  # past the 60 s hold
    assert status["rollout"]["phase"] == "Canary" and status["stableVersion"] == "1"
    stable = cluster.get("Deployment", "reco", names.deployment_name(MODEL, names.STABLE))
    assert stable["spec"]["template"]["metadata"]["labels"][names.LABEL_VERSION] == "1"
    canary = cluster.list("Pod", "reco", {names.LABEL_TRACK: names.CANARY})
    assert [p["metadata"]["labels"][names.LABEL_TRAFFIC] for p in canary] == ["off"], "no traffic to it"
    assert status["canaryWeight"] == 0
    # A replacement pod on a live node: now it may be promoted.
    cluster.put({"kind": "Node", "metadata": {"name": "gpu-2"},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    for pod in canary:
        cluster.delete("Pod", "reco", pod["metadata"]["name"])
    run_deployment(cluster, names.CANARY, node="gpu-2")
    # It serves from now: a whole hold before promotion (the time the canary was down counts not).
    assert rm.reconcile()["rollout"]["phase"] == "Canary"
    assert rm.reconcile(50)["rollout"]["phase"] == "Canary"
    status = rm.reconcile(10)
    assert status["rollout"]["phase"] == "Promoting"
    canary = next(g for g in status["gates"] if g["gate"] == "canary")
    assert (canary["outcome"], canary["reason"], canary["metrics"]["windowSeconds"]) == \
        ("inconclusive", "PromotedWithoutVerdict", 60)


def test_image_pull_secrets_reach_the_model_pods_and_the_gate_jobs():
    cluster = gpu_cluster()
    rm = Model(cluster, version="1")
    rm.pull_secrets = ("regcred", "mirror")
    rm.reconcile()
    run_deployment(cluster, names.STABLE)
    rm.reconcile()
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    run_deployment(cluster, names.CANARY)
    assert rm.reconcile()["rollout"]["phase"] == "Warming"
    pods = {(kind, o["metadata"]["name"]): o["spec"]["template"]["spec"]
            for kind in ("Deployment", "Job") for o in cluster.list(kind, "reco")}
    assert {kind for kind, _ in pods} == {"Deployment", "Job"} and len(pods) >= 3, pods.keys()
    for key, pod in pods.items():
        assert pod.get("imagePullSecrets") == [{"name": "regcred"}, {"name": "mirror"}], key


def _degraded(status: dict) -> dict:
    return next(c for c in status["conditions"] if c["type"] == "Degraded")


def test_pool_whose_ready_nodes_cannot_run_the_triton_image_is_degraded_driver_too_old():
    # Issue 16: 24.05 needs R545, or 525.85+ on R525; the pool's only ready node has 525.60.13.
    cluster = gpu_cluster()
    cluster.put({"kind": "GpuNodePool", "metadata": {"name": "t4"}, "spec": {"nodeSelector": {"pool": "t4"}},
                 "status": {"nodes": 1, "ready": 1}})
    cluster.put({"kind": "Node", "metadata": {"name": "gpu-old", "labels": {
        "rankops.io/pool": "t4", "rankops.io/gpu-ready": "true", "rankops.io/driver-version": "525.60.13",
        "rankops.io/driver-branch": "525", "rankops.io/driver-minor": "60"}}})
    rm = Model(cluster, version="1")
    rm.body["spec"].update(nodePool="t4", tritonImage="nvcr.io/nvidia/tritonserver:24.05-py3")
    degraded = _degraded(rm.reconcile())
    assert (degraded["status"], degraded["reason"]) == ("True", "DriverTooOld")
    for words in ("nvcr.io/nvidia/tritonserver:24.05-py3", "gpu-old has 525.60.13", "R545 or later",
                  "older Triton image", "upgrade the nodes' driver"):
        assert words in degraded["message"], words
    # Placement keeps the pods off that node: its driver matches no nodeSelectorTerm.
    dep = cluster.get("Deployment", "reco", names.deployment_name(MODEL, names.STABLE))
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert any(e["key"] == "rankops.io/driver-branch" for t in terms for e in t["matchExpressions"])
    # The driver upgraded to R550 (validator relabels): nothing wrong any more.
    cluster.merge_patch("Node", None, "gpu-old", {"metadata": {"labels": {
        "rankops.io/driver-version": "550.54.15", "rankops.io/driver-branch": "550", "rankops.io/driver-minor": "54"}}})
    assert _degraded(rm.reconcile())["reason"] == "AsExpected"


def test_an_image_rankops_does_not_know_is_said_in_degraded_not_guessed():
    cluster = gpu_cluster()
    cluster.put({"kind": "GpuNodePool", "metadata": {"name": "t4"}, "spec": {"nodeSelector": {"pool": "t4"}},
                 "status": {"nodes": 1, "ready": 1}})
    rm = Model(cluster, version="1")
    rm.body["spec"].update(nodePool="t4", tritonImage="registry.example.com/ml/tritonserver:custom")
    degraded = _degraded(rm.reconcile())
    assert degraded["status"] == "False" and "not an NGC tritonserver" in degraded["message"]


def test_tensorrt_plan_built_for_another_tensorrt_is_degraded_before_any_pod_starts():
    cluster = gpu_cluster()
    rm = Model(cluster, version="1")
    rm.body["spec"]["tritonImage"] = "nvcr.io/nvidia/tritonserver:24.05-py3"
    rm.body["spec"]["versions"][0].update(format="tensorrt_plan", tensorrtVersion="8.6.1.6")
    status = rm.reconcile()
    degraded = _degraded(status)
    assert (degraded["status"], degraded["reason"]) == ("True", "TensorRTVersionMismatch")
    assert "TensorRT 8.6.1.6" in degraded["message"] and "TensorRT 10.0.1.6" in degraded["message"]
    assert cluster.list("Deployment", "reco") == [], "no pod may start with an engine Triton refuses"
