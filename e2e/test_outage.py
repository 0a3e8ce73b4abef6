"""An API server outage mid-rollout, on pods that run in real containers (issue 24, item 3).

Seen on kwok's nodes: a 20 s outage mid-Warming, and the model rolled back 189 s later with
"canary 2 not Ready on live nodes" though its pod and node were back. The cause was the
simulation's: after the outage the node lifecycle controller finds the nodes' Leases lapsed and
marks their pods NotReady; a kubelet reports them Ready again, kwok's pod-ready stage (it matches
pods without a podIP) and the process node's runner (it wrote a status only when its own changed)
did not. Here a real kubelet's node (conftest's `real`) serves while the API server hangs for
60 s, past the Leases and the controller's grace period, and the canary warms up under traffic;
the rollout must go on and promote. The operator (the chart's pod on that node) logs its failed
requests meanwhile: that is expected, so this module does not hold it to a clean log.
"""
from __future__ import annotations

import time

from e2e import models, rollouts
from e2e.test_canary_real import GATE_JOBS, SMALL, SPEC, production_traffic, serve_real_model

REAL_IMAGES = ("rankops-operator", "rankops-triton-test", "rankops-gates")
OUTAGE_S = 60
TIMEOUT = 480


def test_a_rollout_goes_on_through_an_api_server_outage_mid_warming(real, real_k8s, real_namespace_in, tmp_path):
    k8s, ns, name = real_k8s, real_namespace_in, "ranker"
    body = models.model_manifest(
        name, version="1", versions=("1", "2"), modelCredentialsSecret="model-store",
        tritonImage=real.refs["rankops-triton-test"],
        rollout={"warmup": {"requests": 200, "concurrency": 2, "maxP99Ms": 1000},
                 "canary": {"weight": 50, "durationSeconds": 20, "analysis": {"minRequests": 20, "maxP99VsStable": 3}},
                 "gateJobs": GATE_JOBS}, **SMALL, **SPEC)
    serve_real_model(k8s, ns, real.store, tmp_path, body)
    traffic = production_traffic(k8s, ns, name, bad_fraction=0.0, real=real)
    traffic.start()
    try:
        models.patch_spec(k8s, ns, name, {"version": "2"})
        rollouts.watch_phases(k8s, ns, name, "2", {"Warming"}, timeout=TIMEOUT)
        started = time.time()
        with real.api_outage():   # the local API server stopped; on kind, the control-plane container paused
            time.sleep(OUTAGE_S)
        print(f"\nAPI server stopped for {time.time() - started:.0f} s during Warming")
        seen, rm, serving = rollouts.watch_phases(k8s, ns, name, "2", {"Promoted", "RolledBack"}, timeout=TIMEOUT)
    finally:
        traffic.stop.set()
        traffic.join(timeout=30)
    assert seen[-1] == "Promoted", (seen, rm["status"].get("rollout"), real.diagnostics(ns)[-4000:])
    assert rm["status"]["stableVersion"] == "2" and "Canary" in serving
    not_ready = [e for e in k8s.core.list_namespaced_event(ns).items
                 if e.reason in ("NodeNotReady", "TaintManagerEviction")]
    print(f"rollout: {seen}; {len(not_ready)} node-lifecycle events in the namespace; "
          f"traffic: {traffic.sent} sent, {traffic.failed} failed")
