"""Issue 41 on real containers: new versions loaded inside the running Triton pods, under traffic.

Three stable pods serve v1 (real containers on the real node: the `stage-versions` init container
fetches it from the real S3 server, the `stage` sidecar keeps the model directory as the
ConfigMap's versions.json lists, Triton serves it with the rendered arguments). Production-like
traffic runs throughout, from inside the cluster's network namespace.

- v2 (v1's weights rounded to FP16: the same ranking) with `rollout.strategy: inPlace`: loaded
  beside v1 in one pod, gated there (warm-up, then equivalence against v1 on the same pod), then
  switched pod by pod and v1 unloaded: promoted with 0 failed requests, the same pods (uids and
  restart counts), v2 READY and v1 unloaded in every pod's repository index.
- v3 (other weights) fails equivalence on the gate pod: rolled back, v3 unloaded, v2 serving in
  every pod, still the same pods.
- v4 with `inPlace.maxStableP99Ms` below any real P99: the switch stops before it loads and the
  rollout goes on with pods (status and an Event say why).
"""
from __future__ import annotations

import base64
import threading

import pytest

from e2e import models, rollouts
from e2e.support import wait_for
from e2e.test_canary_real import GATE_JOBS, SPEC, production_traffic
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.render import names
from rankops.render.serving import API_KEY_HEADER, API_KEY_SECRET_KEY
from rankops.triton.repository import Repository
from rankops_dev import netns as namespaces
from rankops_dev import spec_models

pytestmark = pytest.mark.usefixtures("real_operator_logs_no_errors")
REAL_IMAGES = ("rankops-operator", "rankops-triton-test")
REAL_NODES = 2   # 2 GPUs a node: three stable pods of one GPU each
MODEL, REPLICAS = "ranker", 3
# Three Tritons, their stagers, the operator (which runs the in-place gates) and the traffic share 2 cores.
SMALL = {"resources": {"cpu": "250m", "memory": "1Gi"}, "warmReplicas": {"enabled": False}}
TIMEOUT = 480   # the warm-up gate waits out Triton's 60 s latency window after the version loads
# The plan's memory arithmetic decides in place: a T4-sized card, an instance of 1.5 GB weights
# and 2 MiB of activations per item, the field guide's runtime reserve.
PLANNING = {"slo": {"p99LatencyMs": 250, "targetQps": 10},
            "planning": {"latencyProfile": {1: 2.0, 64: 4.0, 256: 10.0}, "gpuMemoryMiB": 15360,
                         "failureTolerance": 1,
                         "memory": {"weightsMiB": 1500, "activationMiBPerItem": 2, "runtimeReserveMiB": 1024}}}


def _indexes(real, k8s, ns: str) -> dict[str, dict[int, str]]:
    """Each stable pod's repository index for the model (version -> state), read from inside the
    cluster's network namespace with the model's key."""
    secret = k8s.core.read_namespaced_secret(names.api_key_secret_name(MODEL), ns)
    headers = {API_KEY_HEADER: base64.b64decode(secret.data[API_KEY_SECRET_KEY]).decode()}
    pods = _stable_pods(k8s, ns)
    found: dict[str, dict[int, str]] = {}

    def read() -> None:
        if real.netns:
            namespaces.enter_thread(real.netns)
        for pod in pods:
            entries = Repository(pod.status.pod_ip, 8000, headers).versions(MODEL, deadline_s=5.0)
            found[pod.metadata.name] = {v: e.state for v, e in entries.items()}

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(timeout=60)
    return found


def _stable_pods(k8s, ns: str) -> list:
    return [p for p in k8s.core.list_namespaced_pod(
        ns, label_selector=f"{names.LABEL_MODEL}={MODEL},{names.LABEL_TRACK}={names.STABLE}").items
        if p.metadata.deletion_timestamp is None]


def _identity(k8s, ns: str) -> dict[str, tuple]:
    """pod -> (uid, each container's restart count): what must not change through a switch."""
    return {p.metadata.name: (p.metadata.uid, tuple(sorted((c.name, c.restart_count)
                                                          for c in p.status.container_statuses or [])))
            for p in _stable_pods(k8s, ns)}


