"""A shared tritonserver's per-model doors (issue 42): one port per member, each passing only that
member's requests to Triton.

One Triton answers for every model it holds, on one port; a member's Service must answer for that
member only (`<model>.<ns>.svc`), or one tenant could call, read or load another's model. Each
member gets a port of this router (the `route` sidecar of the server's pods); its Service targets
that port. What passes, to Triton on localhost:
- the member's own paths: /v2/models/<model>, and everything under it (infer, ready, metadata,
  config, stats, versions/<n>/...);
- /v2/health/live, /v2/health/ready and /v2 (server metadata): what clients and probes ask first.
Everything else is answered 404 here and never reaches Triton: other models, the repository API
(load, unload, index), shared-memory registration, trace and log settings. A path is compared as
sent, before any decoding: one with `%`, `\\`, an empty, `.` or `..` segment is refused, so an
encoded or dotted name cannot reach another model.

HTTP/1.1 with keep-alive, one upstream connection per client connection (answers stay in order).
Bounded: a request's head (MAX_HEAD_BYTES) and body (`max_body_bytes`, by its Content-Length;
chunked request bodies are refused with 411), and an idle connection is closed after
`idle_timeout_s`. gRPC is not routed (a model's name is inside its protobuf messages): a shared
server's members are served over HTTP. The ports come from a JSON file ({"8100": "coarse", ...},
a ConfigMap mounted as a directory), read again every `reload_s`: adding or removing a member opens
or closes its port without restarting the pod.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("rankops.route")

MAX_HEAD_BYTES = 32 << 10
DEFAULT_MAX_BODY_BYTES = 256 << 20
SERVER_PATHS = frozenset({"/v2", "/v2/health/live", "/v2/health/ready"})
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"}


def allowed(path: str, model: str) -> bool:
    """May a request for `path` (the request target, query included) pass on `model`'s port?"""
    path = path.split("?", 1)[0]
    if not path.startswith("/") or "%" in path or "\\" in path:
        return False
    segments = path.split("/")[1:]
    if any(s in ("", ".", "..") for s in segments):
        return False
    if path in SERVER_PATHS:
        return True
    return segments[:3] == ["v2", "models", model]


class RouteError(ValueError):
    pass


