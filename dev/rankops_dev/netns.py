"""A network namespace the dev cluster makes for its real node, and a TCP forwarder into it.

The workplace's network rule: test traffic goes only to loopback or to addresses inside network
namespaces the cluster itself creates. The real node's control plane, containerd, kubelet, CNI
bridge and pod network all live in one such namespace; the host's tests reach the API server
through `Forwarder`, which listens on the host's loopback and dials inside the namespace.

Processes enter it with `nsenter --net=PATH` and not `ip netns exec`: the latter remounts /sys,
the cgroup v1 mounts under /sys/fs/cgroup vanish and the kubelet stops ("failed to find cgroup
mounts").
"""
from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
CLONE_NEWNET = 0x40000000


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def enter_command(name: str) -> list[str]:
    """The prefix that runs a command inside the namespace (network only; host mounts and PIDs)."""
    return ["nsenter", f"--net={netns_path(name)}"]


def create_commands(name: str, *addresses: str) -> list[list[str]]:
    """Create the namespace, bring its loopback up and give the loopback each of `addresses` (/32):
    the nodes' (the first is the API server's too). This kernel has no `dummy` link type, and an
    address on lo is reached from the pod bridges through the namespace's own routing."""
    inside = enter_command(name)
    return [["ip", "netns", "add", name],
            [*inside, "ip", "link", "set", "lo", "up"],
            *([*inside, "ip", "addr", "add", f"{address}/32", "dev", "lo"] for address in addresses),
            # Pod -> Service -> pod on the same bridge: the reply must cross iptables to be
            # un-NATed (per-namespace since Linux 5.3).
            [*inside, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"],
            [*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1"]]


def delete_command(name: str) -> list[str]:
    return ["ip", "netns", "delete", name]


def create(name: str, *addresses: str) -> None:
    if netns_path(name).exists():
        subprocess.run(delete_command(name), capture_output=True)
    for command in create_commands(name, *addresses):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


def delete(name: str) -> None:
    if netns_path(name).exists():
        subprocess.run(delete_command(name), capture_output=True)


def _setns_thread(path: Path) -> None:
    """Move the calling thread (only) into the network namespace at `path`."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def enter_thread(name: str) -> None:
    """Move the calling thread (only) into the dev cluster's namespace `name`, for good: for a
    thread of its own, e.g. a traffic driver whose every socket must be made inside."""
    _setns_thread(netns_path(name))


def connect_inside(name: str, address: tuple[str, int], timeout: float = 5.0) -> socket.socket:
    """A TCP connection made from inside the namespace (a socket keeps the namespace it was
    created in, so the dial happens in a short-lived thread that entered it)."""
    box: dict[str, object] = {}

    def dial() -> None:
        try:
            _setns_thread(netns_path(name))
            box["sock"] = socket.create_connection(address, timeout=timeout)
        except OSError as exc:
            box["error"] = exc

    thread = threading.Thread(target=dial, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    sock = box["sock"]
    assert isinstance(sock, socket.socket)
    sock.settimeout(None)
    return sock


class Forwarder:
    """Listens on 127.0.0.1:`listen_port` on the host and forwards each connection to `target`
    inside the namespace `name`. Threads, one pair per connection; `close()` stops accepting."""

    def __init__(self, name: str, listen_port: int, target: tuple[str, int],
                 dial: Callable[[str, tuple[str, int]], socket.socket] = connect_inside) -> None:
        self.name, self.target, self._dial = name, target, dial
        self._server = socket.create_server(("127.0.0.1", listen_port), reuse_port=False)
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"forward-{self.port}").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self._dial(self.name, self.target)
        except OSError:
            client.close()
            return
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._server.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass
