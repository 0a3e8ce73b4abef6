"""Gated rollout judged by real inference, in real containers: nothing is injected.

Every pod is a container on the real node (conftest's `real`): the chart's operator from the
operator image; each Triton pod's `fetch-model` init container (operator image) fetches its
version from the real S3 server with the model's credentials Secret, Triton (the Triton test
image) serves it with the rendered arguments and config, and the gate Jobs (the gates image) run
`rankops gate` against the canary's and the stable's Services. v2 is v1's weights rounded to FP16: the same
ranking, so it promotes; v3 is another model (other weights): it reorders the candidates and
the equivalence gate's real top-K overlap and rank correlation roll it back.
"""
from __future__ import annotations

import pytest

from e2e import models, rollouts
from e2e.support import wait_for
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.render import names
from rankops_dev import spec_models

pytestmark = pytest.mark.usefixtures("real_operator_logs_no_errors")
REAL_IMAGES = ("rankops-operator", "rankops-triton-test", "rankops-gates")

BUCKET = "models"
# A 2-core CI machine runs the control plane, the operator, two Tritons and a gate at once: the
# bound is loose, the point is that the number is the canary's own P99.
WARMUP = {"requests": 300, "concurrency": 4, "maxP99Ms": 1000}
REAL_TIMEOUT = 420  # a warmup gate waits out Triton's 60 s latency window after the canary loads


def _upload_versions(object_store, model: str, spec: RankingModelSpec, tmp_path) -> None:
    for version, seed, fp16 in (("1", 0, False), ("2", 0, True), ("3", 7, False)):
        directory = tmp_path / f"v{version}"
        spec_models.export(spec, ModelFormat.onnx, directory, seed=seed, fp16_weights=fp16)
        object_store.upload_tree(BUCKET, f"{model}/{version}", directory)


