"""A pool's status from its nodes' labels and report annotations (pure; the operator lists the nodes).

A node counts as ready or failing only when its report was made for this pool against the pool's
current requirements; otherwise it is pending (the validator has not run yet, or ran before the
requirements changed). Nodes whose report annotation is garbled are pending too, never ready.
"""
from __future__ import annotations

import json
from typing import Any

from rankops.api.gpunodepool import GpuNodePool
from rankops.validator.node import ANNOTATION_REPORT, LABEL_POOL, LABEL_READY, label_value
from rankops.validator.report import requirements_digest

MAX_LISTED_NODES = 20  # per failing check, to keep the status object small on big pools


def _node_verdict(node: dict[str, Any], pool_name: str, digest: str) -> tuple[str, list[str]]:
    """('ready' | 'failing' | 'pending', ids of the checks that block it)."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if labels.get(LABEL_POOL) != label_value(pool_name) or LABEL_READY not in labels:
        return "pending", []
    try:
        report = json.loads((metadata.get("annotations") or {}).get(ANNOTATION_REPORT, ""))
    except (TypeError, ValueError):
        return "pending", []
    if not isinstance(report, dict) or report.get("requirementsDigest") != digest:
        return "pending", []
    if labels[LABEL_READY] == "true" and report.get("ready") is True:
        return "ready", []
    blocking = report.get("blocking")
    if not isinstance(blocking, list):
        blocking = [check.get("id") for check in report.get("checks", [])
                    if isinstance(check, dict) and check.get("required") and check.get("status") in ("fail", "unknown")]
    return "failing", [str(check) for check in blocking if check] or ["unknown"]


def aggregate_pool_status(pool: GpuNodePool, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts for the pool's status: nodes, ready, failing, pending, failingByCheck (camelCase,
    ready to merge into .status). `nodes` are the nodes the pool's selector matches, as dicts."""
    digest = requirements_digest(pool.spec.requirements)
    counts = {"ready": 0, "failing": 0, "pending": 0}
    by_check: dict[str, list[str]] = {}
    for node in nodes:
        verdict, blocking = _node_verdict(node, pool.name, digest)
        counts[verdict] += 1
        name = str((node.get("metadata") or {}).get("name", "?"))
        for check in blocking:
            by_check.setdefault(check, []).append(name)
    failing_by_check = [
        {"check": check, "count": len(names), "nodes": sorted(names)[:MAX_LISTED_NODES]}
        for check, names in sorted(by_check.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
    return {"nodes": len(nodes), **counts, "failingByCheck": failing_by_check}


def pool_conditions(summary: dict[str, Any], previous: list[dict[str, Any]], generation: int | None,
                    now: str) -> list[dict[str, Any]]:
    """Ready and Degraded conditions for the summary; lastTransitionTime moves only when a
    condition's status flips. `now` is an RFC 3339 timestamp."""
    nodes, ready, failing, pending = (summary[k] for k in ("nodes", "ready", "failing", "pending"))
    checks = ", ".join(f"{entry['check']} ({entry['count']})" for entry in summary.get("failingByCheck", []))
    if nodes == 0:
        ready_cond = ("False", "NoNodesMatched", "No node matches the pool's nodeSelector.")
    elif ready > 0:
        ready_cond = ("True", "NodesReady", f"{ready} of {nodes} nodes passed validation.")
    elif failing > 0:
        ready_cond = ("False", "NoReadyNodes", f"No node passed validation; failing checks: {checks}.")
    else:
        ready_cond = ("Unknown", "ValidationPending", f"Waiting for the validator on {pending} nodes.")
    if failing > 0:
        degraded = ("True", "NodesFailing", f"{failing} of {nodes} nodes fail validation: {checks}.")
    else:
        degraded = ("False", "NoFailingNodes", "No node fails validation.")
    old = {cond.get("type"): cond for cond in previous}
    conditions = []
    for kind, (status, reason, message) in (("Ready", ready_cond), ("Degraded", degraded)):
        before = old.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == status else None
        conditions.append({"type": kind, "status": status, "reason": reason, "message": message,
                           "lastTransitionTime": since or now, "observedGeneration": generation})
    return conditions
