"""The validator DaemonSet's work on simulated nodes.

kwok schedules a GpuNodePool's validator pods onto its nodes and marks them Running, but runs no
container. This module does what each container would: it takes the pod's own command line (as
the operator rendered it), runs the validator's code path once (`run_on_node`) against a sample
host tree instead of the node's `/` and the sample `nvidia-smi -q -x` instead of NVML (none where
the scenario's driver would not answer), and patches the pod's node with a token bound to that
pod (the identity the kubelet would mount).
Only the host is simulated: requirements, pool name, taint flag, RBAC and admission are real.
The sample hosts are g4dn/Tesla T4 machines, so simulate T4 pools.

`plan_runs` is pure (pods and a node -> scenario map in, one run per node out); `run_validators`
is the thin shell around it.
"""
from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankops.validator.node import NOT_OWNED
from rankops.validator.report import Report
from rankops_dev.operator_process import RELEASE_NAMESPACE
from rankops_dev import sample_hosts

HEALTHY = "healthy-rhel89"
CONTAINER = "validator"
TOKEN_SECONDS = 600  # the shortest bound token the API server issues


@dataclass(frozen=True)
class ValidatorRun:
    """One validator pod's work: its node, the host scenario standing in for that node, the pod."""

    node: str
    scenario: str
    pod: str
    pod_uid: str
    service_account: str
    args: tuple[str, ...]  # the container's args, e.g. ("validate-node", "--host-root", "/host", ...)


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    scenario: str
    exit_code: int  # run_on_node's: 0 ready, 1 not ready, 2 the node could not be patched, 3 not the pool's
    report: Report | None  # None when validation or the patch failed before a report existed, or not the pool's

    @property
    def summary(self) -> str:
        if self.report is None and self.exit_code == NOT_OWNED:
            return f"{self.node} [{self.scenario}]: left unmarked (no GPUs, or an older pool owns it)"
        if self.report is None:
            return f"{self.node} [{self.scenario}]: could not record the validation (exit {self.exit_code})"
        if self.report.ready:
            return f"{self.node} [{self.scenario}]: ready"
        blocking = ", ".join(check.id for check in self.report.blocking)
        return f"{self.node} [{self.scenario}]: NOT ready (blocking: {blocking})"


def plan_runs(pods: list[dict[str, Any]], scenarios: Mapping[str, str],
              default: str = HEALTHY, real_nodes: Collection[str] = ()) -> list[ValidatorRun]:
    """One run per live, scheduled validator pod, in node order. `scenarios` maps node names to
    sample host scenarios; other nodes get `default`; `real_nodes` (real nodes, whose
    validator pods really run) are left out. Naming a node that has no validator pod, or an
    unknown scenario, is a ValueError: the caller meant a node the pool does not cover."""
    unknown = sorted({default, *scenarios.values()} - set(sample_hosts.SCENARIOS))
    if unknown:
        raise ValueError(f"unknown host scenario(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sample_hosts.SCENARIOS)}")
    runs: dict[str, ValidatorRun] = {}
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or meta.get("deletionTimestamp") or node in real_nodes:
            continue
        container = next((c for c in spec.get("containers") or [] if c.get("name") == CONTAINER), None)
        if container is None:
            raise ValueError(f"pod {meta.get('name')} has no container {CONTAINER!r}")
        if node in runs:
            raise ValueError(f"two live validator pods on node {node}: {runs[node].pod}, {meta.get('name')}")
        runs[node] = ValidatorRun(node, scenarios.get(node, default), meta["name"], meta["uid"],
                                  spec.get("serviceAccountName") or "default", tuple(container.get("args") or ()))
    missing = sorted(set(scenarios) - set(runs))
    if missing:
        raise ValueError(f"no validator pod on node(s) {', '.join(missing)} (validator pods run on "
                         f"{', '.join(sorted(runs)) or 'no node'}): does the pool's nodeSelector match them?")
    return [runs[node] for node in sorted(runs)]


def rollout_complete(daemonset: dict[str, Any]) -> bool:
    """Every selected node runs a pod of the DaemonSet's current template (so pod args are current)."""
    status = daemonset.get("status") or {}
    desired = status.get("desiredNumberScheduled", 0)
    return (status.get("observedGeneration", 0) >= (daemonset.get("metadata") or {}).get("generation", 0)
            and status.get("updatedNumberScheduled", 0) == desired
            and status.get("currentNumberScheduled", 0) == desired
            and status.get("numberAvailable", 0) == desired)


def validator_arguments(args: tuple[str, ...]) -> argparse.Namespace:
    """The container's args parsed by `rankops validate-node`'s own parser (an unknown or malformed
    flag fails here as it would in the pod)."""
    from rankops.commands import validate_node as validator_cli

    parser = argparse.ArgumentParser(prog="rankops")
    validator_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    try:
        parsed = parser.parse_args(list(args))
    except SystemExit:  # argparse has printed why
        raise ValueError(f"the validator would refuse its command line: {' '.join(args)}") from None
    if parsed.command != "validate-node" or not parsed.patch_node:
        raise ValueError(f"not a node-patching validator command line: {' '.join(args)}")
    if parsed.pool:
        raise ValueError("the DaemonSet passes --requirements; --pool FILE is not simulated")
    return parsed


