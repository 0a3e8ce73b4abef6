"""The validator DaemonSet for a pool (pure: the operator applies what this returns).

Security: the pod mounts, read-only, only the host paths the checks read (HOST_MOUNTS), each at
its own place under /host, so the checks see the host's layout; never the host's /, and nothing
that holds the kubelet's pod directories (/var/lib/kubelet/pods: every pod's tokens and Secrets)
or the container runtimes' sockets and state (/run/containerd, /var/lib/containerd). It runs as
user and group 65532 (runAsGroup: without it a UID the image does not know runs as group 0, which
may read every root:root 0750 directory on the host), with no capabilities, a read-only root file
system and no host namespaces. On SELinux hosts (RHEL, OpenShift) a container_t process may not
read host files such as /var/lib/dkms or /etc/crio, so the container runs as spc_t; on OpenShift
that needs an SCC that allows hostPath volumes and seLinuxOptions (the chart's, openshift.enabled).

Liveness: the agent touches HEARTBEAT after each round (validate, patch the node); a probe fails
when the file is older than HEARTBEAT_INTERVALS intervals, so a validator stuck in a read of the
host, NVML or the API is restarted instead of leaving its node's last verdict standing.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from rankops.api.gpunodepool import GpuNodePool
from rankops.nodelabels import TAINT_KEY, VALIDATOR_APP, label_value
from rankops.validator.report import requirements_digest

HOST_ROOT = "/host"
NON_ROOT_UID = 65532
NON_ROOT_GID = 65532
HEARTBEAT = "/tmp/heartbeat"
HEARTBEAT_INTERVALS = 3   # a round older than this many intervals: the validator is stuck
# The chart's default ServiceAccount name (<fullname>-validator for the release `rankops`), and the
# default of `rankops run --validator-service-account` and `rankops render`: one name everywhere.
DEFAULT_SERVICE_ACCOUNT = "rankops-operator-validator"
# As NVIDIA's GPU Operator gives its validator: evicted last under node pressure, and it preempts
# ordinary pods to be scheduled on a node that is full. "" for none (see docs/security.md: some
# platforms admit the system-* classes only in some namespaces).
DEFAULT_PRIORITY_CLASS = "system-node-critical"

# The host paths the checks read (checks.py, latency.py, gpu.py: every path a HostView is asked
# for), each mounted read-only at HOST_ROOT + path, and the hostPath type it is mounted with.
# "Directory": present on every Linux node. "DirectoryOrCreate" / "FileOrCreate": present only on
# some (DKMS, RKE2, CDI, CRI-O hooks); the kubelet creates it empty where it is missing, which the
# checks read as "absent". The kubelet's own directory is never mounted, only its config file.
# /var/run is /run on every systemd host: /var/run/cdi is read as /run/cdi.
HOST_MOUNTS: tuple[tuple[str, str], ...] = (
    ("/etc", "Directory"),                  # os-release, modprobe.d, ld.so.conf, crio, containerd, cdi, tuned, kubelet (OpenShift)
    ("/proc", "Directory"),                 # driver/nvidia, modules, cmdline, sys/kernel, sys/vm, <pid>/comm
    ("/sys", "Directory"),                  # firmware/efi, module/nvidia, fs/selinux, devices/system, bus/pci
    ("/usr", "Directory"),                  # lib, lib64, lib/<arch>-linux-gnu, local/nvidia/lib64, share/containers/oci/hooks.d
    ("/lib", "Directory"),                  # modules (/usr/lib on merged-/usr hosts)
    ("/lib64", "DirectoryOrCreate"),        # /usr/lib64 on merged-/usr hosts
    ("/opt/nvidia/lib64", "DirectoryOrCreate"),
    ("/var/lib/dkms", "DirectoryOrCreate"),
    ("/var/lib/rancher/rke2/agent/etc/containerd", "DirectoryOrCreate"),
    ("/var/lib/kubelet/config.yaml", "FileOrCreate"),   # the kubeadm kubelet's config, alone
    ("/run/cdi", "DirectoryOrCreate"),
    ("/run/modprobe.d", "DirectoryOrCreate"),
    ("/run/containers/oci/hooks.d", "DirectoryOrCreate"),
    # The PM QoS CPU latency in force (latency.pm_qos_latency): root's alone (0600) and outside the
    # container's device cgroup, so the validator reads "permission denied", as through a mount of /.
    ("/dev/cpu_dma_latency", "CharDevice"),
)


def _volume_name(host_path: str) -> str:
    """host-etc, host-var-lib-kubelet-config-yaml, ... (a DNS label)."""
    return "host-" + re.sub(r"[^a-z0-9]+", "-", host_path.lower()).strip("-")


def liveness_command(interval_seconds: int) -> list[str]:
    """Fails when the heartbeat is missing or older than HEARTBEAT_INTERVALS intervals (the
    image's Python, no shell: rankops.validator.heartbeat imports nothing heavy)."""
    return ["python3", "-m", "rankops.validator.heartbeat", HEARTBEAT,
            "--max-age", str(HEARTBEAT_INTERVALS * interval_seconds)]


def validator_name(pool_name: str) -> str:
    """rankops-validator-<pool>, kept within 63 characters (a hash keeps long names distinct)."""
    name = f"rankops-validator-{pool_name}"
    if len(name) <= 63:
        return name
    suffix = hashlib.sha256(pool_name.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-.')}-{suffix}"


def render_validator(pool: GpuNodePool, namespace: str, service_account: str = DEFAULT_SERVICE_ACCOUNT, *,
                     image: str | None = None,
                     priority_class_name: str = DEFAULT_PRIORITY_CLASS) -> list[dict[str, Any]]:
    """`image`: instead of the pool's spec.validator.image (the operator's --validator-image);
    `priority_class_name`: "" for none."""
    name = validator_name(pool.name)
    selector = {"app.kubernetes.io/name": VALIDATOR_APP, "app.kubernetes.io/instance": name}
    labels = {**selector, "app.kubernetes.io/managed-by": "rankops", "app.kubernetes.io/part-of": "rankops",
              "rankops.io/pool": label_value(pool.name) or "unnamed"}
    requirements = json.dumps(pool.spec.requirements.to_wire(), sort_keys=True, separators=(",", ":"))
    args = ["validate-node", "--host-root", HOST_ROOT, "--node", "$(NODE_NAME)", "--pool-name", pool.name,
            "--requirements", requirements, "--patch-node", "--interval", str(pool.spec.validator.interval_seconds),
            "--heartbeat", HEARTBEAT, "-o", "text"]
    if pool.spec.taint_failing_nodes:
        args.append("--taint-failing-nodes")
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    uid = pool.metadata.get("uid")
    if uid:  # a cluster-scoped owner may own namespaced objects
        metadata["ownerReferences"] = [{"apiVersion": pool.api_version, "kind": pool.kind, "name": pool.name,
                                        "uid": uid, "controller": True, "blockOwnerDeletion": True}]
    container = {
        "name": "validator",
        "image": image or pool.spec.validator.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rankops"],
        "args": args,
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        # Disk: its log files only (the kubelet rotates them at 10Mi x 5; /tmp is in memory).
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi", "ephemeral-storage": "16Mi"},
                      "limits": {"memory": "192Mi", "ephemeral-storage": "128Mi"}},
        "livenessProbe": {
            "exec": {"command": liveness_command(pool.spec.validator.interval_seconds)},
            "periodSeconds": 60, "timeoutSeconds": 10, "failureThreshold": 2,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NON_ROOT_UID,
            "runAsGroup": NON_ROOT_GID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seLinuxOptions": {"type": "spc_t"},
        },
        "volumeMounts": [
            *({"name": _volume_name(path), "mountPath": HOST_ROOT + path, "readOnly": True,
               **({"mountPropagation": "HostToContainer"} if kind != "FileOrCreate" else {})}
              for path, kind in HOST_MOUNTS),
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
                    # No fsGroup and no supplementalGroups; the image's /etc/group names no member with UID
                    # 65532, so the process's groups are 65532 alone. (supplementalGroupsPolicy: Strict would
                    # make that independent of the image, but server-side apply refuses the field before
                    # Kubernetes 1.31.)
                    "securityContext": {"runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_GID, "runAsNonRoot": True,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    **({"priorityClassName": priority_class_name} if priority_class_name else {}),
                    "terminationGracePeriodSeconds": 5,
                    "containers": [container],
                    "volumes": [
                        *({"name": _volume_name(path), "hostPath": {"path": path, "type": kind}}
                          for path, kind in HOST_MOUNTS),
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    ],
                },
            },
        },
    }
    return [daemonset]
