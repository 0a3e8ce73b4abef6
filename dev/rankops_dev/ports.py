"""Free TCP ports for the dev cluster's processes (control plane, S3, Triton, the operator)."""
from __future__ import annotations

import contextlib
import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports nothing listens on right now.

    Every socket stays bound until all are picked: asked one at a time, the OS may hand the
    same just-released port back twice (Triton then refuses to start with HTTP and gRPC on
    one port, as CI once saw)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