# --- the shell -------------------------------------------------------------------------------

def pod_client(admin: Any, run: ValidatorRun, namespace: str) -> Any:
    """An ApiClient authenticated as the pod: a ServiceAccount token bound to the pod, which
    carries the pod's node name the way the kubelet-mounted token does."""
    from kubernetes import client

    request = {"spec": {"expirationSeconds": TOKEN_SECONDS, "boundObjectRef": {
        "apiVersion": "v1", "kind": "Pod", "name": run.pod, "uid": run.pod_uid}}}
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        run.service_account, namespace, request).status.token
    config = copy.deepcopy(admin.configuration)
    config.cert_file = config.key_file = None  # not the admin's identity
    config.username = config.password = None
    config.refresh_api_key_hook = None
    config.api_key = {"authorization": f"Bearer {token}"}
    config.api_key_prefix = {}
    return client.ApiClient(config)


def wait_for_pods(admin: Any, name: str, namespace: str, timeout: float) -> list[dict[str, Any]]:
    """The live pods of validator DaemonSet `namespace/name`, once its rollout is complete."""
    from kubernetes import client

    apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
    deadline = time.monotonic() + timeout
    state = "not found"
    while True:
        try:
            daemonset = admin.sanitize_for_serialization(apps.read_namespaced_daemon_set(name, namespace))
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
            daemonset = None
        if daemonset is not None:
            status = daemonset.get("status") or {}
            state = (f"{status.get('updatedNumberScheduled', 0)} updated, {status.get('numberAvailable', 0)} "
                     f"available of {status.get('desiredNumberScheduled', 0)}")
            if rollout_complete(daemonset):
                selector = ",".join(f"{k}={v}" for k, v in daemonset["spec"]["selector"]["matchLabels"].items())
                pods = [admin.sanitize_for_serialization(p)
                        for p in core.list_namespaced_pod(namespace, label_selector=selector).items]
                live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
                if len(live) == status.get("desiredNumberScheduled", 0):  # old pods gone too
                    return live
        if time.monotonic() > deadline:
            raise TimeoutError(f"validator DaemonSet {namespace}/{name} not rolled out after {timeout:.0f}s ({state})")
        time.sleep(0.3)


def run_validators(kubeconfig: str | Path, pool: str, scenarios: Mapping[str, str] | None = None, *,
                   default: str = HEALTHY, namespace: str = RELEASE_NAMESPACE,
                   work_dir: str | Path | None = None, timeout: float = 60.0,
                   real_nodes: Collection[str] = ()) -> list[NodeVerdict]:
    """Run GpuNodePool `pool`'s validator once on every node its DaemonSet covers, each node's host
    being the sample tree `scenarios[node]` (else `default`). Waits for the DaemonSet's rollout
    first. `kubeconfig` needs to read the DaemonSet and pods and to mint tokens for the
    validator's ServiceAccount; the node patches go out as the pods themselves."""
    from kubernetes import client

    from rankops.api.gpunodepool import NodeRequirements
    from rankops.validator.daemonset import validator_name
    from rankops.validator.node import run_on_node
    from rankops_dev.cluster import api_client

    admin = api_client(kubeconfig)
    scratch = None if work_dir else tempfile.TemporaryDirectory(prefix="rankops-hosts-")
    root = Path(work_dir or scratch.name)
    try:
        pods = wait_for_pods(admin, validator_name(pool), namespace, timeout)
        verdicts = []
        for run in plan_runs(pods, scenarios or {}, default, real_nodes):
            args = validator_arguments(run.args)
            requirements = (NodeRequirements.model_validate(json.loads(args.requirements))
                            if args.requirements else NodeRequirements())
            host = sample_hosts.build(run.scenario, root / run.node)
            xml = sample_hosts.nvidia_smi_xml(run.scenario)  # what the pod's NVML would have said
            reports: list[Report] = []
            pod_api = pod_client(admin, run, namespace)
            try:
                code = run_on_node(run.node, str(host), args.pool_name or "", args.interval, once=True,
                                   requirements=requirements, taint_failing=args.taint_failing_nodes,
                                   nvidia_smi_xml=xml and str(xml),
                                   # The GPU is simulated: never ask this machine's NVML about its own.
                                   use_nvml=False,
                                   api=client.CoreV1Api(pod_api), on_report=reports.append)
            finally:
                pod_api.close()
            verdicts.append(NodeVerdict(run.node, run.scenario, code, reports[-1] if reports else None))
        return verdicts
    finally:
        admin.close()
        if scratch is not None:
            scratch.cleanup()
