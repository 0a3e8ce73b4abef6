#!/usr/bin/env python3
"""`tritonserver` in the Triton test image: the real server, on a CPU, with the config as rendered.

A CPU-only Triton refuses `instance_group { kind: KIND_GPU }` ("no GPUs are available"), and the
rendered pod mounts each model's config.pbtxt read-only from its ConfigMap. So this shim, first on
PATH, builds a shadow repository in /tmp (the pod's writable emptyDir): per model, a copy of its
config with KIND_GPU -> KIND_CPU (the one edit the real-Triton fixture makes too, said on
stderr) and a symlink for every other entry (the version directories fetch-model wrote); then it
execs the real server with `--model-repository` pointed there and every other argument as given.
A child it forks first keeps the shadow in step with the real directories (a version a stager
adds or removes later, rollout.strategy inPlace), every MIRROR_S.

A shared server (explicit model control, no model named at start: render/shared_server.py) gets
its members only as loads whose config override the operator sends, and those never pass through
a file. So for such a server a second child listens on the HTTP port the server was given and
relays every connection to the real server HTTP_PORT_SHIFT above it, making the same one edit to
a load's override on the way (`cpu_load_body`); everything else passes unchanged, answers raw.
Test image only: the product images run NVIDIA's tritonserver unchanged.
"""
import json
import os
import re
import socket
import sys
import threading
from pathlib import Path

REAL = "/opt/tritonserver/libexec/tritonserver"
SHADOW = Path(os.environ.get("RANKOPS_CPU_REPOSITORY", "/tmp/cpu-model-repository"))
MIRROR_S = 0.5


def cpu_config(text: str) -> tuple[str, int]:
    """The config with every KIND_GPU instance group made KIND_CPU, and how many were."""
    return text.replace("KIND_GPU", "KIND_CPU"), text.count("KIND_GPU")


def shadow(repository: Path, into: Path, quiet: bool = False) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for model in sorted(p for p in repository.iterdir() if p.is_dir()):
        target = into / model.name
        target.mkdir(exist_ok=True)
        for entry in model.iterdir():
            link = target / entry.name
            if entry.name == "config.pbtxt":
                if quiet and link.exists():
                    continue   # written at start (a running server's config is what it loaded with)
                text, edits = cpu_config(entry.read_text())
                link.unlink(missing_ok=True)
                link.write_text(text)
                if edits:
                    print(f"--- CPU stand-in: {model.name}/config.pbtxt: instance_group KIND_GPU -> KIND_CPU "
                          f"({edits})", file=sys.stderr, flush=True)
            elif not link.is_symlink():
                link.symlink_to(entry)
        for link in target.iterdir():   # gone from the real directory (a version removed): gone here
            if link.is_symlink() and not (model / link.name).exists() and not (model / link.name).is_symlink():
                link.unlink()


def mirror(repository: Path, into: Path) -> None:
    """Keep `into` in step with `repository`, forever (the forked child's loop)."""
    import time

    while True:
        time.sleep(MIRROR_S)
        try:
            shadow(repository, into, quiet=True)
        except OSError:
            pass   # an entry removed while listed: the next round sees the directory as it is


HTTP_PORT_SHIFT = 10000
_LOAD = re.compile(rb"^POST /v2/repository/models/[^/ ?]+/load(\?[^ ]*)? HTTP/1\.[01]$")
_END = b"\r\n\r\n"


def cpu_load_body(body: bytes) -> bytes:
    """A load request's JSON body with its config override's KIND_GPU made KIND_CPU (as it was
    when it has no such override)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    config = (doc.get("parameters") or {}).get("config") if isinstance(doc, dict) else None
    if not isinstance(config, str) or "KIND_GPU" not in config:
        return body
    doc["parameters"]["config"] = config.replace("KIND_GPU", "KIND_CPU")
    print("--- CPU stand-in: a load's config override: instance_group KIND_GPU -> KIND_CPU", file=sys.stderr,
          flush=True)
    return json.dumps(doc).encode()


def _close(*ends: socket.socket) -> None:
    for end in ends:
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source, sink)


def relay(client: socket.socket, upstream_port: int) -> None:
    """One connection: requests parsed (to find the loads), answers relayed raw."""
    try:
        upstream = socket.create_connection(("127.0.0.1", upstream_port), timeout=5)
        upstream.settimeout(None)
    except OSError:
        client.close()          # the server is not up yet: as if nothing listened
        return
    threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
    buffered = b""
    try:
        while True:
            while _END not in buffered:
                data = client.recv(65536)
                if not data:
                    return
                buffered += data
            head, buffered = buffered.split(_END, 1)
            lines = head.split(b"\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
            if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
                upstream.sendall(head + _END + buffered)     # no load is sent so: relayed raw from here on
                _pipe(client, upstream)
                return
            length = int(fields.get(b"content-length", b"0") or b"0")
            while len(buffered) < length:
                data = client.recv(65536)
                if not data:
                    return
                buffered += data
            body, buffered = buffered[:length], buffered[length:]
            if _LOAD.match(lines[0]):
                body = cpu_load_body(body)
                lines = [lines[0], *(line for line in lines[1:] if not line.lower().startswith(b"content-length:")),
                         b"Content-Length: %d" % len(body)]
            upstream.sendall(b"\r\n".join(lines) + _END + body)
    except (OSError, ValueError):
        _close(client, upstream)
        return
    finally:
        # The client is done sending: the server's answers still in flight reach it (the other
        # direction's thread closes both when the server is done).
        try:
            upstream.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve_loads_on_cpu(port: int, upstream_port: int, address: str = "0.0.0.0") -> None:
    """Listen on `port` and relay to the server on `upstream_port`, forever (the forked child's loop)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(128)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=relay, args=(client, upstream_port), daemon=True).start()


def is_shared_server(argv: list[str]) -> bool:
    """Explicit model control with no model named at start: a shared server (render/shared_server.py)."""
    return "--model-control-mode=explicit" in argv and not any(a.startswith("--load-model") for a in argv)


def main(argv: list[str]) -> None:
    args = []
    relayed = is_shared_server(argv)
    for arg in argv:
        if arg.startswith("--model-repository="):
            repository = Path(arg.split("=", 1)[1])
            shadow(repository, SHADOW)
            if os.fork() == 0:
                mirror(repository, SHADOW)
            arg = f"--model-repository={SHADOW}"
        elif relayed and arg.startswith("--http-port="):
            port = int(arg.split("=", 1)[1])
            if os.fork() == 0:
                serve_loads_on_cpu(port, port + HTTP_PORT_SHIFT)
            arg = f"--http-port={port + HTTP_PORT_SHIFT}"
        args.append(arg)
    os.execv(REAL, [REAL, *args])



if __name__ == "__main__":
    main(sys.argv[1:])
