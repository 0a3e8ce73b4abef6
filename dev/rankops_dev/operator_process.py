"""The operator as a local process against a cluster, for the e2e suite and `rankops dev demo`.

`install_chart` installs the Helm chart (CRDs, RBAC, admission policies) and scales its own
Deployment to zero; `service_account_kubeconfig` mints a token for the chart's ServiceAccount,
so the local operator runs with exactly the chart's RBAC; `OperatorProcess` starts
`rankops run`, waits for its liveness endpoint, and stops or kills it (restart tests).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from rankops.validator.daemonset import DEFAULT_SERVICE_ACCOUNT

from .ports import free_port

CHART = Path(__file__).resolve().parents[2] / "charts" / "rankops-operator"
RELEASE = "rankops"
RELEASE_NAMESPACE = "rankops-system"
OPERATOR_SERVICE_ACCOUNT = "rankops-operator"
VALIDATOR_SERVICE_ACCOUNT = DEFAULT_SERVICE_ACCOUNT



def _tool(name: str, bin_dir: Path | None) -> str:
    if bin_dir and (bin_dir / name).exists():
        return str(bin_dir / name)
    return name


def install_chart(kubeconfig: str, *, bin_dir: Path | None = None, chart: Path = CHART,
                  release: str = RELEASE, namespace: str = RELEASE_NAMESPACE,
                  values: tuple[str, ...] = ()) -> None:
    """`helm upgrade --install` the chart, then scale the chart's operator Deployment to zero:
    the caller runs the operator itself, and two operators must never act at once."""
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    helm = [_tool("helm", bin_dir), "upgrade", "--install", release, str(chart), "--namespace", namespace,
            "--create-namespace", "--wait=false"]
    for value in values:
        helm += ["--set", value]
    done = subprocess.run(helm, env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"helm install failed: {done.stderr.strip()}")
    established = [_tool("kubectl", bin_dir), "wait", "--for=condition=Established", "--timeout=60s",
                   "crd/rankingmodels.rankops.io", "crd/gpunodepools.rankops.io", "crd/sharedservers.rankops.io"]
    done = subprocess.run(established, env=env, capture_output=True, text=True, timeout=90)
    if done.returncode != 0:
        raise RuntimeError(f"the chart's CRDs are not Established: {done.stderr.strip()}")
    scale = [_tool("kubectl", bin_dir), "-n", namespace, "scale", "deployment",
             "-l", f"app.kubernetes.io/instance={release}", "--replicas=0"]
    done = subprocess.run(scale, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"scaling the chart's operator to 0 failed: {done.stderr.strip()}")


def service_account_kubeconfig(kubeconfig: str, dest: Path, *, namespace: str = RELEASE_NAMESPACE,
                               name: str = OPERATOR_SERVICE_ACCOUNT, seconds: int = 6 * 3600) -> Path:
    """Write a kubeconfig that authenticates as ServiceAccount `namespace/name` (a bound token from
    the TokenRequest API) to the same server as `kubeconfig`'s current context."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        token = client.CoreV1Api(api).create_namespaced_service_account_token(
            name, namespace, {"spec": {"expirationSeconds": seconds}}).status.token
    finally:
        api.close()
    source = yaml.safe_load(Path(kubeconfig).read_text())
    current = source.get("current-context")
    context = next(c["context"] for c in source["contexts"] if c["name"] == current)
    cluster = next(c for c in source["clusters"] if c["name"] == context["cluster"])
    user = f"system:serviceaccount:{namespace}:{name}"
    dest.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": current, "context": {"cluster": cluster["name"], "user": user}}],
    }))
    dest.chmod(0o600)
    return dest


# kopf's format pads the level in brackets ("[ERROR   ]"); plain logging's formats write it as a
# word (" ERROR " or "ERROR:name:"). CRITICAL counts too.
_ERROR_LEVEL = re.compile(r"\[(?:ERROR|CRITICAL)\s*\]|(?:^|\s)(?:ERROR|CRITICAL)(?:\s|:)")


def error_lines(text: str) -> list[str]:
    """The lines of an operator log that record an error: ERROR/CRITICAL records and tracebacks."""
    # kopf logs a watch request it retries (e.g. 429 while a new CRD's storage initialises)
    # at ERROR ("Request attempt #1/9 failed; will retry"): the retry is the recovery, not a fault.
    return [line for line in text.splitlines()
            if (_ERROR_LEVEL.search(line) and "failed; will retry" not in line) or line.startswith("Traceback")]


class OperatorProcess:
    """`rankops run` in a subprocess, its output in `log_path`."""

    def __init__(self, kubeconfig: str | Path, log_path: Path, *, namespace: str = RELEASE_NAMESPACE,
                 validator_service_account: str = VALIDATOR_SERVICE_ACCOUNT, interval: float = 2.0,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.kubeconfig = str(kubeconfig)
        self.log_path = log_path
        self.namespace = namespace
        self.validator_service_account = validator_service_account
        self.interval = interval
        self.extra_args = extra_args
        # kwok's pod IPs are made up and nothing answers there: only loopback is read. A test may
        # restart the operator with another network to make every pod's metrics unreadable.
        self.pod_metrics_network = "127.0.0.0/8"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "rankops", "run", "--liveness", f"http://127.0.0.1:{port}/healthz",
                "--operator-namespace", self.namespace,
                "--validator-service-account", self.validator_service_account,
                "--interval", str(self.interval),
                "--pod-metrics-network", self.pod_metrics_network, *self.extra_args]
        env = dict(os.environ, KUBECONFIG=self.kubeconfig, PYTHONUNBUFFERED="1")
        env.pop("POD_NAMESPACE", None)
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts}: {' '.join(argv)}\n".encode())
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"the operator exited with {self.process.returncode} at start:\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.25)
        self.kill()
        raise RuntimeError(f"the operator was not live within {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (kopf finishes its handlers), then SIGKILL if it lingers."""
        if not self.running:
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash, nothing cleaned up (restart tests)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def errors(self) -> list[str]:
        """Tracebacks and ERROR lines the operator logged (a clean run has none)."""
        return error_lines(self.log_path.read_text(errors="replace") if self.log_path.exists() else "")

    def __enter__(self) -> OperatorProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
