"""What the operator applied loads in a real tritonserver and answers.

kwok simulates the serving pods, so the objects the operator wrote to the API server are taken
from there — the ConfigMap's config.pbtxt and the Deployment's tritonserver command line — and
run on the real-Triton fixture (only local paths, ports and the named CPU edits changed), over a
small model of the spec's tensors. A config the operator renders but Triton refuses fails here.
"""
from __future__ import annotations

import numpy as np
import pytest

from e2e import models
from rankops.api.rankingmodel import RankingModel
from rankops.render import names
from rankops_dev.container_env import expand
from rankops_dev import spec_models, triton

pytestmark = pytest.mark.usefixtures("gpu_nodes", "operator_logs_no_errors")


def _applied(k8s, namespace: str, name: str) -> tuple[dict, dict]:
    sanitize = k8s.api_client.sanitize_for_serialization
    deployment = sanitize(k8s.apps.read_namespaced_deployment(names.deployment_name(name, names.STABLE), namespace))
    config_map = sanitize(k8s.core.read_namespaced_config_map(names.config_map_name(name, names.STABLE), namespace))
    return deployment, config_map


@pytest.mark.parametrize("spec", [
    pytest.param({}, id="candidates-as-batch"),
    pytest.param({"responseCache": True, "instancesPerGpu": 2,
                  "candidates": None,
                  "inputs": [{"name": "user_ids", "dataType": "INT64", "dims": [4]},
                             {"name": "item_ids", "dataType": "INT64", "dims": [-1], "maxDims": [50]},
                             {"name": "item_features", "dataType": "FP32", "dims": [-1, 8], "maxDims": [50, 8]}],
                  "outputs": [{"name": "scores", "dataType": "FP32", "dims": [-1]}],
                  "batching": {"maxBatchSize": 8}, "modelWarmup": {"batchSizes": [1, 8]}},
                 id="int-ids-warmup-cache-two-instances"),
])
def test_the_applied_config_and_command_line_serve_on_real_triton(k8s, namespace, operator, tmp_path, spec):
    body = models.model_manifest("served", **spec)
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    models.create(k8s, namespace, body)
    models.wait_ready(k8s, namespace, "served")
    deployment, config_map = _applied(k8s, namespace, "served")
    rm = RankingModel.model_validate({**body, "metadata": {"name": "served", "namespace": namespace}})

    artifact = tmp_path / "v1"
    spec_models.export(rm.spec, rm.spec.versions[0].format, artifact)
    server = triton.TritonServer.for_rendered(deployment, config_map, {"1": artifact}, tmp_path)
    print(f"CPU edits: {server.cpu_edits}")
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "triton")
    with server:
        kept = [a for a in server.arguments() if a.split("=", 1)[0] not in triton.LOCAL_FLAGS]
        # The Deployment's own arguments, $(VAR)s expanded from its env as the kubelet does (the
        # model's control-API key from its Secret).
        assert kept == [expand(a, server.env) for a in container["args"]
                        if a.split("=", 1)[0] not in triton.LOCAL_FLAGS]
        assert any(a.startswith("--http-restricted-api=model-repository") and "$(" not in a for a in kept), kept
        connection_inputs = spec_models.request_arrays(rm.spec, candidates=23)
        outputs = server.infer("served", connection_inputs)
        findings = server.findings()
    rows = next(iter(connection_inputs.values())).shape[0]
    assert outputs["scores"].shape[0] == rows and np.isfinite(outputs["scores"]).all()
    assert not findings, "Triton warned or refused:\n" + "\n".join(findings)
