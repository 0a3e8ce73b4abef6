"""spec.latencyIsolation on a real kubelet with the static CPU manager (issue 38).

The promise (render/isolation.py): every container of the Triton pod has requests == limits, so
the pod is Guaranteed, and Triton's whole-CPU request gets cores of its own. Only a kubelet can
keep it: this module's real node runs the static CPU manager (one core kept back for the shared
pool), and the test reads the cpusets the kubelet wrote into the cgroups of the processes.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e import models
from rankops.api.rankingmodel import ModelFormat, RankingModelSpec
from rankops.render import names
from rankops_dev import spec_models
from rankops_dev.real_cluster import process_facts

pytestmark = pytest.mark.usefixtures("real_operator_logs_no_errors")
REAL_CPU_MANAGER_POLICY = "static"


def cpus_of(pid: int) -> set[int]:
    """The CPUs the process may run on, from its cpuset cgroup (v1) or the unified one (v2)."""
    path = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if line.split(":", 2)[1] in ("cpuset", ""))
    for root in (Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup")):
        for name in ("cpuset.cpus", "cpuset.cpus.effective"):
            if (root / path.lstrip("/") / name).exists():
                return parse_cpus((root / path.lstrip("/") / name).read_text())
    raise AssertionError(f"no cpuset for cgroup {path} of {pid}")


def parse_cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        cpus |= set(range(int(low), int(high or low) + 1))
    return cpus



def test_a_latency_isolated_model_gets_a_guaranteed_pod_and_triton_cores_of_its_own(
        real, real_k8s, real_namespace_in, tmp_path):
    k8s, ns, name = real_k8s, real_namespace_in, "isolated"
    assert os.cpu_count() and os.cpu_count() >= 2, "the static CPU manager needs a core beside the reserved one"
    k8s.core.create_namespaced_secret(ns, real.store.secret_manifest("model-store", ns))
    body = models.model_manifest(name, version="1", modelCredentialsSecret="model-store",
                                 tritonImage=real.refs["rankops-triton-test"], latencyIsolation=True,
                                 resources={"cpu": "1", "memory": "1Gi"})
    body["spec"]["versions"][0]["precision"] = "fp32"
    directory = tmp_path / "1"
    spec_models.export(RankingModelSpec.model_validate(body["spec"]), ModelFormat.onnx, directory)
    real.store.upload_tree("models", f"{name}/1", directory)
    models.create(k8s, ns, body)
    models.wait_ready(k8s, ns, name, timeout=240)

    [pod] = [p for p in k8s.core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_MODEL}={name}").items
             if p.metadata.deletion_timestamp is None]
    assert pod.status.qos_class == "Guaranteed", pod.status.qos_class
    statuses = {c.name: c for c in pod.status.container_statuses}
    triton = process_facts(statuses["triton"].container_id, "tritonserver")
    assert triton is not None
    triton_cpus = cpus_of(triton["pid"])
    # One exclusive core: the kubelet's cpuset for Triton is a single CPU ...
    assert len(triton_cpus) == 1, triton_cpus
    # ... that no other container on the node may run on (the shared pool is the rest).
    others = {}
    for other in k8s.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={real.node_name}").items:
        for status in other.status.container_statuses or []:
            if not (status.container_id and status.state.running) or status.container_id == statuses["triton"].container_id:
                continue
            facts = process_facts(status.container_id, None)
            if facts:
                others[f"{other.metadata.name}/{status.name}"] = cpus_of(facts["pid"])
    assert others, "no other running container found on the node"
    assert all(not (cpus & triton_cpus) for cpus in others.values()), (triton_cpus, others)
    print(f"\ntriton cpuset {sorted(triton_cpus)}; others {({k: sorted(v) for k, v in others.items()})}")
