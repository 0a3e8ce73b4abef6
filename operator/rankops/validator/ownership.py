"""Which pool, if any, may mark a node (pure; the validator and the pool status both ask).

A node is a GPU node when it has `nvidia.com/gpu` capacity: only those are validated into a pool
or tainted by one (a pool that selects every node leaves control-plane and CPU nodes alone).
When several pools select the same node, the oldest one (creationTimestamp, then name) owns it:
its validator marks the node; the others write nothing there and report the overlap. Pools
being deleted own nothing, so the next oldest takes over.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

GPU_RESOURCE = "nvidia.com/gpu"


def gpu_capacity(node: dict[str, Any]) -> int:
    value = str(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, "0"))
    return int(value) if value.isdigit() else 0


def has_gpus(node: dict[str, Any]) -> bool:
    return gpu_capacity(node) > 0


def selects(selector: dict[str, str] | None, labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def _age_key(pool: dict[str, Any]) -> tuple[str, str]:
    meta = pool.get("metadata") or {}
    return str(meta.get("creationTimestamp") or "~"), str(meta.get("name") or "")


def selecting_pools(node: dict[str, Any], pools: Iterable[dict[str, Any]]) -> list[str]:
    """Names of the live pools whose nodeSelector matches the node, oldest first (the owner first)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    live = [p for p in pools if not (p.get("metadata") or {}).get("deletionTimestamp")
            and selects((p.get("spec") or {}).get("nodeSelector"), labels)]
    return [p["metadata"]["name"] for p in sorted(live, key=_age_key)]


@dataclass(frozen=True)
class NodeClaim:
    """What a pool may do with one node its selector matches."""

    owned: bool                      # validate, label and (maybe) taint it
    reason: str | None = None        # why not: no GPUs, or the pool that owns it
    owner: str | None = None         # the older pool that marks it instead
    shared_with: tuple[str, ...] = ()   # the other pools that select it too
    no_gpus: bool = False            # no nvidia.com/gpu capacity: no pool's node


def claim(node: dict[str, Any], pool_name: str, pools: Iterable[dict[str, Any]]) -> NodeClaim:
    if not has_gpus(node):
        return NodeClaim(False, f"no {GPU_RESOURCE} capacity: not a GPU node, no pool validates or taints it",
                         no_gpus=True)
    selecting = selecting_pools(node, pools)
    others = tuple(n for n in selecting if n != pool_name)
    if pool_name not in selecting:
        return NodeClaim(False, f"GpuNodePool {pool_name} does not select it (being deleted, or its "
                                "nodeSelector no longer matches)", shared_with=others)
    if selecting[0] == pool_name:
        return NodeClaim(True, shared_with=others)
    return NodeClaim(False, f"the older GpuNodePool {selecting[0]} also selects it and validates it",
                     owner=selecting[0], shared_with=others)
