"""One call from nothing to a usable cluster: binaries built, control plane up, GPU nodes Ready.

Used by `rankops dev up`, the README demo and the e2e fixture.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rankops_dev.binaries import ensure_binaries, k8s_version
from rankops_dev.controlplane import LocalControlPlane
from rankops_dev.nodes import create_nodes, node_manifests, wait_nodes_ready


def api_client(kubeconfig: Path | str, context: str | None = None) -> Any:
    """A kubernetes ApiClient for this kubeconfig, leaving the library's global config alone."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig), context=context)


def add_nodes(kubeconfig: Path | str, node_set: list[tuple[str, str]] | tuple[tuple[str, str], ...],
              timeout: float = 60.0) -> list[str]:
    """Create (name, shape) kwok nodes and wait until they are Ready; returns their names."""
    client = api_client(kubeconfig)
    try:
        create_nodes(client, node_manifests(node_set, kubelet_version=k8s_version()))
        names = [name for name, _ in node_set]
        wait_nodes_ready(client, names, timeout=timeout)
        return names
    finally:
        client.close()


@contextlib.contextmanager
def local_cluster(node_set: list[tuple[str, str]] | tuple[tuple[str, str], ...] = (),
                  *, keep: bool = False, build: bool = True,
                  timeout: float = 120.0) -> Iterator[LocalControlPlane]:
    """Build if needed, start the control plane, add `node_set`, yield it; stop on exit."""
    bin_dir = ensure_binaries(build=build)
    plane = LocalControlPlane(bin_dir, keep=keep)
    started = time.monotonic()
    with plane:
        if node_set:
            try:
                add_nodes(plane.kubeconfig, node_set)
            except Exception:
                plane.failed = True  # keep the logs
                raise
            plane.say(f"{len(node_set)} kwok nodes Ready; "
                       f"up in {time.monotonic() - started:.1f}s")
        yield plane
