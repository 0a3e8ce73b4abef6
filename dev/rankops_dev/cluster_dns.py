"""Cluster DNS for the real node: `<service>.<namespace>.svc.cluster.local` -> its ClusterIP.

No CoreDNS here (no registry for its image, a long build): Debian's dnsmasq runs inside the node's
network namespace on the node's address, answers from a hosts directory (re-read on every change
through inotify) and forwards nothing (`--no-resolv`, no servers: test traffic stays inside). A
thread watches the Services (list, then watch from its resourceVersion, as CoreDNS's kubernetes
plugin does) and rewrites the one hosts file. The kubelet points pods at it (`clusterDNS`), with
the usual search path, so `triton` and `triton.default.svc` resolve as in any cluster.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = "cluster.local"


def dnsmasq_command(address: str, hosts_dir: Path, pid_file: Path) -> list[str]:
    return ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", f"--pid-file={pid_file}",
            "--no-resolv", "--no-hosts", "--no-poll", f"--local=/{CLUSTER_DOMAIN}/",
            f"--listen-address={address}", "--bind-interfaces", "--port=53",
            f"--hostsdir={hosts_dir}", "--log-facility=-", "--cache-size=0"]


def hosts_lines(services: Iterable[dict], domain: str = CLUSTER_DOMAIN) -> str:
    """A hosts file: one line a Service with a ClusterIP (headless ones have none), sorted."""
    lines = []
    for svc in services:
        ip = (svc.get("spec") or {}).get("clusterIP")
        meta = svc.get("metadata") or {}
        if ip and ip != "None":
            lines.append(f"{ip} {meta['name']}.{meta['namespace']}.svc.{domain}")
    return "".join(f"{line}\n" for line in sorted(lines))


class ServiceDNS:
    """Keeps `hosts_dir/services` equal to the cluster's Services while running."""

    def __init__(self, client_factory: Callable[[], Any], hosts_dir: Path) -> None:
        self._client_factory = client_factory
        self.path = hosts_dir / "services"
        self._services: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="service-dns")

    def start(self) -> "ServiceDNS":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread.start()
        return self

    def wait_for(self, name: str, namespace: str, timeout: float = 30.0) -> bool:
        """True once `name.namespace` is in the hosts file."""
        needle = f" {name}.{namespace}.svc."
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.path.read_text():
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        self._stop.set()

    def _write(self) -> None:
        tmp = self.path.with_name(".services.tmp")
        tmp.write_text(hosts_lines(self._services.values()))
        tmp.chmod(0o644)
        os.replace(tmp, self.path)  # dnsmasq's inotify sees the rename

    def _run(self) -> None:
        from kubernetes import client, watch

        api = self._client_factory()
        core = client.CoreV1Api(api)
        while not self._stop.is_set():
            try:
                listed = core.list_service_for_all_namespaces(_preload_content=False)
                body = json.loads(listed.data)
                self._services = {f"{s['metadata']['namespace']}/{s['metadata']['name']}": s
                                  for s in body["items"]}
                self._write()
                stream = watch.Watch().stream(core.list_service_for_all_namespaces,
                                              resource_version=body["metadata"]["resourceVersion"],
                                              timeout_seconds=30, _preload_content=False)
                for event in stream:
                    if self._stop.is_set():
                        return
                    obj = event["raw_object"]
                    key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
                    if event["type"] == "DELETED":
                        self._services.pop(key, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self._services[key] = obj
                    self._write()
            except Exception:  # noqa: BLE001 - the API went away or a watch expired: relist
                self._stop.wait(0.5)
