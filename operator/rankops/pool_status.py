"""A GpuNodePool's status from its nodes' labels and report annotations, beside the model's
(model_status.py); pure: the operator lists the nodes, api.gpunodepool.GpuNodePoolStatus types it.

A node counts as ready or failing only when its report was made for this pool against the pool's
current requirements; otherwise it is pending (the validator has not run yet, or ran before the
requirements changed). Nodes whose report annotation is garbled are pending too, never ready.
A report older than STALE_INTERVALS of the pool's validator intervals (its generatedAt) is stale:
the validator stopped reporting (stuck, gone, its node unreachable), so its verdict, ready or not,
no longer stands; the node counts as failing with the check `stale`.
Nodes the selector matches but the pool does not own (no GPUs, or an older pool selects them too:
validator.ownership) are not counted but excluded, and named in the NodesWithoutGpus and
Overlapping conditions.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from rankops.api.conditions import Condition
from rankops.api.gpunodepool import GpuNodePool, GpuNodePoolStatus
from rankops.triton.image_fit import newest_release
from rankops.nodelabels import ANNOTATION_REPORT, LABEL_DRIVER, LABEL_LATENCY_TUNED, LABEL_POOL, LABEL_READY, LABEL_TOPOLOGY_ALIGNED, label_value
from rankops.validator.ownership import NodeClaim, claim
from rankops.validator.report import requirements_digest

MAX_LISTED_NODES = 20  # per failing check, to keep the status object small on big pools
STALE_INTERVALS = 3    # as the validator's liveness probe (validator.daemonset.HEARTBEAT_INTERVALS)
STALE = "stale"        # the failingByCheck entry of nodes whose report is stale


def _generated_at(report: dict[str, Any]) -> datetime | None:
    try:
        return datetime.strptime(str(report.get("generatedAt")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _node_verdict(node: dict[str, Any], pool_name: str, digest: str,
                  stale_before: datetime | None = None) -> tuple[str, list[str]]:
    """('ready' | 'failing' | 'stale' | 'pending', ids of the checks that block it). `stale_before`:
    a report made before then (or with no time) is stale."""
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
    if stale_before is not None:
        made = _generated_at(report)
        if made is None or made < stale_before:
            return STALE, [STALE]
    if labels[LABEL_READY] == "true" and report.get("ready") is True:
        return "ready", []
    blocking = report.get("blocking")
    if not isinstance(blocking, list):
        blocking = [check.get("id") for check in report.get("checks", [])
                    if isinstance(check, dict) and check.get("required") and check.get("status") in ("fail", "unknown")]
    return "failing", [str(check) for check in blocking if check] or ["unknown"]


def _name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", "?"))


def node_claims(pool: GpuNodePool, nodes: list[dict[str, Any]],
                pools: list[dict[str, Any]] | None = None) -> dict[str, NodeClaim]:
    """What the pool may do with each node its selector matches; `pools`: every GpuNodePool (as
    dicts). The pool itself counts as live here, even while it is being deleted."""
    own = {"metadata": {k: v for k, v in pool.metadata.items() if k != "deletionTimestamp"},
           "spec": {"nodeSelector": dict(pool.spec.node_selector)}}
    others = [p for p in pools or [] if (p.get("metadata") or {}).get("name") != pool.name]
    return {_name(node): claim(node, pool.name, [own, *others]) for node in nodes}


def stale_before(pool: GpuNodePool, now: datetime) -> datetime:
    """Reports made before this are stale (STALE_INTERVALS of the pool's validator interval)."""
    return now - timedelta(seconds=STALE_INTERVALS * pool.spec.validator.interval_seconds)


def seconds_until_stale(pool: GpuNodePool, nodes: list[dict[str, Any]], now: datetime) -> float | None:
    """Seconds until the first report of these nodes that is fresh now turns stale (None: none is),
    so the pool is reconciled then rather than at its next resync."""
    digest = requirements_digest(pool.spec.requirements)
    before = stale_before(pool, now)
    made = []
    for node in nodes:
        if _node_verdict(node, pool.name, digest, before)[0] in ("ready", "failing"):
            report = json.loads(((node.get("metadata") or {}).get("annotations") or {})[ANNOTATION_REPORT])
            made.append(_generated_at(report))
    soonest = min((m for m in made if m is not None), default=None)
    return None if soonest is None else max(1.0, (soonest - before).total_seconds())


def aggregate_pool_status(pool: GpuNodePool, nodes: list[dict[str, Any]],
                          claims: dict[str, NodeClaim] | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Counts for the pool's status: nodes, ready, failing, pending, excluded, failingByCheck
    (camelCase, ready to merge into .status). `nodes` are the nodes the pool's selector matches,
    as dicts; `claims` (node_claims) leaves out those the pool does not own; with `now`, a node
    whose report is stale counts as failing, under the check `stale`."""
    digest = requirements_digest(pool.spec.requirements)
    before = stale_before(pool, now) if now is not None else None
    counts = {"ready": 0, "failing": 0, "pending": 0}
    drivers: set[str] = set()
    by_check: dict[str, list[str]] = {}
    tuned = {LABEL_LATENCY_TUNED: 0, LABEL_TOPOLOGY_ALIGNED: 0}  # `kubectl get gnp`'s Tuned and Aligned
    owned = [n for n in nodes if claims is None or claims[_name(n)].owned]
    for node in owned:
        verdict, blocking = _node_verdict(node, pool.name, digest, before)
        counts["failing" if verdict == STALE else verdict] += 1
        driver = ((node.get("metadata") or {}).get("labels") or {}).get(LABEL_DRIVER)
        if verdict == "ready" and driver:
            drivers.add(driver)
        labels = (node.get("metadata") or {}).get("labels") or {}
        for label in tuned:
            tuned[label] += verdict in ("ready", "failing") and labels.get(label) == "true"
        name = str((node.get("metadata") or {}).get("name", "?"))
        for check in blocking:
            by_check.setdefault(check, []).append(name)
    failing_by_check = [
        {"check": check, "count": len(names), "nodes": sorted(names)[:MAX_LISTED_NODES]}
        for check, names in sorted(by_check.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
    # What `kubectl get gnp` shows of the drivers: a model whose Triton release is newer than
    # newestTriton cannot land on every ready node (triton.image_fit).
    ordered = sorted(drivers, key=lambda d: [int(p) if p.isdigit() else 0 for p in d.split(".")])
    return {"nodes": len(owned), **counts, "excluded": len(nodes) - len(owned), "failingByCheck": failing_by_check,
            "driverVersions": ", ".join(ordered) or None, "newestTriton": newest_release(ordered),
            "latencyTuned": tuned[LABEL_LATENCY_TUNED], "topologyAligned": tuned[LABEL_TOPOLOGY_ALIGNED]}


def _listed(names: list[str]) -> str:
    names = sorted(names)
    more = len(names) - MAX_LISTED_NODES
    return ", ".join(names[:MAX_LISTED_NODES]) + (f" and {more} more" if more > 0 else "")


def exclusion_conditions(claims: dict[str, NodeClaim]) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) of NodesWithoutGpus and Overlapping for these claims."""
    no_gpus = [node for node, c in claims.items() if c.no_gpus]
    if no_gpus:
        without = ("NodesWithoutGpus", "True", "NoGpuCapacity",
                   f"{_listed(no_gpus)}: no nvidia.com/gpu capacity, so this pool neither validates nor taints "
                   f"{'them' if len(no_gpus) > 1 else 'it'}; narrow spec.nodeSelector to GPU nodes.")
    else:
        without = ("NodesWithoutGpus", "False", "AllNodesHaveGpus", "Every selected node has nvidia.com/gpu capacity.")
    lost: dict[str, list[str]] = {}     # owner -> nodes it validates instead of this pool
    kept: dict[str, list[str]] = {}     # younger pool -> nodes this pool keeps
    for node, c in claims.items():
        if c.owner:
            lost.setdefault(c.owner, []).append(node)
        elif c.owned:
            for other in c.shared_with:
                kept.setdefault(other, []).append(node)
    parts = [f"GpuNodePool {other} (older) also selects {_listed(nodes)} and validates "
             f"{'them' if len(nodes) > 1 else 'it'}: not counted here" for other, nodes in sorted(lost.items())]
    parts += [f"GpuNodePool {other} (newer) also selects {_listed(nodes)}: this pool validates "
              f"{'them' if len(nodes) > 1 else 'it'}" for other, nodes in sorted(kept.items())]
    if parts:
        overlap = ("Overlapping", "True", "SharesNodesWithOlderPool" if lost else "SharesNodesWithNewerPool",
                   "; ".join(parts) + ". The oldest pool selecting a node owns it; make the nodeSelectors disjoint.")
    else:
        overlap = ("Overlapping", "False", "NoOverlap", "No other pool selects this pool's nodes.")
    return [without, overlap]


def pool_conditions(summary: dict[str, Any], previous: list[Condition], generation: int | None,
                    now: str, claims: dict[str, NodeClaim] | None = None) -> list[Condition]:
    """Ready and Degraded conditions for the summary, and with `claims` NodesWithoutGpus and
    Overlapping; lastTransitionTime moves only when a condition's status flips. `now` is an
    RFC 3339 timestamp."""
    nodes, ready, failing, pending = (summary[k] for k in ("nodes", "ready", "failing", "pending"))
    checks = ", ".join(f"{entry['check']} ({entry['count']})" for entry in summary.get("failingByCheck", []))
    if nodes == 0 and summary.get("excluded"):
        ready_cond = ("False", "NoNodesOwned", f"The nodeSelector matches {summary['excluded']} nodes, none of "
                      "them this pool's to validate (see the NodesWithoutGpus and Overlapping conditions).")
    elif nodes == 0:
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
    old = {cond.type: cond for cond in previous}
    conditions = []
    wanted = [("Ready", ready_cond), ("Degraded", degraded)]
    wanted += [(kind, rest) for kind, *rest in exclusion_conditions(claims)] if claims is not None else []
    for kind, (status, reason, message) in wanted:
        before = old.get(kind)
        since = before.last_transition_time if before and before.status == status else None
        conditions.append(Condition(type=kind, status=status, reason=reason, message=message,
                                    last_transition_time=since or now, observed_generation=generation))
    return conditions


def pool_status(pool: GpuNodePool, nodes: list[dict[str, Any]], claims: dict[str, NodeClaim] | None,
                previous: GpuNodePoolStatus, generation: int | None, now: str) -> GpuNodePoolStatus:
    """The pool's status: its nodes' counts (aggregate_pool_status) and its conditions."""
    summary = aggregate_pool_status(pool, nodes, claims, _generated_at({"generatedAt": now}))
    return GpuNodePoolStatus.model_validate({
        **summary, "observedGeneration": generation,
        "conditions": pool_conditions(summary, previous.conditions, generation, now, claims)})
