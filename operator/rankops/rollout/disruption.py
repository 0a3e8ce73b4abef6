"""Replicas on nodes that are going away move first, then go (pure).

A node is leaving when it is cordoned (a drain, a cluster autoscaler's scale-down), when the
validator marks it failing (`rankops.io/gpu-ready=false`, unless its pool keeps replicas there),
or when the NVIDIA GPU Operator's upgrade controller works on its driver
(`nvidia.com/gpu-driver-upgrade-state` from cordon-required to validation-required, or
upgrade-failed; `upgrade-required` is set on every node at once and only means "queued"), or
when it is not Ready (its kubelet stopped reporting, or reports it unhealthy): its pods were
marked not Ready with it, and a replacement is surged at once instead of waiting out the pods'
unreachable toleration.

The stable Deployment then runs one more replica per pod on a leaving node (a surge, on another
ready node) until the pods elsewhere that are Ready (and so warm) are as many as the model wants;
then it is scaled back and the ReplicaSet removes the leaving pods first (their
`controller.kubernetes.io/pod-deletion-cost` is lowest). A drain's evictions meanwhile wait on
the PodDisruptionBudget. Nothing is remembered: each reconcile decides from what it sees.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rankops.nodelabels import LABEL_READY
from rankops.render.names import (ANNOTATION_DELETION_COST as DELETION_COST, DRIVER_UPGRADE_LEAVING_STATES,
                                  LABEL_DRIVER_UPGRADE_STATE as UPGRADE_STATE_LABEL)
from rankops.rollout.readiness import pod_ready

LEAVING_COST = "-1000"     # below every other pod of the ReplicaSet (default 0): removed first


def node_leaving(node: Mapping[str, Any] | None, move_from_failing: bool = True) -> str | None:
    """Why replicas should leave this node now, or None."""
    if not node:
        return None
    labels = (node.get("metadata") or {}).get("labels") or {}
    state = labels.get(UPGRADE_STATE_LABEL)
    if state in DRIVER_UPGRADE_LEAVING_STATES:
        return f"GPU driver upgrade ({UPGRADE_STATE_LABEL}={state})"
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    if move_from_failing and labels.get(LABEL_READY) == "false":
        return "failing validation (rankops.io/gpu-ready=false)"
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") != "True":
        # Unknown: the node lifecycle controller saw no heartbeat for its grace period (a dead node).
        return f"not Ready (Ready={ready.get('status')}: {ready.get('reason') or 'no reason given'})"
    return None


@dataclass(frozen=True)
class StablePod:
    name: str
    node: str | None
    ready: bool
    deleting: bool
    leaving: str | None          # why its node is going (node_leaving), or None
    cost: str | None = None      # its pod-deletion-cost annotation


@dataclass(frozen=True)
class Moves:
    surge: int = 0                                   # replicas beyond the model's while it moves
    let_go: tuple[str, ...] = ()                     # pods to remove first (deletion cost lowered)
    message: str | None = None                       # what is moving and why, for status


def plan_moves(wanted: int, pods: Iterable[StablePod]) -> Moves:
    """The surge and the pods to let go, from the stable Deployment's pods now."""
    pods = [p for p in pods if not p.deleting]
    leaving = [p for p in pods if p.leaving]
    if not leaving:
        return Moves()
    staying_ready = sum(1 for p in pods if p.ready and not p.leaving)
    surge = len(leaving) if staying_ready < wanted else 0
    let_go = tuple(p.name for p in leaving if p.cost != LEAVING_COST)
    first = leaving[0]
    where = f"{first.name} on {first.node} ({first.leaving})" + (f" and {len(leaving) - 1} more" if len(leaving) > 1 else "")
    message = (f"moving {len(leaving)} replica(s) off leaving nodes: {where}; "
               + (f"{surge} replacement(s) surged, {staying_ready}/{wanted} Ready elsewhere"
                  if surge else f"{staying_ready}/{wanted} Ready elsewhere: letting the old ones go"))
    return Moves(surge=surge, let_go=let_go, message=message)


def pods_of(pods: Iterable[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any] | None],
            move_from_failing: bool = True) -> list[StablePod]:
    """StablePods of the pods listed, with their nodes as read (`nodes`: name -> Node or None)."""
    out = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = spec.get("nodeName")
        out.append(StablePod(meta.get("name", ""), node, pod_ready(pod), bool(meta.get("deletionTimestamp")),
                             node_leaving(nodes.get(node), move_from_failing) if node else None,
                             (meta.get("annotations") or {}).get(DELETION_COST)))
    return out


def shared_node(nodes: Iterable[tuple[str, int]], replicas: int, tolerance: int, required: bool) -> str | None:
    """What to say when one node holds more of the stable track's replicas than the model may
    lose (`planning.failureTolerance`): that node's loss takes the model below
    replicas - failureTolerance. `nodes`: (node, pods) of the scheduled stable pods."""
    counted = list(nodes)
    if not counted:
        return None
    node, most = max(counted, key=lambda n: (n[1], n[0]))
    if most <= tolerance:
        return None
    total = sum(count for _, count in counted)
    why = ("nodeSpread: required spreads them over the nodes that can take them, and only this one could"
           if required else "nodeSpread: preferred placed them where GPUs were free")
    return (f"{most} of {total} stable replicas run on node {node}: losing it leaves {total - most}, fewer than "
            f"replicas - failureTolerance = {max(0, replicas - tolerance)} ({why}; free a GPU on another node, "
            f"or add nodes to the pool)")
