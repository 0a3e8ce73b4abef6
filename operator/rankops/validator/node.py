"""From a report to the node: labels, the report annotation, the optional NoSchedule taint.

`node_patch` is pure: it computes the merge patch for a node from the report and the node as it
is now. `run_on_node` is the thin shell the DaemonSet runs: validate, read own node, patch,
sleep, repeat. It needs RBAC for get and patch on its own node, and list on GpuNodePools (to
leave nodes without GPUs, and nodes an older pool owns, unmarked: see validator.ownership).
"""
from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Callable

from rankops.api.gpunodepool import NodeRequirements
from rankops.nodelabels import (LABEL_READY, LABEL_POOL, LABEL_DRIVER, LABEL_CUDA, LABEL_OS, LABEL_DRIVER_BRANCH, LABEL_DRIVER_MINOR, LABEL_LATENCY_TUNED, LABEL_TOPOLOGY_ALIGNED, ANNOTATION_REPORT, TAINT_KEY, TAINT_EFFECT, VALIDATION_LABELS, label_value)
from rankops.validator import gpu as gpu_facts
from rankops.validator import heartbeat, latency
from rankops.validator.host import HostView
from rankops.validator.ownership import NodeClaim, claim
from rankops.validator.report import Report, validate_host

# (connect, read) seconds of each API call: a call that hangs must not hang the loop (the liveness
# probe would restart it, but only after three intervals).
API_TIMEOUT = (5, 30)
ANNOTATION_LIMIT = 200_000  # the API server allows 256 KiB for all annotations together
NOT_OWNED = 3   # run_on_node's exit status on a node its pool does not own

log = logging.getLogger("rankops.validator")


def driver_number_labels(driver_version: str | None) -> dict[str, str | None]:
    """'535.104.05' -> branch '535', minor '104'; both None (removed) for anything else."""
    match = re.fullmatch(r"(\d{3,4})\.(\d{1,3})(?:\.\d{1,3})?", driver_version or "")
    branch, minor = (str(int(match.group(1))), str(int(match.group(2)))) if match else (None, None)
    return {LABEL_DRIVER_BRANCH: branch, LABEL_DRIVER_MINOR: minor}


def _annotation(report: Report) -> str:
    text = report.to_json(compact=True)
    if len(text) <= ANNOTATION_LIMIT:
        return text
    # Never expected (a report is a few KiB), but a too-large annotation would fail the whole patch.
    slim = report.to_dict(compact=True)
    slim["checks"] = [check for check in slim["checks"] if check["status"] != "pass"]
    slim["truncated"] = True
    return json.dumps(slim, separators=(",", ":"))[:ANNOTATION_LIMIT]


