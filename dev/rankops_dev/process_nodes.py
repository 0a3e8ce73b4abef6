"""Start and stop process nodes (nodes whose pods really run, see pod_runner.py) beside kwok's.

`ProcessNode` runs the pod runner as its own process, so a test's crash cannot leave pods half
run and the runner's threads stay out of the test's way; `pinned_namespace` is the namespace
manifest whose pods the admission plugins send to the process nodes only (the local control
plane enables PodNodeSelector and PodTolerationRestriction).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rankops_dev.controlplane import _die_with_parent, tail, terminate
from rankops_dev.pod_runner import PROCESS_NODE_LABEL, PROCESS_NODE_TAINT


def pinned_namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A namespace whose pods land only on process nodes (and tolerate their taint)."""
    toleration = {"key": PROCESS_NODE_TAINT["key"], "operator": "Equal", "value": PROCESS_NODE_TAINT["value"],
                  "effect": PROCESS_NODE_TAINT["effect"]}
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}, "annotations": {
                "scheduler.alpha.kubernetes.io/node-selector": f"{PROCESS_NODE_LABEL}=true",
                "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps([toleration])}}}


class ProcessNode:
    def __init__(self, kubeconfig: str | Path, name: str, work_dir: Path, *, host_root: Path | None = None,
                 taints: list[str] | None = None, labels: dict[str, str] | None = None, gpus: int = 4,
                 address_block: str = "127.77.0.0/16") -> None:
        self.kubeconfig, self.name, self.work_dir = str(kubeconfig), name, Path(work_dir)
        # KEY=VALUE:EFFECT; None: the process-node taint that only pinned namespaces tolerate.
        self.host_root, self.taints, self.labels, self.gpus = host_root, taints, labels or {}, gpus
        self.address_block = address_block
        self.process: subprocess.Popen | None = None
        self.log_path = self.work_dir / "pod-runner.log"

    def start(self, timeout: float = 60.0) -> "ProcessNode":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "rankops_dev.pod_runner", "--kubeconfig", self.kubeconfig,
                "--node", self.name, "--work-dir", str(self.work_dir), "--gpus", str(self.gpus),
                "--address-block", self.address_block,
                *(["--host-root", str(self.host_root)] if self.host_root else []),
                *(arg for taint in self.taints or () for arg in ("--taint", taint)),
                *(arg for key, value in self.labels.items() for arg in ("--label", f"{key}={value}"))]
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=_die_with_parent)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=self.kubeconfig)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    node = client.CoreV1Api(api).read_node(self.name)
                    if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
                        return
                except client.exceptions.ApiException:
                    pass
                time.sleep(0.3)
            raise RuntimeError(f"process node {self.name} not Ready after {timeout:.0f}s; "
                               f"log {self.log_path}:\n{tail(self.log_path)}")
        finally:
            api.close()

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the pod runner of {self.name} exited with {self.process.returncode}; "
                               f"log {self.log_path}:\n{tail(self.log_path)}")

    def stop(self) -> None:
        terminate(self.process, 40)  # the runner stops its pods first

    def kill(self) -> None:
        """The machine dies: the runner and its pods' processes are killed at once, nothing is
        reported (no status, no lease renewal, no preStop hook); the API server keeps the Node
        until the node lifecycle controller marks it after its grace period."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)   # its session: the runner and what it started
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)

    def pod_logs(self, namespace: str, pod: str) -> dict[str, str]:
        """container name -> log text, for every run of a pod of that name on this node."""
        found: dict[str, str] = {}
        for directory in sorted((self.work_dir / "pods").glob(f"{namespace}_{pod}_*")):
            for path in sorted((directory / "logs").glob("*.log")):
                found[path.stem] = found.get(path.stem, "") + path.read_text(errors="replace")
        return found

    def all_logs(self, namespace: str | None = None, lines: int = 60) -> str:
        """The last lines of every container log (of one namespace), for a failing test's report."""
        parts = []
        pattern = f"{namespace}_*" if namespace else "*"
        for directory in sorted((self.work_dir / "pods").glob(pattern)):
            for path in sorted((directory / "logs").glob("*.log")):
                parts.append(f"=== {directory.name}/{path.name}\n{tail(path, lines)}")
        return "\n".join(parts) or "(no pod logs)"

    def __enter__(self) -> "ProcessNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
