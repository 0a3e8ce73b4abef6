"""Helpers for e2e tests: which clusters we may touch, the cluster handle, and `wait_for`."""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Context names of clusters made for testing. Anything else (a real cluster someone left in
# KUBECONFIG) is refused: e2e tests create and delete namespaces and nodes.
ALLOWED_CONTEXTS = ("rankops-local", "kind-*", "kwok-*")
ALLOW_ENV = "RANKOPS_E2E_ALLOW_CONTEXT"


def allowed_context(name: str, extra: str | None = None) -> bool:
    """True for a test cluster's context: the defaults, or patterns in $RANKOPS_E2E_ALLOW_CONTEXT
    (comma-separated globs)."""
    patterns = list(ALLOWED_CONTEXTS)
    if extra:
        patterns += [p.strip() for p in extra.split(",") if p.strip()]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


@dataclass
class Cluster:
    """The cluster the suite runs against."""

    kubeconfig: str  # a path, or a KUBECONFIG list of paths
    context: str
    version: dict[str, Any]
    local: bool  # True: the suite started the local control plane (and may add kwok nodes)
    bin_dir: Path | None = None
    plane: Any = field(default=None, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess (kubectl, helm, the operator) that must use this cluster."""
        env = dict(os.environ, KUBECONFIG=self.kubeconfig)
        if self.bin_dir:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def tool(self, name: str) -> str:
        """Path of kubectl / helm: the locally built one, else the one on PATH."""
        if self.bin_dir and (self.bin_dir / name).exists():
            return str(self.bin_dir / name)
        found = shutil.which(name)
        if not found:
            raise FileNotFoundError(f"{name} not found in {self.bin_dir} or on PATH")
        return found

    def kubectl(self, *args: str) -> str:
        """kubectl's output on this cluster; a failure fails with its stderr (as real_cluster's kubectl)."""
        done = subprocess.run([self.tool("kubectl"), *args], env=self.env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll `predicate` until it returns something truthy and return that.

    On timeout, fail with `what`, the last value seen and the last exception raised, so the
    message says what the cluster was doing instead of just "timed out".
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    last_error: BaseException | None = None
    while True:
        try:
            last = predicate()
            last_error = None
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - remembered and reported on timeout
            last_error = exc
        if time.monotonic() > deadline:
            detail = f"last error: {last_error!r}" if last_error else f"last value: {last!r}"
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; {detail}")
        time.sleep(interval)


def gone(read: Callable[[], Any]) -> bool:
    """True when `read()` answers 404 (the object is gone); other API errors propagate."""
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False