def node_patch(report: Report, pool_name: str, taint_failing: bool, node: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that makes `node` show `report`. Labels with no value are removed (null);
    the taint list is only sent when it changes, with the node's resourceVersion so a concurrent
    taint change elsewhere makes the patch fail (409) instead of being overwritten."""
    labels = {
        LABEL_READY: "true" if report.ready else "false",
        LABEL_POOL: label_value(pool_name),
        LABEL_DRIVER: label_value(report.driver_version),
        LABEL_CUDA: label_value(report.cuda_version),
        LABEL_OS: label_value(report.os),
        **driver_number_labels(report.driver_version),
        LABEL_LATENCY_TUNED: latency.label_value(report.checks, latency.LATENCY_TUNED_CHECKS),
        LABEL_TOPOLOGY_ALIGNED: latency.label_value(report.checks, latency.TOPOLOGY_ALIGNED_CHECKS),
    }
    patch: dict[str, Any] = {"metadata": {"labels": labels, "annotations": {ANNOTATION_REPORT: _annotation(report)}}}
    current = list((node.get("spec") or {}).get("taints") or [])
    ours = [t for t in current if _is_our_taint(t)]
    want_taint = taint_failing and not report.ready
    if len(ours) != (1 if want_taint else 0):
        others = [t for t in current if t not in ours]
        taint = {"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT}
        patch["spec"] = {"taints": others + ([taint] if want_taint else [])}
        version = (node.get("metadata") or {}).get("resourceVersion")
        if version:
            patch["metadata"]["resourceVersion"] = version
    return patch


def _is_our_taint(taint: dict[str, Any]) -> bool:
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT_EFFECT


def clear_marks_patch(node: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that removes every validation mark from `node` (its pool was deleted):
    the labels and the report annotation it carries become null, and the taint list, only when it
    holds the rankops taint, is sent without it and otherwise exactly as it is (a merge patch
    replaces the whole list). The patch carries the node's resourceVersion: if the node changed
    since it was read (another pool's validator re-labelled it, a taint moved), it fails with 409
    instead of wiping marks that are no longer the deleted pool's. Empty when there is no mark."""
    meta = node.get("metadata") or {}
    labels = {key: None for key in VALIDATION_LABELS if key in (meta.get("labels") or {})}
    annotations = {ANNOTATION_REPORT: None} if ANNOTATION_REPORT in (meta.get("annotations") or {}) else {}
    current = list((node.get("spec") or {}).get("taints") or [])
    others = [t for t in current if not _is_our_taint(t)]
    patch: dict[str, Any] = {}
    if labels:
        patch.setdefault("metadata", {})["labels"] = labels
    if annotations:
        patch.setdefault("metadata", {})["annotations"] = annotations
    if len(others) != len(current):
        patch["spec"] = {"taints": others}
    if patch and meta.get("resourceVersion"):
        patch.setdefault("metadata", {})["resourceVersion"] = meta["resourceVersion"]
    return patch


def release_patch(node: dict[str, Any], pool_name: str) -> dict[str, Any]:
    """What a validator writes on a node its pool does not own (no GPUs, or an older pool owns it):
    the marks it may have left (labels, report, taint) removed, nothing of another pool's touched."""
    value = ((node.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL)
    if value is not None and value != label_value(pool_name):
        return {}
    return clear_marks_patch(node)


def load_core_api():
    """A CoreV1Api from the in-cluster service account, else from KUBECONFIG / ~/.kube/config."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def list_pools(api) -> list[dict[str, Any]]:
    """Every GpuNodePool, through the same credentials as `api` (a CoreV1Api)."""
    from kubernetes import client

    found = client.CustomObjectsApi(api.api_client).list_cluster_custom_object("rankops.io", "v1alpha1",
                                                                               "gpunodepools",
                                                                               _request_timeout=API_TIMEOUT)
    return list(found.get("items") or [])


def validate_and_patch(api, node_name: str, host: HostView, requirements: NodeRequirements, pool: str,
                       taint_failing: bool, nvidia_smi_xml: str | None, use_nvml: bool,
                       pools: Callable[[], list[dict[str, Any]]] | None = None) -> tuple[Report | None, NodeClaim]:
    """Validate the host and mark its node, when the pool owns the node (it has GPUs, and no older
    pool selects it); otherwise only remove this pool's marks from it. `pools` lists the
    GpuNodePools (default: from the API). The report is None when the pool does not own the node."""
    all_pools = (pools or (lambda: list_pools(api)))()
    report = None
    for attempt in range(3):  # a 409 means the node's taints moved under us: re-read and retry
        node = api.read_node(node_name, _request_timeout=API_TIMEOUT)
        node_dict = node if isinstance(node, dict) else api.api_client.sanitize_for_serialization(node)
        node_claim = claim(node_dict, pool, all_pools)
        if node_claim.owned:
            if report is None:
                facts = gpu_facts.gather(host, nvidia_smi_xml, use_nvml=use_nvml)
                report = validate_host(host, requirements, facts, node=node_name, pool=pool)
            patch = node_patch(report, pool, taint_failing, node_dict)
        else:
            report, patch = None, release_patch(node_dict, pool)
        try:
            if patch:
                api.patch_node(node_name, patch, _request_timeout=API_TIMEOUT)
            break
        except Exception as exc:
            if getattr(exc, "status", None) == 409 and attempt < 2:
                continue
            raise
    return report, node_claim


def run_on_node(node_name: str, host_root: str, pool: str, interval: int, once: bool = False, *,
                requirements: NodeRequirements | None = None, taint_failing: bool = False,
                nvidia_smi_xml: str | None = None, use_nvml: bool = True, api=None,
                sleep: Callable[[float], None] = time.sleep,
                on_report: Callable[[Report], None] | None = None,
                pools: Callable[[], list[dict[str, Any]]] | None = None,
                heartbeat_file: str | None = None) -> int:
    """Validate the host under `host_root` and write the verdict onto node `node_name`, every
    `interval` seconds (or once). Returns 0 when the (last) report is ready, 1 when not, 2 when the
    node could not be patched on a one-shot run, 3 (NOT_OWNED) when the pool does not own the node
    (no GPUs, or an older pool selects it: see validator.ownership). `api` defaults to a CoreV1Api
    from the in-cluster config or KUBECONFIG, so a test process can point it at any cluster;
    `pools` lists the GpuNodePools (default: through `api`). `heartbeat_file` is touched at the
    start and after each round, done or failed (the DaemonSet's liveness probe reads its age:
    validator.heartbeat): only a round that never ends lets it age."""
    requirements = requirements or NodeRequirements()
    host = HostView(host_root)
    api = api or load_core_api()
    if heartbeat_file:
        heartbeat.touch(heartbeat_file)
    while True:
        try:
            report, node_claim = validate_and_patch(api, node_name, host, requirements, pool, taint_failing,
                                                    nvidia_smi_xml, use_nvml, pools)
            if report is None:
                log.info("node %s: not marked for pool %s: %s", node_name, pool, node_claim.reason)
                status = NOT_OWNED
            else:
                if on_report:
                    on_report(report)
                blocking = ", ".join(check.id for check in report.blocking) or "none"
                log.info("node %s: %s (blocking: %s)", node_name, "ready" if report.ready else "not ready", blocking)
                status = 0 if report.ready else 1
        except Exception as exc:  # the API may be briefly away; the loop must outlive that
            log.error("node %s: could not record the validation: %s", node_name, exc)
            status = 2
        if heartbeat_file:
            heartbeat.touch(heartbeat_file)
        if once:
            return status
        sleep(interval)
