"""The rollout through controller.models.reconcile against an in-memory cluster: what it reads.

The machine decides on observations; these tests check the observations are the right ones: a
gate verdict only from this attempt's own Job (issue 12, finding 1), canary readiness only from
live pods on live nodes of the rolled-out version (finding 9).
"""
from __future__ import annotations

import copy
import datetime as dt
import itertools

from rankops.controller import models
from rankops.gates.verdict import Verdict
from rankops.render import names
from rankops.rollout.jobs import is_gate_job_of
from rankops.rollout.machine import attempt_id

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
MODEL = "ranker-for-the-home-feed-europe-west-01"             # 39 characters
SIBLINGS = ("release-2026-11-01a", "release-2026-11-01b")      # 19 characters, differ only at the end
_uids = itertools.count(1)


class FakeCluster:
    """Enough of controller.kube.Kube: objects by (kind, namespace, name), label-selected lists."""

    def __init__(self):
        self.objects: dict[tuple[str, str | None, str], dict] = {}
        self.put({"kind": "Node", "metadata": {"name": "gpu-1"},
                  "status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    def put(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        old = self.objects.get((obj["kind"], meta.get("namespace"), meta["name"]))
        meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or f"uid-{next(_uids)}")
        if old and "status" not in obj and "status" in old:
            obj["status"] = old["status"]
        self.objects[(obj["kind"], meta.get("namespace"), meta["name"])] = obj
        return obj

    def get(self, kind, namespace, name):
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found else None

    def list(self, kind, namespace=None, labels=None, label_selector=None):
        wanted = dict(labels or {})
        for term in filter(None, (label_selector or "").split(",")):
            key, value = term.split("=", 1)
            wanted[key] = value
        return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                if k == kind and ns == namespace
                and all((o["metadata"].get("labels") or {}).get(key) == value for key, value in wanted.items())]

    def apply(self, obj, dry_run=False):
        return copy.deepcopy(obj) if dry_run else self.put(obj)

    def delete(self, kind, namespace, name, propagation="Background"):
        return self.objects.pop((kind, namespace, name), None) is not None

    def merge_patch(self, kind, namespace, name, patch, subresource=None):
        obj = self.objects[(kind, namespace, name)]
        obj["metadata"].setdefault("labels", {}).update(patch.get("metadata", {}).get("labels", {}))
        obj["metadata"].setdefault("annotations", {}).update(patch.get("metadata", {}).get("annotations", {}))
        return obj

    # -- what the cluster's controllers and kubelets would do --

    def run_deployment(self, track: str, node: str = "gpu-1") -> None:
        """The Deployment's pods are up and Ready on `node`; its status says so."""
        dep = self.objects[("Deployment", "reco", names.deployment_name(MODEL, track))]
        replicas = dep["spec"].get("replicas", 1)
        dep["status"] = {"observedGeneration": 1, "replicas": replicas, "readyReplicas": replicas,
                         "updatedReplicas": replicas}
        template = dep["spec"]["template"]["metadata"]["labels"]
        for i in range(replicas):
            self.put({"kind": "Pod", "metadata": {"name": f"{dep['metadata']['name']}-{template[names.LABEL_VERSION]}-{i}",
                                                  "namespace": "reco", "labels": dict(template)},
                      "spec": {"nodeName": node},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    def finish_job(self, name: str, verdict: Verdict) -> None:
        """The gate Job ran: its pod's termination message is the verdict."""
        job = self.objects[("Job", "reco", name)]
        job["status"] = {"conditions": [{"type": "Complete" if verdict.passed else "Failed", "status": "True"}]}
        self.put({"kind": "Pod", "metadata": {"name": f"{name}-x", "namespace": "reco",
                                              "labels": {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                                                         "batch.kubernetes.io/job-name": name}},
                  "status": {"containerStatuses": [{"name": "gate", "state": {"terminated": {
                      "exitCode": verdict.exit_code, "message": verdict.to_json()}}}]}})


def unavailable_stable(cluster: FakeCluster, model: "Model") -> dict:
    """The model's stable Deployment un-Available since now (its pods not Ready): the labels its
    pods carry, for a test to put one."""
    dep = cluster.objects[("Deployment", "reco", names.deployment_name(MODEL, names.STABLE))]
    since = (T0 + dt.timedelta(seconds=model.t)).isoformat().replace("+00:00", "Z")
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1,
                     "conditions": [{"type": "Available", "status": "False", "lastTransitionTime": since}]}
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
        self.body["status"] = result.status
        return result.status

    @property
    def rollout(self) -> dict:
        return self.body["status"]["rollout"]

    def job(self, gate: str) -> str:
        return names.gate_job_name(MODEL, gate, self.rollout["version"], attempt_id(self.rollout))

    def to_canary(self) -> None:
        self.cluster.run_deployment(names.CANARY)
        assert self.reconcile()["rollout"]["phase"] == "Warming"
        self.cluster.finish_job(self.job("warmup"), passing("warmup"))
        assert self.reconcile()["rollout"]["phase"] == "Verifying"
        self.cluster.finish_job(self.job("equivalence"), passing("equivalence"))
        assert self.reconcile()["rollout"]["phase"] == "Canary"


def serving_v1(cluster: FakeCluster) -> Model:
    rm = Model(cluster, version="1")
    rm.reconcile()
    cluster.run_deployment(names.STABLE)
    assert rm.reconcile()["phase"] == "Ready"
    return rm


def test_a_sibling_version_is_not_promoted_on_another_versions_jobs():
    cluster = FakeCluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    rm.to_canary()
    first_jobs = {j["metadata"]["name"] for j in cluster.list("Job", "reco")}
    # The sibling version replaces it mid-canary: it must run its own gates, not read these.
    rm.body["spec"]["version"] = SIBLINGS[1]
    rm.reconcile()
    cluster.run_deployment(names.CANARY)
    assert rm.reconcile()["rollout"]["phase"] == "Warming"
    assert rm.reconcile()["rollout"]["phase"] == "Warming", "no verdict of its own yet"
    jobs = {j["metadata"]["name"] for j in cluster.list("Job", "reco")}
    assert len(jobs - first_jobs) == 1 and all(len(n) <= 63 for n in jobs), jobs


def test_a_retry_does_not_read_the_failed_attempts_verdict():
    cluster = FakeCluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    cluster.run_deployment(names.CANARY)
    rm.reconcile()
    cluster.finish_job(rm.job("warmup"), failing("warmup"))
    assert rm.reconcile()["rollout"]["phase"] == "RolledBack"
    rm.body["metadata"]["annotations"]["rankops.io/retry"] = SIBLINGS[0]
    assert rm.reconcile()["rollout"]["phase"] == "CanaryStarting"
    cluster.run_deployment(names.CANARY)
    assert rm.reconcile()["rollout"]["phase"] == "Warming"
    assert rm.reconcile()["rollout"]["phase"] == "Warming", "the new attempt waits for its own Job"
    cluster.finish_job(rm.job("warmup"), passing("warmup"))
    assert rm.reconcile()["rollout"]["phase"] == "Verifying"


def test_a_job_that_only_has_the_name_is_not_read():
    cluster = FakeCluster()
    rm = serving_v1(cluster)
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    cluster.run_deployment(names.CANARY)
    rm.reconcile()
    name = rm.job("warmup")
    ours = cluster.get("Job", "reco", name)
    assert is_gate_job_of(ours, MODEL, "rm-uid", "warmup", SIBLINGS[0], attempt_id(rm.rollout))
    # Someone else's Job under that name, with a passing pod: labels of another version.
    cluster.delete("Job", "reco", name)
    cluster.put({**ours, "metadata": {**ours["metadata"], "uid": None,
                                      "labels": {**ours["metadata"]["labels"], names.LABEL_VERSION: SIBLINGS[1]}}})
    cluster.finish_job(name, passing("warmup"))
    status = rm.reconcile()
    assert status["rollout"]["phase"] == "RolledBack" and status["stableVersion"] == "1"
    warmup = status["gates"][-1]
    assert warmup["outcome"] == "error" and warmup["reason"] == "ForeignJob" and name in warmup["summary"]
    # Right labels but not owned by this RankingModel: not read either.
    assert not is_gate_job_of({**ours, "metadata": {**ours["metadata"], "ownerReferences": []}},
                              MODEL, "rm-uid", "warmup", SIBLINGS[0], attempt_id(rm.rollout))


def test_the_canary_is_not_promoted_when_its_pods_node_is_gone():
    cluster = FakeCluster()
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
    cluster.run_deployment(names.CANARY, node="gpu-2")
    # It serves from now: a whole hold before promotion (the time the canary was down counts not).
    assert rm.reconcile()["rollout"]["phase"] == "Canary"
    assert rm.reconcile(50)["rollout"]["phase"] == "Canary"
    status = rm.reconcile(10)
    assert status["rollout"]["phase"] == "Promoting"
    canary = next(g for g in status["gates"] if g["gate"] == "canary")
    assert (canary["outcome"], canary["reason"], canary["metrics"]["windowSeconds"]) == \
        ("inconclusive", "PromotedWithoutVerdict", 60)


def test_image_pull_secrets_reach_the_model_pods_and_the_gate_jobs():
    cluster = FakeCluster()
    rm = Model(cluster, version="1")
    rm.pull_secrets = ("regcred", "mirror")
    rm.reconcile()
    cluster.run_deployment(names.STABLE)
    rm.reconcile()
    rm.body["spec"]["version"] = SIBLINGS[0]
    rm.reconcile()
    cluster.run_deployment(names.CANARY)
    assert rm.reconcile()["rollout"]["phase"] == "Warming"
    pods = {(o["kind"], o["metadata"]["name"]): o["spec"]["template"]["spec"]
            for o in cluster.list("Deployment", "reco") + cluster.list("Job", "reco")}
    assert {kind for kind, _ in pods} == {"Deployment", "Job"} and len(pods) >= 3, pods.keys()
    for key, pod in pods.items():
        assert pod.get("imagePullSecrets") == [{"name": "regcred"}, {"name": "mirror"}], key


def _degraded(status: dict) -> dict:
    return next(c for c in status["conditions"] if c["type"] == "Degraded")


def test_pool_whose_ready_nodes_cannot_run_the_triton_image_is_degraded_driver_too_old():
    # Issue 16: 24.05 needs R545, or 525.85+ on R525; the pool's only ready node has 525.60.13.
    cluster = FakeCluster()
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
    cluster.objects[("Node", None, "gpu-old")]["metadata"]["labels"].update({
        "rankops.io/driver-version": "550.54.15", "rankops.io/driver-branch": "550", "rankops.io/driver-minor": "54"})
    assert _degraded(rm.reconcile())["reason"] == "AsExpected"


def test_an_image_rankops_does_not_know_is_said_in_degraded_not_guessed():
    cluster = FakeCluster()
    cluster.put({"kind": "GpuNodePool", "metadata": {"name": "t4"}, "spec": {"nodeSelector": {"pool": "t4"}},
                 "status": {"nodes": 1, "ready": 1}})
    rm = Model(cluster, version="1")
    rm.body["spec"].update(nodePool="t4", tritonImage="registry.example.com/ml/tritonserver:custom")
    degraded = _degraded(rm.reconcile())
    assert degraded["status"] == "False" and "not an NGC tritonserver" in degraded["message"]


def test_tensorrt_plan_built_for_another_tensorrt_is_degraded_before_any_pod_starts():
    cluster = FakeCluster()
    rm = Model(cluster, version="1")
    rm.body["spec"]["tritonImage"] = "nvcr.io/nvidia/tritonserver:24.05-py3"
    rm.body["spec"]["versions"][0].update(format="tensorrt_plan", tensorrtVersion="8.6.1.6")
    status = rm.reconcile()
    degraded = _degraded(status)
    assert (degraded["status"], degraded["reason"]) == ("True", "TensorRTVersionMismatch")
    assert "TensorRT 8.6.1.6" in degraded["message"] and "TensorRT 10.0.1.6" in degraded["message"]
    assert cluster.list("Deployment", "reco") == [], "no pod may start with an engine Triton refuses"
