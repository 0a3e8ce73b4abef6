"""Fixed names and labels of everything rankops creates for a RankingModel.

Child names are fixed per track (stable, canary), never generated, so a retried apply finds the
object it made before instead of making another.
"""
from __future__ import annotations

import hashlib

STABLE, CANARY = "stable", "canary"
TRACKS = (STABLE, CANARY)
REFERENCE = "reference"   # the track that serves the stable version to the equivalence gate, when asked
GATE_APP = "rankops-gate"   # app.kubernetes.io/name of the gate Jobs (the validator's: nodelabels.VALIDATOR_APP)

LABEL_MODEL = "rankops.io/model"
LABEL_TRACK = "rankops.io/track"
LABEL_VERSION = "rankops.io/version"
LABEL_GATE = "rankops.io/gate"
# A shared Triton server (issue 42): its pods, and the Services and EndpointSlices of its members.
LABEL_SERVER = "rankops.io/server"
LABEL_ATTEMPT = "rankops.io/attempt"
# Pods carrying traffic=on are behind the model's serving Service. Canary pods start "off" and
# are switched on in place (no restart) once their gates pass.
LABEL_TRAFFIC = "rankops.io/traffic"
ANNOTATION_CONFIG_HASH = "rankops.io/config-hash"
# rollout.strategy inPlace: on each stable pod, the digest of the versions.json its stager should
# see. A pod update makes the kubelet sync the pod, and its ConfigMap volume with it, at once rather
# than at its next periodic sync (up to a minute).
ANNOTATION_STAGED_VERSIONS = "rankops.io/staged-versions"
# rollout.strategy inPlace: on the stable pod template, the version its pods were last started for.
# An in-place switch changes what the running pods serve and leaves it; any other change of the
# stable version (a rollout that fell back to pods, a strategy change) changes it, so the pods roll.
ANNOTATION_STARTED_FOR = "rankops.io/started-for"
FIELD_MANAGER = "rankops"


def deployment_name(model: str, track: str) -> str:
    return f"{model}-{track}"


def config_map_name(model: str, track: str) -> str:
    return f"{model}-{track}-triton"


def track_service_name(model: str, track: str) -> str:
    return f"{model}-{track}"


def disruption_budget_name(model: str, track: str) -> str:
    return f"{model}-{track}"


def api_key_secret_name(model: str) -> str:
    """The Secret holding the key of Triton's restricted APIs (model-repository...) for every track."""
    return f"{model}-triton-api-key"


def server_name(server: str) -> str:
    """A shared server's Deployment, ConfigMap, disruption budget, NetworkPolicy and API key."""
    return f"{server}-shared"


def member_endpoints_name(model: str) -> str:
    """The EndpointSlice of a shared server's member: its Service's name and a fixed suffix."""
    return f"{model}-shared"


def network_policy_name(model: str) -> str:
    return f"{model}-triton"


def serving_service_name(model: str) -> str:
    return model


def service_monitor_name(model: str) -> str:
    return model


def gate_job_name(model: str, gate: str, version: str, attempt: str) -> str:
    """`<model>-<gate>-<version>-<attempt>`, at most 63 characters (the Job's pods carry it as a
    label value). A longer one keeps a cut prefix, a hash of the whole name and the attempt id, so
    no two attempts or versions share a Job, whatever the length of the names."""
    full = f"{model}-{gate}-{version}-{attempt}"
    if len(full) <= 63:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    head = full[:63 - len(digest) - len(attempt) - 2].rstrip("-.")
    return f"{head}-{digest}-{attempt}"


def common_labels(model: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": model,
        "app.kubernetes.io/part-of": "rankops",
        "app.kubernetes.io/managed-by": "rankops",
        LABEL_MODEL: model,
    }


def track_selector(model: str, track: str) -> dict[str, str]:
    return {LABEL_MODEL: model, LABEL_TRACK: track}


# The NVIDIA GPU Operator's driver upgrade state of a node, and the states in which its GPU pods
# are about to be deleted or its new driver is not validated yet (gpu-operator docs, "GPU Driver
# Upgrades", Upgrade State Machine). `upgrade-required` is set on every node at once and only
# queues the node; it is not one of them.
LABEL_DRIVER_UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_UPGRADE_LEAVING_STATES = ("cordon-required", "wait-for-jobs-required", "pod-deletion-required",
                                 "drain-required", "pod-restart-required", "validation-required", "upgrade-failed")
# The ReplicaSet removes pods of the lowest cost first when it scales down.
ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