def parse_routes(text: str) -> dict[int, str]:
    """{"8100": "coarse", ...} -> {8100: "coarse"}; refused whole when a port or a name is not one."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RouteError(f"routes are not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RouteError("routes must be an object of port -> model")
    return checked_routes(data)


def checked_routes(data: Mapping[object, object]) -> dict[int, str]:
    routes = {}
    for port, model in data.items():
        if not (isinstance(port, str) and port.isdigit() and 1024 <= int(port) <= 65535):
            raise RouteError(f"route port {port!r} is not a port in 1024..65535")
        if not (isinstance(model, str) and _MODEL_NAME.match(model)):
            raise RouteError(f"route {port}: {model!r} is not a model name")
        routes[int(port)] = model
    return routes


def _response(code: int, reason: str, message: str, close: bool) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n").encode() + body


async def _read_head(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The head up to its blank line, or None at a clean end of stream before one started."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError:
        raise ValueError(f"head over {limit} bytes") from None


def _headers(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError(f"bad header line {line[:80]!r}")
        fields.append((name, value.strip()))
    return lines[0], fields


def _get(fields: list[tuple[str, str]], name: str) -> str | None:
    found = [v for k, v in fields if k.lower() == name]
    if len(found) > 1:
        raise ValueError(f"{name} given twice")
    return found[0] if found else None


class Router:
    """Listens on each route's port; forwards what `allowed` lets through to Triton at upstream."""

    def __init__(self, upstream: tuple[str, int], host: str = "0.0.0.0",
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, idle_timeout_s: float = 60.0) -> None:
        self.upstream, self.host = upstream, host
        self.max_body_bytes, self.idle_timeout_s = max_body_bytes, idle_timeout_s
        self.servers: dict[int, tuple[str, asyncio.AbstractServer]] = {}

    async def apply(self, routes: Mapping[int, str]) -> None:
        """Open, close or re-point ports so that exactly `routes` are served."""
        for port, (model, server) in list(self.servers.items()):
            if routes.get(port) != model:
                server.close()
                await server.wait_closed()
                del self.servers[port]
                log.info("route %d (%s) closed", port, model)
        for port, model in routes.items():
            if port not in self.servers:
                try:
                    server = await asyncio.start_server(lambda r, w, m=model: self._client(r, w, m), self.host,
                                                        port, limit=MAX_HEAD_BYTES)
                except OSError as exc:      # tried again on the next round
                    log.error("route %d (%s) cannot listen: %s", port, model, exc)
                    continue
                self.servers[port] = (model, server)
                log.info("route %d -> model %s", port, model)

    async def close(self) -> None:
        await self.apply({})

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, model: str) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await asyncio.wait_for(_read_head(reader, MAX_HEAD_BYTES), self.idle_timeout_s)
                if head is None:
                    return
                request_line, fields = _headers(head)
                method, _, rest = request_line.partition(" ")
                target, _, version = rest.partition(" ")
                close = (_get(fields, "connection") or "").lower() == "close" or version == "HTTP/1.0"
                if not allowed(target, model):
                    # a client that awaits 100-continue may never send the body: end the connection
                    close = close or (_get(fields, "expect") or "").lower() == "100-continue"
                    writer.write(_response(404, "Not Found", f"this port serves model {model} only", close))
                    await writer.drain()
                    if close:
                        return
                    await self._discard_body(reader, fields)
                    continue
                if _get(fields, "transfer-encoding") is not None:
                    writer.write(_response(411, "Length Required", "send the body with a Content-Length", True))
                    await writer.drain()
                    return
                length = int(_get(fields, "content-length") or "0")
                if length < 0 or length > self.max_body_bytes:
                    writer.write(_response(413, "Payload Too Large",
                                           f"a body of at most {self.max_body_bytes} bytes", True))
                    await writer.drain()
                    return
                if (_get(fields, "expect") or "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                body = await asyncio.wait_for(reader.readexactly(length), self.idle_timeout_s)
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream, limit=MAX_HEAD_BYTES)
                kept = [(k, v) for k, v in fields if k.lower() not in _HOP_BY_HOP]
                upstream[1].write((f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept)
                                   + "\r\n").encode("latin-1") + body)
                await upstream[1].drain()
                upstream_closes = await self._relay_response(upstream[0], writer, method)
                if upstream_closes:
                    upstream[1].close()
                    upstream = None
                if close or upstream_closes:
                    return
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            log.debug("route %s: connection ended: %s", model, exc)
            if isinstance(exc, ValueError) and not writer.is_closing():
                writer.write(_response(400, "Bad Request", str(exc)[:200], True))
        finally:
            if upstream is not None:
                upstream[1].close()
            writer.close()

    async def _discard_body(self, reader: asyncio.StreamReader, fields: list[tuple[str, str]]) -> None:
        length = int(_get(fields, "content-length") or "0")
        if _get(fields, "transfer-encoding") is not None or not 0 <= length <= self.max_body_bytes:
            raise ValueError("a refused request's body cannot be skipped")
        await asyncio.wait_for(reader.readexactly(length), self.idle_timeout_s)

    async def _relay_response(self, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              method: str) -> bool:
        """Relays one answer; True when the upstream connection ends with it."""
        while True:
            head = await asyncio.wait_for(_read_head(upstream, MAX_HEAD_BYTES), self.idle_timeout_s)
            if head is None:
                raise ConnectionError("Triton closed the connection")
            status_line, fields = _headers(head)
            writer.write(head)
            code = int(status_line.split(" ", 2)[1])
            if code >= 200 or code == 101:
                break      # 1xx interim answers are relayed and the final one awaited
        closes = (_get(fields, "connection") or "").lower() == "close"
        if method == "HEAD" or code in (204, 304):
            await writer.drain()
            return closes
        length = _get(fields, "content-length")
        if length is not None:
            await self._copy(upstream, writer, int(length))
        elif (_get(fields, "transfer-encoding") or "").lower() == "chunked":
            while True:
                size_line = await asyncio.wait_for(upstream.readuntil(b"\r\n"), self.idle_timeout_s)
                writer.write(size_line)
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (line := await asyncio.wait_for(upstream.readuntil(b"\r\n"), self.idle_timeout_s)) != b"\r\n":
                        writer.write(line)
                    writer.write(b"\r\n")
                    break
                await self._copy(upstream, writer, size + 2)
        else:
            while chunk := await asyncio.wait_for(upstream.read(1 << 16), self.idle_timeout_s):
                writer.write(chunk)
                await writer.drain()
            closes = True
        await writer.drain()
        return closes

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int) -> None:
        left = length
        while left:
            chunk = await asyncio.wait_for(reader.read(min(left, 1 << 16)), self.idle_timeout_s)
            if not chunk:
                raise ConnectionError("Triton's answer ended early")
            writer.write(chunk)
            left -= len(chunk)
            if writer.transport.get_write_buffer_size() > (1 << 20):
                await writer.drain()


async def run(upstream: tuple[str, int], routes_file: Path | None, static: Mapping[int, str],
              host: str = "0.0.0.0", reload_s: float = 2.0, stop: asyncio.Event | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
    """Serve `static` routes and those of `routes_file` (read again every `reload_s`) until `stop`.
    A file that does not parse keeps the ports as they were (said once per change of its text)."""
    router = Router(upstream, host, max_body_bytes)
    stop = stop or asyncio.Event()
    last_text, current = None, dict(static)
    try:
        while True:
            if routes_file is not None:
                try:
                    text = routes_file.read_text()
                except OSError:
                    text = "{}"
                if text != last_text:
                    last_text = text
                    try:
                        current = {**parse_routes(text), **static}
                    except RouteError as exc:
                        log.error("%s: %s; the routes stay as they were", routes_file, exc)
            await router.apply(current)
            try:
                await asyncio.wait_for(stop.wait(), reload_s)
                return
            except asyncio.TimeoutError:
                pass
    finally:
        await router.close()