def test_versions_switch_inside_the_running_pods_under_traffic(real, real_k8s, real_namespace_in, tmp_path):
    k8s, ns = real_k8s, real_namespace_in
    body = models.model_manifest(
        MODEL, version="1", versions=("1", "2", "3", "4"), modelCredentialsSecret="model-store",
        replicas=REPLICAS, tritonImage=real.refs["rankops-triton-test"], **SMALL, **SPEC, **PLANNING,
        rollout={"strategy": "inPlace", "inPlace": {"maxStableP99Ms": 60_000},
                 "warmup": {"requests": 120, "concurrency": 2, "maxP99Ms": 3000},
                 "equivalence": {"topK": 10}, "gateJobs": GATE_JOBS})
    for version in body["spec"]["versions"]:
        version["precision"] = "fp32"   # one Triton model holds both versions: same format and precision
    spec = RankingModelSpec.model_validate(body["spec"])
    for version, seed, fp16 in (("1", 0, False), ("2", 0, True), ("3", 7, False), ("4", 0, True)):
        spec_models.export(spec, ModelFormat.onnx, tmp_path / f"v{version}", seed=seed, fp16_weights=fp16)
        real.store.upload_tree("models", f"{MODEL}/{version}", tmp_path / f"v{version}")
    k8s.core.create_namespaced_secret(ns, real.store.secret_manifest("model-store", ns))
    models.create(k8s, ns, body)
    models.wait_ready(k8s, ns, MODEL, timeout=300)
    pod = _stable_pods(k8s, ns)[0]
    assert [c.name for c in pod.spec.init_containers] == ["stage-versions"]
    assert {c.name for c in pod.spec.containers} == {"triton", "stage"}
    assert all(c.container_id.startswith("containerd://") for c in pod.status.container_statuses)
    before = _identity(k8s, ns)
    assert len(before) == REPLICAS and all(states == {1: "READY"} for states in _indexes(real, k8s, ns).values())

    traffic = production_traffic(k8s, ns, MODEL, bad_fraction=0.0, real=real)
    traffic.start()
    try:
        # v1 -> v2 in place: gated on one pod, switched pod by pod, v1 unloaded; no pod restarts.
        models.patch_spec(k8s, ns, MODEL, {"version": "2"})
        seen, rm, _ = rollouts.watch_phases(k8s, ns, MODEL, "2", {"Promoted", "RolledBack"}, timeout=TIMEOUT)
        rollout = rm["status"]["rollout"]
        assert seen[-1] == "Promoted", (seen, rm["status"])
        assert rollout["strategy"] == "inPlace" and rollout["inPlace"]["phase"] == "Switched", rollout
        assert "CanaryStarting" not in seen and not rollouts.gate_jobs(k8s, ns, MODEL), seen
        gates = {g["gate"]: g for g in rm["status"]["gates"] if g.get("version") == "2"}
        assert {g: r["outcome"] for g, r in gates.items()} == {"warmup": "pass", "equivalence": "pass"}, gates
        assert all(r["attempt"] == rollout["attempt"] for r in gates.values())
        assert rm["status"]["stableVersion"] == "2" and rm["status"]["stablePodsVersion"] == "1"
        print(f"\nv2 in place: warmup {gates['warmup']['summary']}; equivalence {gates['equivalence']['summary']}")
        wait_for(lambda: all(states.get(2) == "READY" and states.get(1) != "READY"
                             for states in _indexes(real, k8s, ns).values()), 60, "v2 everywhere, v1 unloaded")
        assert _identity(k8s, ns) == before, "a pod restarted during the switch"
        assert models.printer_columns(real, ns, MODEL)["IN-PLACE"] == "2 on 3/3 pods, 1 on 0/3", \
            real.kubectl("get", "rm", MODEL, "-n", ns, "-o", "wide")
        assert traffic.failed == 0, traffic.failures[:5]
        switched_at = traffic.sent

        # v2 -> v3 (other weights): equivalence fails on the gate pod; v3 is unloaded, v2 serves on.
        models.patch_spec(k8s, ns, MODEL, {"version": "3"})
        seen, rm, _ = rollouts.watch_phases(k8s, ns, MODEL, "3", {"Promoted", "RolledBack"}, timeout=TIMEOUT)
        assert seen[-1] == "RolledBack", (seen, rm["status"])
        rollout = rm["status"]["rollout"]
        assert rollout["failedGate"] == "equivalence" and rollout["inPlace"]["phase"] == "RolledBack", rollout
        assert rm["status"]["stableVersion"] == "2"
        print(f"v3 in place: {rollout['message']}")
        indexes = _indexes(real, k8s, ns)
        assert all(states.get(2) == "READY" and states.get(3) != "READY" for states in indexes.values()), indexes
        assert _identity(k8s, ns) == before, "a pod restarted during the rollback"
        assert traffic.failed == 0 and traffic.sent > switched_at, traffic.failures[:5]

        # v4 with a bound below any real P99: the switch stops before it loads; pods take over.
        models.patch_spec(k8s, ns, MODEL, {"version": "4", "rollout": {"inPlace": {"maxStableP99Ms": 0.001}}})
        fell = models.wait_status(k8s, ns, MODEL, lambda rm: (rm["status"].get("rollout") or {}).get("version") == "4"
                                  and rm["status"]["rollout"].get("strategy") == "pods", "v4 falls back to pods",
                                  timeout=180)
        rollout = fell["status"]["rollout"]
        assert rollout["inPlace"]["phase"] == "FellBack" and "maxStableP99Ms" in rollout["inPlace"]["reason"], rollout
        assert rollout["phase"] in ("CanaryStarting", "Warming", "Verifying", "Canary", "Promoting", "Promoted")
        models.wait_event(k8s, ns, MODEL, "InPlaceFallingBack")
        assert all(states.get(4) != "READY" for states in _indexes(real, k8s, ns).values())
    finally:
        traffic.stop.set()
        traffic.join(timeout=30)
    print(f"traffic: {traffic.sent} sent, {traffic.failed} failed")
