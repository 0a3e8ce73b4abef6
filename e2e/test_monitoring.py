"""Per-model ServiceMonitors (chart value monitoring.tritonServiceMonitors, `rankops run
--service-monitors`; the `operator` fixture runs with both) against a live API server.

Without the Prometheus Operator's CRD a model serves as usual and the operator says so once, at
INFO; once the CRD is installed (a minimal stand-in here: same group, version and kind, schema
left open) the next reconcile applies the ServiceMonitor, owned by its RankingModel.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e import models
from e2e.support import gone, wait_for
from rankops.render import names

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")

GROUP, VERSION, PLURAL = "monitoring.coreos.com", "v1", "servicemonitors"
CRD_NAME = f"{PLURAL}.{GROUP}"
MINIMAL_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME, "labels": {"e2e.rankops.io/minimal": "true"}},
    "spec": {
        "group": GROUP, "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "servicemonitor", "kind": "ServiceMonitor",
                  "listKind": "ServiceMonitorList", "shortNames": ["smon"]},
        "versions": [{"name": VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


def _crd_present(k8s: Any) -> bool:
    return not gone(lambda: k8s.apiextensions.read_custom_resource_definition(CRD_NAME))


@pytest.fixture
def service_monitor_crd(k8s: Any) -> Iterator[None]:
    """Install the minimal CRD for the test, unless the cluster has the real one (kept as is)."""
    from kubernetes.client.exceptions import ApiException

    ours = not _crd_present(k8s)
    if ours:
        k8s.apiextensions.create_custom_resource_definition(MINIMAL_CRD)

    def established() -> bool:
        crd = k8s.apiextensions.read_custom_resource_definition(CRD_NAME)
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, 30, f"CRD {CRD_NAME} Established")
    yield
    if ours:
        try:
            k8s.apiextensions.delete_custom_resource_definition(CRD_NAME)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _service_monitor(k8s: Any, namespace: str, model: str) -> dict:
    return k8s.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                   names.service_monitor_name(model))


def test_model_serves_without_the_crd_and_gets_its_service_monitor_once_it_exists(k8s, namespace, operator):
    if _crd_present(k8s):
        pytest.skip("this cluster already serves ServiceMonitors; the next test covers it")
    models.create(k8s, namespace, models.model_manifest("plain"))
    rm = models.wait_ready(k8s, namespace, "plain")
    assert models.condition(rm, "Degraded").get("status") == "False", "monitoring is optional"
    said = operator.log_path.read_text(errors="replace").count(
        "does not serve monitoring.coreos.com/v1 servicemonitors")
    assert 1 <= said <= operator.starts, "said once per operator process, not per reconcile"


def test_service_monitor_is_applied_owned_and_collected(k8s, namespace, operator, service_monitor_crd):
    created = models.create(k8s, namespace, models.model_manifest("scraped"))
    sm = wait_for(lambda: _service_monitor(k8s, namespace, "scraped"), models.OP_TIMEOUT,
                  f"ServiceMonitor {namespace}/scraped")
    assert [(r["kind"], r["name"], r["uid"], r.get("controller")) for r in sm["metadata"]["ownerReferences"]] == \
        [("RankingModel", "scraped", created["metadata"]["uid"], True)]
    assert sm["metadata"]["labels"]["app.kubernetes.io/instance"] == "scraped"
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    # It selects the stable track Service, whose named metrics port is Triton's 8002.
    models.wait_ready(k8s, namespace, "scraped")
    svc = k8s.core.read_namespaced_service(names.track_service_name("scraped", names.STABLE), namespace)
    labels = svc.metadata.labels
    assert sm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [expr] = sm["spec"]["selector"]["matchExpressions"]
    assert labels[expr["key"]] in expr["values"]
    assert any(p.name == "metrics" and p.port == 8002 for p in svc.spec.ports)

    # Drift is repaired: a deleted ServiceMonitor comes back on the next re-check.
    k8s.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "scraped")
    wait_for(lambda: _service_monitor(k8s, namespace, "scraped")["metadata"]["uid"] != sm["metadata"]["uid"],
             models.OP_TIMEOUT, "ServiceMonitor re-applied")

    k8s.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.PLURAL, "scraped")
    wait_for(lambda: gone(lambda: _service_monitor(k8s, namespace, "scraped")), 60,
             "ServiceMonitor garbage-collected with its RankingModel")
