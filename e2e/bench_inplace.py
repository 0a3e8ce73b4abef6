"""benchmarks/inplace_bench.py's run (issue 41): one rollout in place, then one with pods, on the
same three serving pods under the same production-like traffic; the report is written to
$RANKOPS_INPLACE_BENCH. Not a test: `pytest e2e` does not collect this file (its name is not
test_*.py); the benchmark names it, so the e2e fixtures serve it (conftest's `real`: two real nodes
of 2 GPUs each, the chart's operator, the S3 server), as for e2e/test_inplace_real.py, whose module
settings these are.
"""
from __future__ import annotations

import threading
import time

from e2e import models
from e2e.support import wait_for
from e2e.test_inplace_real import (  # noqa: F401 (the real cluster's settings)
    MODEL, PLANNING, REAL_NODES, REPLICAS, SMALL)
from e2e.test_canary_real import GATE_JOBS, SPEC, production_traffic
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.render import names
from rankops_dev import spec_models

REAL_IMAGES = ("rankops-operator", "rankops-triton-test", "rankops-gates")   # the pods strategy's gate Jobs
BENCH_ENV = "RANKOPS_INPLACE_BENCH"   # a path: the benchmark's report is written there
TIMEOUT = 600


class Watch(threading.Thread):
    """Every 0.5 s: the rollout's phase (and the switch's), and the model's pods holding GPUs."""

    def __init__(self, k8s, ns: str):
        super().__init__(daemon=True)
        self.k8s, self.ns = k8s, ns
        self.samples: list[tuple[float, str, int]] = []   # (time, phase, GPUs held)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            rm = models.get(self.k8s, self.ns, MODEL)
            rollout = (rm.get("status") or {}).get("rollout") or {}
            phase = rollout.get("phase", "")
            if phase == "InPlace":
                phase = f"InPlace/{(rollout.get('inPlace') or {}).get('phase', '')}"
            pods = self.k8s.core.list_namespaced_pod(self.ns, label_selector=f"{names.LABEL_MODEL}={MODEL}").items
            gpus = sum(int(c.resources.requests.get("nvidia.com/gpu", 0)) for p in pods
                       if p.status.phase in ("Pending", "Running") for c in p.spec.containers
                       if c.resources and c.resources.requests)
            self.samples.append((time.time(), phase, gpus))


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)


def _roll_out(k8s, ns, traffic, version: str, spec_patch: dict) -> dict:
    watch = Watch(k8s, ns)
    watch.start()
    started, served_before = time.time(), len(traffic.served)
    models.patch_spec(k8s, ns, MODEL, {"version": version, **spec_patch})
    try:
        done = models.wait_status(k8s, ns, MODEL, lambda rm: (rm["status"].get("rollout") or {}).get("version")
                                  == version and rm["status"]["rollout"].get("phase") in ("Promoted", "RolledBack"),
                                  f"{version} promoted or rolled back", timeout=TIMEOUT)
        ended = time.time()
        models.wait_status(k8s, ns, MODEL, lambda rm: rm["status"].get("phase") == "Ready"
                           and rm["status"].get("readyReplicas") == REPLICAS, "Ready again", timeout=TIMEOUT)
    finally:
        watch.stop.set()
        watch.join(5)
    samples = [s for s in watch.samples if started <= s[0] <= ended] or watch.samples[-1:]
    answers = traffic.served[served_before:]
    phases: list[dict] = []
    for at, phase, gpus in samples:
        if not phases or phases[-1]["phase"] != phase:
            phases.append({"phase": phase, "from": at, "gpus_max": gpus})
        phases[-1]["gpus_max"] = max(phases[-1]["gpus_max"], gpus)
    for i, p in enumerate(phases):
        until = phases[i + 1]["from"] if i + 1 < len(phases) else ended
        p["seconds"] = round(until - p["from"], 1)
        p["p99_ms"] = _p99([a.ms for a in answers if p["from"] <= a.sent_at < until])
        p["requests"] = sum(p["from"] <= a.sent_at < until for a in answers)
        p["from"] = round(p["from"] - started, 1)
    gpu_seconds = sum(g * 0.5 for at, _, g in samples)
    return {"version": version, "outcome": done["status"]["rollout"]["phase"],
            "strategy": done["status"]["rollout"].get("strategy"), "seconds": round(ended - started, 1),
            "gpu_seconds": round(gpu_seconds, 1), "gpus_max": max((g for _, _, g in samples), default=0),
            "phases": phases, "p99_ms": _p99([a.ms for a in answers if a.sent_at <= ended]),
            "failed": traffic.failed}


def _model(real, strategy: str) -> dict:
    body = models.model_manifest(
        MODEL, version="1", versions=("1", "2"), modelCredentialsSecret="model-store",
        replicas=REPLICAS, tritonImage=real.refs["rankops-triton-test"], **SMALL, **SPEC, **PLANNING,
        rollout={"strategy": strategy, "inPlace": {"maxStableP99Ms": 60_000},
                 "warmup": {"requests": 120, "concurrency": 2, "maxP99Ms": 3000},
                 "equivalence": {"topK": 10}, "gateJobs": GATE_JOBS,
                 # the pods strategy's canary: one step, held briefly, promoted on its verdict or without
                 "canary": {"weight": 25, "durationSeconds": 30,
                            "analysis": {"onNoVerdict": "promote", "maxExtensionSeconds": 0}}})
    for version in body["spec"]["versions"]:
        version["precision"] = "fp32"
    return body


def _run(real, k8s, ns, strategy: str) -> dict:
    """The model served on v1 with `strategy`, a steady window, v1 -> v2 under traffic; then deleted."""
    models.create(k8s, ns, _model(real, strategy))
    models.wait_ready(k8s, ns, MODEL, timeout=300)
    traffic = production_traffic(k8s, ns, MODEL, bad_fraction=0.0, real=real)
    traffic.start()
    try:
        time.sleep(20)   # a steady window before the rollout
        result = _roll_out(k8s, ns, traffic, "2", {})
    finally:
        traffic.stop.set()
        traffic.join(30)
    result["sent"] = traffic.sent
    k8s.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, ns, models.PLURAL, MODEL)
    wait_for(lambda: not k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_MODEL}={MODEL}").items,
             180, "the model's pods gone")
    return result


def test_bench_in_place_against_pods(real, real_k8s, real_namespace_in, tmp_path):
    """benchmarks/inplace_bench.py: v1 -> v2 with pods, then (the model made again) in place; to $RANKOPS_INPLACE_BENCH."""
    import json
    import os

    out = os.environ.get(BENCH_ENV)
    assert out, f"run by benchmarks/inplace_bench.py, which sets ${BENCH_ENV}"
    k8s, ns = real_k8s, real_namespace_in
    spec = RankingModelSpec.model_validate(_model(real, "pods")["spec"])
    for version in ("1", "2"):   # v2: v1's weights rounded to FP16 (equivalent: both strategies promote it)
        spec_models.export(spec, ModelFormat.onnx, tmp_path / f"v{version}", seed=0, fp16_weights=version == "2")
        real.store.upload_tree("models", f"{MODEL}/{version}", tmp_path / f"v{version}")
    k8s.core.create_namespaced_secret(ns, real.store.secret_manifest("model-store", ns))
    report = {"pods": _run(real, k8s, ns, "pods"), "in_place": _run(real, k8s, ns, "inPlace"),
              "budget_p99_ms": PLANNING["slo"]["p99LatencyMs"], "replicas": REPLICAS}
    with open(out, "w") as f:
        json.dump(report, f)
    assert report["pods"]["outcome"] == "Promoted" and report["in_place"]["outcome"] == "Promoted", report
