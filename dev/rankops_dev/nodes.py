"""Simulated GPU nodes: kwok-managed `v1.Node` objects that look like RHEL 8 GPU servers.

The builders are pure (a shape in, a Node manifest out); `create_nodes` and `wait_nodes_ready`
are the thin shell that talks to the API server. Labels follow what NVIDIA GPU Feature
Discovery publishes on real nodes, so pools and models select them the same way.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

# kwok runs with --manage-nodes-with-annotation-selector on this annotation, so it only ever
# touches nodes made here, never a real node of a shared (e.g. kind) cluster.
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_SELECTOR = f"{KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}"
# Marks every node this module made, so tests and `dev` can find and clean them up.
SIM_LABEL = "sim.rankops.io/node"

RHEL8_NODE_INFO = {
    "osImage": "Red Hat Enterprise Linux 8.9 (Ootpa)",
    "kernelVersion": "4.18.0-513.5.1.el8_9.x86_64",
    "containerRuntimeVersion": "cri-o://1.27.1",
    "operatingSystem": "linux",
    "architecture": "amd64",
}


@dataclass(frozen=True)
class NodeShape:
    """One cloud instance type: its CPUs, memory, and GPUs (none for a CPU node)."""

    instance_type: str
    cpu: int
    memory_gib: int
    gpu_count: int = 0
    gpu_product: str | None = None  # as GPU Feature Discovery spells it, e.g. "Tesla-T4"
    gpu_memory_mib: int | None = None  # per GPU, as GFD reports it


SHAPES: dict[str, NodeShape] = {
    "t4": NodeShape("g4dn.xlarge", cpu=4, memory_gib=16, gpu_count=1,
                    gpu_product="Tesla-T4", gpu_memory_mib=15360),
    "l4": NodeShape("g6.xlarge", cpu=4, memory_gib=16, gpu_count=1,
                    gpu_product="NVIDIA-L4", gpu_memory_mib=23034),
    "a10": NodeShape("g5.xlarge", cpu=4, memory_gib=16, gpu_count=1,
                     gpu_product="NVIDIA-A10G", gpu_memory_mib=23028),
    "a100": NodeShape("p4d.24xlarge", cpu=96, memory_gib=1152, gpu_count=8,
                      gpu_product="NVIDIA-A100-SXM4-40GB", gpu_memory_mib=40960),
    "cpu": NodeShape("m5.xlarge", cpu=4, memory_gib=16),
}

# The fixed set the e2e suite schedules against (on kind the workflow creates the same set).
E2E_NODES: tuple[tuple[str, str], ...] = (
    ("kwok-t4-0", "t4"),
    ("kwok-t4-1", "t4"),
    ("kwok-l4-0", "l4"),
    ("kwok-cpu-0", "cpu"),
    # Room for pool-less models and canaries of every test at once (8 GPUs, no pool labels).
    ("kwok-a100-0", "a100"),
)


def dev_node_set(gpu_nodes: int) -> list[tuple[str, str]]:
    """`gpu_nodes` GPU nodes alternating T4 and L4, plus one CPU node."""
    if gpu_nodes < 0:
        raise ValueError(f"--nodes must be 0 or more, got {gpu_nodes}")
    names = [("t4", "l4")[i % 2] for i in range(gpu_nodes)]
    counts: dict[str, int] = {}
    result = []
    for kind in names:
        result.append((f"kwok-{kind}-{counts.get(kind, 0)}", kind))
        counts[kind] = counts.get(kind, 0) + 1
    return result + [("kwok-cpu-0", "cpu")]


def node_ip(name: str) -> str:
    """A stable, distinct-enough InternalIP for a node name (10.240.0.0/16)."""
    digest = uuid.uuid5(uuid.NAMESPACE_DNS, name).bytes
    return f"10.240.{digest[0]}.{digest[1] % 253 + 1}"


def gpu_node(name: str, shape: NodeShape, kubelet_version: str = "v1.34.4") -> dict[str, Any]:
    """The Node manifest for one simulated server of `shape`."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": shape.instance_type,
        "type": "kwok",
        SIM_LABEL: "true",
    }
    resources = {"cpu": str(shape.cpu), "memory": f"{shape.memory_gib}Gi", "pods": "110",
                 "ephemeral-storage": "100Gi"}
    if shape.gpu_count:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": shape.gpu_product or "",
            "nvidia.com/gpu.memory": str(shape.gpu_memory_mib),
            "nvidia.com/gpu.count": str(shape.gpu_count),
        }
        resources["nvidia.com/gpu"] = str(shape.gpu_count)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
        },
        "spec": {},
        "status": {
            "addresses": [{"type": "InternalIP", "address": node_ip(name)},
                          {"type": "Hostname", "address": name}],
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": RHEL8_NODE_INFO | {
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": "",  # deprecated field, still required by the client model
                # Stable per name, so a re-created node looks like the same machine.
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.machine").hex,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.system")),
                "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.boot")),
            },
        },
    }


def node_manifests(node_set: list[tuple[str, str]] | tuple[tuple[str, str], ...],
                   kubelet_version: str = "v1.34.4") -> list[dict[str, Any]]:
    """Manifests for (name, shape key) pairs; an unknown shape key is a clear error."""
    manifests = []
    for name, key in node_set:
        if key not in SHAPES:
            raise ValueError(f"node {name!r}: unknown shape {key!r}; known: {', '.join(SHAPES)}")
        manifests.append(gpu_node(name, SHAPES[key], kubelet_version))
    return manifests


def create_nodes(api_client: Any, manifests: list[dict[str, Any]]) -> None:
    """Create the nodes; one that already exists is left as it is (re-runs are harmless)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    for manifest in manifests:
        try:
            core.create_node(manifest)
        except ApiException as exc:
            if exc.status != 409:
                raise


def wait_nodes_ready(api_client: Any, names: list[str], timeout: float = 60.0) -> None:
    """Block until every named node reports Ready=True (kwok's node-initialize stage)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    pending = set(names)
    while True:
        for node in core.list_node(label_selector=SIM_LABEL).items:
            conditions = node.status.conditions or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                pending.discard(node.metadata.name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"kwok nodes not Ready after {timeout:.0f}s: {', '.join(sorted(pending))} "
                "(is kwok running with the rankops stages? see its log)")
        time.sleep(0.3)


def delete_nodes(api_client: Any) -> None:
    """Delete every node this module created."""
    from kubernetes import client

    client.CoreV1Api(api_client).delete_collection_node(label_selector=SIM_LABEL)