def test_real_gates_promote_an_fp16_version_and_roll_back_a_reordering_one(
        real, real_k8s, real_namespace_in, tmp_path):
    k8s, ns, name, object_store = real_k8s, real_namespace_in, "ranker", real.store
    k8s.core.create_namespaced_secret(ns, object_store.secret_manifest("model-store", ns))
    body = models.model_manifest(
        name, version="1", versions=("1", "2", "3"), modelCredentialsSecret="model-store",
        tritonImage=real.refs["rankops-triton-test"], resources={"cpu": "250m", "memory": "1Gi"},
        rollout={"warmup": WARMUP, "equivalence": {"topK": 10},
                 # No traffic runs here (test_canary_real.py judges canaries on real traffic): the
                 # 3 s hold moves on without a verdict by explicit policy, recorded in status.gates.
                 "canary": {"weight": 50, "durationSeconds": 3,
                            "analysis": {"onNoVerdict": "promote", "maxExtensionSeconds": 0}},
                 # Two stable and canary pods, their warm containers, the operator and a gate share 2 cores.
                 "gateJobs": {"timeoutSeconds": 300, "resources": {"cpu": "250m"}}})
    for version in body["spec"]["versions"]:
        version["precision"] = "fp32" if version["name"] == "1" else "fp16"
    _upload_versions(object_store, name, RankingModelSpec.model_validate(body["spec"]), tmp_path)
    models.create(k8s, ns, body)
    models.wait_ready(k8s, ns, name, timeout=180)
    stable_pod = k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_MODEL}={name}").items[0]
    assert stable_pod.spec.node_name == real.node_name and not stable_pod.status.pod_ip.startswith("127.")
    fetch = stable_pod.status.init_container_statuses[0]
    assert (fetch.name, fetch.state.terminated.exit_code) == ("fetch-model", 0)
    assert fetch.container_id.startswith("containerd://"), fetch
    triton_log = real.logs(ns, stable_pod.metadata.name, "triton")
    assert "successfully loaded 'ranker'" in triton_log, triton_log[-3000:]

    # v1 -> v2: the same weights in FP16. Both gates pass on real numbers, and it is promoted.
    models.patch_spec(k8s, ns, name, {"version": "2"})
    seen, rm, serving = rollouts.watch_phases(k8s, ns, name, "2", {"Promoted", "RolledBack"}, timeout=REAL_TIMEOUT)
    assert seen[-1] == "Promoted", (seen, rm["status"])
    assert "Canary" in serving and not serving & {"CanaryStarting", "Warming", "Verifying"}, serving
    gates = {g["gate"]: g for g in rm["status"]["gates"] if g.get("version") == "2"}
    warmup, equivalence = gates["warmup"], gates["equivalence"]
    assert warmup["outcome"] == "pass" and equivalence["outcome"] == "pass", rm["status"]["gates"]
    # The P99 is Triton's own (its metrics port, through the canary Service), measured on real requests.
    assert warmup["metrics"]["judgedOn"] == "server", warmup
    assert 0 < warmup["metrics"]["judgedP99Ms"] <= WARMUP["maxP99Ms"], warmup
    assert warmup["metrics"]["requests"] == WARMUP["requests"] and warmup["metrics"]["errors"] == 0, warmup
    # FP16 weights move the scores a little and keep the ranking.
    assert equivalence["metrics"]["topKOverlap"] >= 0.95 and equivalence["metrics"]["rankCorrelation"] >= 0.9
    assert 0 < equivalence["metrics"]["maxAbsError"], equivalence  # two different models answered
    print(f"\nv2 warmup: {warmup['summary']}\nv2 equivalence: {equivalence['summary']}")
    models.wait_status(k8s, ns, name, lambda rm: rm["status"].get("stableVersion") == "2"
                       and rm["status"].get("phase") == "Ready", "v2 stable and Ready", timeout=180)

    # v2 -> v3: other weights reorder the candidates; the real overlap rolls it back, v2 serves on.
    # Its warmup is judged on the gate's own P99, at once (no wait for Triton's latency window).
    generation = rollouts.stable(k8s, ns, name).metadata.generation
    models.patch_spec(k8s, ns, name, {"version": "3", "rollout": {"warmup": {"judgeOn": "client"}}})
    seen, rm, serving = rollouts.watch_phases(k8s, ns, name, "3", {"Promoted", "RolledBack"}, timeout=REAL_TIMEOUT)
    assert seen[-1] == "RolledBack", (seen, rm["status"])
    assert "Canary" not in seen and not serving, (seen, serving)
    [warmup3] = [g for g in rm["status"]["gates"] if g["gate"] == "warmup" and g.get("version") == "3"]
    assert warmup3["outcome"] == "pass" and warmup3["metrics"]["judgedOn"] == "client", warmup3
    assert warmup3["metrics"]["server"]["windowWaitS"] < 10 and "judge on client" in warmup3["metrics"]["server"]["note"]
    failed = [g for g in rm["status"]["gates"] if g["gate"] == "equivalence" and g.get("version") == "3"]
    assert failed and failed[-1]["outcome"] == "fail", rm["status"]["gates"]
    metrics = failed[-1]["metrics"]
    print(f"v3 equivalence: {failed[-1]['summary']}")
    assert metrics["topKOverlap"] < 0.95 or metrics["rankCorrelation"] < 0.9, metrics
    degraded = models.condition(rm, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "RolledBack"
    assert f"{metrics['topKOverlap']:.3f}"[:4] in degraded["message"] + rm["status"]["rollout"]["message"], rm
    assert rm["status"]["stableVersion"] == "2"
    stable = rollouts.stable(k8s, ns, name)
    assert stable.metadata.generation == generation
    assert stable.spec.template.metadata.labels[names.LABEL_VERSION] == "2"
    wait_for(lambda: rollouts.canary_gone(k8s, ns, name), 60, "canary removed after rollback")
    models.wait_event(k8s, ns, name, "RolledBack")
