"""A `batching: auto` model against a live API server: planned once, on the planner's thread, and
not planned again by a restarted operator while the plan's inputs are the same
(status.plan.inputsDigest); a change of them plans again."""
from __future__ import annotations

import pytest

from e2e import models
from e2e.support import wait_for
from rankops.render import names

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")

# One replica (failureTolerance 0), so it fits the e2e set's GPUs; 200 candidates fit in 25 ms.
AUTO = {"batching": "auto", "slo": {"p99LatencyMs": 25, "targetQps": 100},
        "planning": {"headroom": 0.5, "failureTolerance": 0, "latencyProfile": {1: 1.0, 64: 2.0, 256: 4.0, 512: 7.0}}}


def planned_lines(operator, digest: str, after: int = 0) -> list[str]:
    text = operator.log_path.read_text(errors="replace")[after:]
    return [line for line in text.splitlines() if f"planned inputs {digest[:12]}" in line]


def test_an_auto_model_is_planned_once_and_not_again_after_a_restart(k8s, namespace, operator):
    body = models.model_manifest("auto", **AUTO)
    del body["spec"]["replicas"]   # the plan chooses them
    models.create(k8s, namespace, body)
    rm = models.wait_ready(k8s, namespace, "auto")
    plan = rm["status"]["plan"]
    digest = plan["inputsDigest"]
    assert plan["mode"] == "auto" and len(digest) == 64, plan
    deployment = k8s.apps.read_namespaced_deployment(names.deployment_name("auto", names.STABLE), namespace)
    assert deployment.spec.replicas == plan["replicas"] == rm["status"]["replicas"]
    assert len(planned_lines(operator, digest)) == 1, "planned once, however many reconciles"

    # A restarted operator reconciles every model (kopf lists them), from the status it finds.
    operator.stop()
    mark = operator.log_path.stat().st_size
    operator.start()
    wait_for(lambda: f"reconciled {namespace}/auto generation 1" in operator.log_path.read_text(errors="replace")[mark:]
             and models.get(k8s, namespace, "auto"), 60, "the restarted operator resumed the model")
    models.patch_spec(k8s, namespace, "auto", {"version": "1", "resources": {"cpu": "2", "memory": "2Gi"}})
    models.wait_ready(k8s, namespace, "auto")
    assert planned_lines(operator, digest, mark) == [], "planned again with the same inputs"
    assert models.get(k8s, namespace, "auto")["status"]["plan"] == plan

    # New inputs: a new plan, and its digest.
    models.patch_spec(k8s, namespace, "auto", {"slo": {"p99LatencyMs": 25, "targetQps": 200}})
    rm = models.wait_status(k8s, namespace, "auto", lambda rm: rm["status"].get("observedGeneration") == 3
                            and (rm["status"].get("plan") or {}).get("inputsDigest") not in (None, digest),
                            "planned again for the new target")
    assert len(planned_lines(operator, rm["status"]["plan"]["inputsDigest"], mark)) == 1
