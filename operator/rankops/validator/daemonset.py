"""The validator DaemonSet for a pool (pure: the operator applies what this returns).

Security: the pod mounts the host's / read-only at /host and reads files there; it runs as a
non-root user with no capabilities, a read-only root file system and no host namespaces. On
SELinux hosts (RHEL, OpenShift) a container_t process may not read host files such as
/var/lib/dkms or /etc/crio, so the container runs as spc_t; on OpenShift that needs an SCC that
allows hostPath volumes and seLinuxOptions (e.g. hostmount-anyuid bound to the service account).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from rankops.api.gpunodepool import GpuNodePool
from rankops.nodelabels import TAINT_KEY, VALIDATOR_APP, label_value
from rankops.validator.report import requirements_digest

HOST_ROOT = "/host"
NON_ROOT_UID = 65532


def validator_name(pool_name: str) -> str:
    """rankops-validator-<pool>, kept within 63 characters (a hash keeps long names distinct)."""
    name = f"rankops-validator-{pool_name}"
    if len(name) <= 63:
        return name
    suffix = hashlib.sha256(pool_name.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-.')}-{suffix}"


def render_validator(pool: GpuNodePool, namespace: str, service_account: str) -> list[dict[str, Any]]:
    name = validator_name(pool.name)
    selector = {"app.kubernetes.io/name": VALIDATOR_APP, "app.kubernetes.io/instance": name}
    labels = {**selector, "app.kubernetes.io/managed-by": "rankops", "app.kubernetes.io/part-of": "rankops",
              "rankops.io/pool": label_value(pool.name) or "unnamed"}
    requirements = json.dumps(pool.spec.requirements.to_wire(), sort_keys=True, separators=(",", ":"))
    args = ["validate-node", "--host-root", HOST_ROOT, "--node", "$(NODE_NAME)", "--pool-name", pool.name,
            "--requirements", requirements, "--patch-node", "--interval", str(pool.spec.validator.interval_seconds),
            "-o", "text"]
    if pool.spec.taint_failing_nodes:
        args.append("--taint-failing-nodes")
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    uid = pool.metadata.get("uid")
    if uid:  # a cluster-scoped owner may own namespaced objects
        metadata["ownerReferences"] = [{"apiVersion": pool.api_version, "kind": pool.kind, "name": pool.name,
                                        "uid": uid, "controller": True, "blockOwnerDeletion": True}]
    container = {
        "name": "validator",
        "image": pool.spec.validator.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rankops"],
        "args": args,
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "192Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NON_ROOT_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seLinuxOptions": {"type": "spc_t"},
        },
        "volumeMounts": [
            {"name": "host-root", "mountPath": HOST_ROOT, "readOnly": True, "mountPropagation": "HostToContainer"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {
                "metadata": {
                    "labels": labels,
                    # Pods roll when the requirements change, so no node keeps an outdated verdict.
                    "annotations": {"rankops.io/requirements-digest": requirements_digest(pool.spec.requirements)},
                },
                "spec": {
                    "serviceAccountName": service_account,
                    "automountServiceAccountToken": True,
                    "nodeSelector": dict(pool.spec.node_selector),
                    # The validator must keep running on nodes it tainted, or they could never pass again.
                    "tolerations": [
                        {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [container],
                    "volumes": [
                        {"name": "host-root", "hostPath": {"path": "/", "type": "Directory"}},
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    ],
                },
            },
        },
    }
    return [daemonset]
