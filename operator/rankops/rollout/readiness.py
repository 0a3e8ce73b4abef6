"""Which canary pods count as Ready: a pure decision over what the controller observed.

A Deployment's readyReplicas trusts each pod's last reported condition: a pod whose node was
deleted or stopped reporting stays Ready there until the node controller evicts it (minutes),
and during a rolling update (a superseded canary) it also counts the previous version's pods.
A rollout moves on live pods only: Ready, not being deleted, of the version it rolls out, on a
node that exists and is Ready.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rankops.render import names


@dataclass(frozen=True)
class PodObservation:
    name: str
    version: str | None      # the pod's rankops.io/version label
    ready: bool              # its Ready condition is True
    deleting: bool           # deletionTimestamp set
    node: str | None         # spec.nodeName
    node_ready: bool         # that node exists, is not being deleted and says Ready
    unschedulable: str | None = None   # the scheduler's message while it cannot place the pod


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def pod_ready(pod: dict[str, Any]) -> bool:
    """Its Ready condition is True (as last reported: live_ready_pods says whether it still holds)."""
    return _condition_true(pod, "Ready")


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    """The scheduler's reason a pod is not placed (PodScheduled False, Unschedulable), e.g.
    '0/3 nodes are available: 3 Insufficient nvidia.com/gpu.'; None once it is bound."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return (c.get("message") or "no node fits").strip()
    return None


def observe_pod(pod: dict[str, Any], node: dict[str, Any] | None) -> PodObservation:
    """A pod and its node (None: no such node) as the rollout sees them."""
    meta = pod.get("metadata") or {}
    node_ready = node is not None and not (node.get("metadata") or {}).get("deletionTimestamp") \
        and _condition_true(node, "Ready")
    return PodObservation(name=meta.get("name", ""), version=(meta.get("labels") or {}).get(names.LABEL_VERSION),
                          ready=pod_ready(pod), deleting=bool(meta.get("deletionTimestamp")),
                          node=(pod.get("spec") or {}).get("nodeName"), node_ready=bool(node_ready),
                          unschedulable=unschedulable_message(pod))


def counts_ready(pod: PodObservation, version: str) -> bool:
    return pod.version == version and pod.ready and not pod.deleting and pod.node_ready


def ready_count(pods: Iterable[PodObservation], version: str) -> int:
    return sum(counts_ready(p, version) for p in pods)


def unschedulable_summary(pods: Iterable[dict[str, Any]], what: str) -> str | None:
    """'2 stable pods unschedulable: 0/3 nodes are available: ...' for the pods the scheduler cannot
    place (the first one's reason), or None."""
    stuck = [m for m in (unschedulable_message(p) for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp"))
             if m]
    if not stuck:
        return None
    return f"{len(stuck)} {what} pod{'s' if len(stuck) > 1 else ''} unschedulable: {stuck[0]}"
