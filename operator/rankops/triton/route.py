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

A member's drain (a swap takes the pod out of its endpoints: rollout/inplace.py): the operator asks
`POST /rankops/drain {"seconds": N}` on the member's port with the server's API key header (without
the key, or with no key configured, the path is answered 404 like any other). For N seconds (renewed
by each ask; 0 ends it) each answer to the member carries `Connection: close` and ends its
connection, and each ask closes the member's connections idle for over IDLE_CLOSE_S (a pool's
spare, which a client checks before reuse; one in use gets its answer first), so pooled clients
reconnect through the Service to a pod still in its endpoints. The answer says how many of the
member's connections are still open (the operator unloads the member once none is) and, given the
pod's model repository (read-only), which of the member's version directories the stager has put
there (the operator takes a pod for a swap only once the new version's files are on it). The
operator asks every pod of a swap each round: the pod taken to drain it, the others with 0.

HTTP/1.1 with keep-alive, one upstream connection per client connection (answers stay in order).
Strict and bounded: a request head is parsed as Triton would read it or refused (400: one space
between method, target and version, no tab, bare LF or NUL, a Content-Length of digits only), at
most MAX_HEAD_BYTES and MAX_HEADERS; a body is streamed to Triton, never held, at most
`max_body_bytes` by its Content-Length (chunked request bodies: 411); a refused request's body is
never read (the connection ends); at most `max_connections` at once (503); every read and write
waits at most `idle_timeout_s`. Triton unreachable: 502. A member named `stats` cannot have a
port: GET /v2/models/stats is Triton's statistics of every model. gRPC is not routed (a model's name is inside its protobuf messages): a shared
server's members are served over HTTP. The ports come from a JSON file ({"8100": "coarse", ...},
a ConfigMap mounted as a directory), read again every `reload_s`: adding or removing a member opens
or closes its port without restarting the pod.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path

from rankops.triton.repository import API_KEY_HEADER

log = logging.getLogger("rankops.route")

MAX_HEAD_BYTES = 32 << 10
MAX_HEADERS = 100
DEFAULT_MAX_BODY_BYTES = 256 << 20
DEFAULT_MAX_CONNECTIONS = 512
SERVER_PATHS = frozenset({"/v2", "/v2/health/live", "/v2/health/ready"})
# Segments Triton routes itself under /v2/models/: GET /v2/models/stats answers every model's statistics.
RESERVED_MODEL_NAMES = frozenset({"stats"})
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")
_PORT = re.compile(r"^[0-9]{4,5}$")
_METHOD = re.compile(r"^[A-Z]{1,16}$")
_TARGET = re.compile(r"^/[\x21-\x7e]*$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_LENGTH = re.compile(r"^[0-9]{1,12}$")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"}
DRAIN_PATH = "/rankops/drain"
MAX_DRAIN_S = 300.0
MAX_DRAIN_BODY = 256
IDLE_CLOSE_S = 1.0      # a drain closes the member's connections idle this long
MAX_STAGED_LISTED = 64
_VERSION_DIR = re.compile(r"[1-9][0-9]{0,8}")     # fetcher/stager.py's: a Triton version directory


def allowed(path: str, model: str) -> bool:
    """May a request for `path` (the request target, query included) pass on `model`'s port?"""
    path = path.split("?", 1)[0]
    if not path.startswith("/") or "%" in path or "\\" in path or model in RESERVED_MODEL_NAMES:
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
        if not (isinstance(port, str) and _PORT.match(port) and 1024 <= int(port) <= 65535):
            raise RouteError(f"route port {port!r} is not a port in 1024..65535")
        if not (isinstance(model, str) and _MODEL_NAME.match(model)):
            raise RouteError(f"route {port}: {model!r} is not a model name")
        if model in RESERVED_MODEL_NAMES:
            raise RouteError(f"route {port}: {model!r} is a path Triton keeps for itself (/v2/models/{model} "
                             "answers every model's statistics); rename the model")
        routes[int(port)] = model
    return routes


class BadRequest(ValueError):
    """The client's request is not one this router passes on: answered 400, the connection closed."""


def _response(code: int, reason: str, message: str, close: bool) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n").encode() + body


async def _read_line_or_head(reader: asyncio.StreamReader, separator: bytes, what: str) -> bytes | None:
    """Up to `separator`, or None at a clean end of stream before anything came. Over the reader's
    limit (MAX_HEAD_BYTES): ValueError."""
    try:
        return await reader.readuntil(separator)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError:
        raise ValueError(f"{what} over {MAX_HEAD_BYTES} bytes") from None


def parse_request_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    """(method, target, version, header fields), strictly: what is passed on must mean the same to
    Triton's parser as to this one (no tab or bare LF as a separator, no odd length), or it is refused."""
    if b"\0" in head:
        raise BadRequest("NUL in the request head")
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _METHOD.match(parts[0]) or not _TARGET.match(parts[1]) or \
            parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    return parts[0], parts[1], parts[2], _fields(lines[1:], BadRequest)


def _fields(lines: list[str], error: type[Exception]) -> list[tuple[str, str]]:
    if len(lines) > MAX_HEADERS:
        raise error(f"more than {MAX_HEADERS} header lines")
    fields = []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name) or "\n" in line or "\r" in line:
            raise error(f"bad header line {line[:80]!r}")
        fields.append((name, value.strip(" \t")))
    return fields


def _get(fields: list[tuple[str, str]], name: str, error: type[Exception] = BadRequest) -> str | None:
    found = [v for k, v in fields if k.lower() == name]
    if len(found) > 1:
        raise error(f"{name} given twice")
    return found[0] if found else None


def _length(fields: list[tuple[str, str]], error: type[Exception] = BadRequest) -> int:
    length = _get(fields, "content-length", error)
    if length is None:
        return 0
    if not _LENGTH.match(length):
        raise error(f"Content-Length {length[:20]!r} is not a length")
    return int(length)


class UpstreamError(ConnectionError):
    """Triton did not answer, or not in a way this router relays: 502 when nothing was relayed yet."""


class Router:
    """Listens on each route's port; forwards what `allowed` lets through to Triton at upstream."""

    def __init__(self, upstream: tuple[str, int], host: str = "0.0.0.0",
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, idle_timeout_s: float = 60.0,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, api_key: str | None = None,
                 repository: Path | None = None) -> None:
        self.upstream, self.host = upstream, host
        self.max_body_bytes, self.idle_timeout_s = max_body_bytes, idle_timeout_s
        self.max_connections = max_connections
        self.api_key = api_key or None
        self.repository = repository        # the pod's model repository, read-only (the drain answer's `staged`)
        self.servers: dict[int, tuple[str, asyncio.AbstractServer]] = {}
        self.clients: dict[int, set[asyncio.Task]] = {}
        # connections waiting for a request head -> (model, since when: time.monotonic())
        self.idle: dict[asyncio.Task, tuple[str, float]] = {}
        self.drain_until: dict[str, float] = {}       # model -> time.monotonic() its drain ends

    def draining(self, model: str) -> bool:
        return time.monotonic() < self.drain_until.get(model, 0.0)

    def _drain(self, model: str, seconds: float, asking: asyncio.Task | None) -> int:
        """Drain `model` for `seconds` (0: end it): its idle connections closed now; the number of its
        connections still open, the asking one left out."""
        now = time.monotonic()
        if seconds > 0:
            self.drain_until[model] = now + seconds
            for task, (of, since) in list(self.idle.items()):
                if of == model and task is not asking and now - since >= IDLE_CLOSE_S:
                    task.cancel()
        else:
            self.drain_until.pop(model, None)
        ports = [port for port, (m, _) in self.servers.items() if m == model]
        return sum(1 for port in ports for t in self.clients.get(port, ()) if t is not asking and not t.done())

    async def apply(self, routes: Mapping[int, str]) -> None:
        """Open, close or re-point ports so that exactly `routes` are served; a port closed or
        re-pointed ends its open connections too (they would go on reaching the old model)."""
        for port, (model, server) in list(self.servers.items()):
            if routes.get(port) != model:
                server.close()
                for task in self.clients.pop(port, set()):
                    task.cancel()
                del self.servers[port]
                log.info("route %d (%s) closed", port, model)
        for port, model in routes.items():
            if port not in self.servers:
                try:
                    server = await asyncio.start_server(
                        lambda r, w, m=model, p=port: self._client(r, w, m, p), self.host, port, limit=MAX_HEAD_BYTES)
                except OSError as exc:      # tried again on the next round
                    log.error("route %d (%s) cannot listen: %s", port, model, exc)
                    continue
                self.servers[port] = (model, server)
                log.info("route %d -> model %s", port, model)

    async def close(self) -> None:
        ending = [t for tasks in self.clients.values() for t in tasks]
        await self.apply({})
        await asyncio.gather(*ending, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, model: str, port: int) -> None:
        task = asyncio.current_task()
        tasks = self.clients.setdefault(port, set())
        if sum(len(t) for t in self.clients.values()) >= self.max_connections:
            try:    # its head read first: closing on unread bytes would reset the connection, not answer it
                await asyncio.wait_for(_read_line_or_head(reader, b"\r\n\r\n", "request head"), 1.0)
                writer.write(_response(503, "Service Unavailable", "too many connections", True))
                await asyncio.wait_for(writer.drain(), 1.0)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
                pass
            writer.close()
            return
        tasks.add(task)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        relaying = False
        try:
            while True:
                self.idle[task] = (model, time.monotonic())
                try:
                    head = await asyncio.wait_for(_read_line_or_head(reader, b"\r\n\r\n", "request head"),
                                                  self.idle_timeout_s)
                finally:
                    self.idle.pop(task, None)
                if head is None:
                    return
                leaving = False
                if task.cancelling():
                    # a drain's cancel came as this head arrived (wait_for then returns it): answered, then closed
                    task.uncancel()
                    leaving = True
                method, target, version, fields = parse_request_head(head)
                close = (_get(fields, "connection") or "").lower() == "close" or version == "HTTP/1.0"
                chunked = _get(fields, "transfer-encoding") is not None
                length = _length(fields)
                if self.api_key and target.split("?", 1)[0] == DRAIN_PATH and method == "POST" and not chunked \
                        and hmac.compare_digest((_get(fields, API_KEY_HEADER) or "").encode(), self.api_key.encode()):
                    await self._send(writer, await self._drain_asked(reader, model, length, task))
                    return
                if not allowed(target, model):
                    # a body is never read for a refused request: the connection ends after the answer
                    close = close or chunked or length > 0 or _get(fields, "expect") is not None
                    await self._send(writer, _response(404, "Not Found", f"this port serves model {model} only", close))
                    if close:
                        return
                    continue
                if chunked:
                    await self._send(writer, _response(411, "Length Required", "send the body with a Content-Length",
                                                       True))
                    return
                if length > self.max_body_bytes:
                    await self._send(writer, _response(413, "Payload Too Large",
                                                       f"a body of at most {self.max_body_bytes} bytes", True))
                    return
                if (_get(fields, "expect") or "").lower() == "100-continue":
                    await self._send(writer, b"HTTP/1.1 100 Continue\r\n\r\n")
                if upstream is not None and upstream[0].at_eof():     # Triton closed the idle connection
                    upstream[1].close()
                    upstream = None
                if upstream is None:
                    try:
                        upstream = await asyncio.wait_for(
                            asyncio.open_connection(*self.upstream, limit=MAX_HEAD_BYTES), self.idle_timeout_s)
                    except (OSError, asyncio.TimeoutError) as exc:
                        raise UpstreamError(f"Triton at {self.upstream[0]}:{self.upstream[1]}: {exc}") from None
                kept = [(k, v) for k, v in fields if k.lower() not in _HOP_BY_HOP]
                upstream[1].write((f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept)
                                   + "\r\n").encode("latin-1"))
                await self._copy(reader, upstream[1], length)        # streamed: never held whole
                relaying = True
                drained = leaving or self.draining(model)      # its answer ends the connection (a drain)
                upstream_closes = await self._relay_response(upstream[0], writer, method, drained)
                relaying = False
                if upstream_closes:
                    upstream[1].close()
                    upstream = None
                if close or upstream_closes or drained:
                    return
        except BadRequest as exc:
            if not relaying:
                writer.write(_response(400, "Bad Request", str(exc)[:200], True))
        except UpstreamError as exc:
            log.warning("route %s: %s", model, exc)
            if not relaying:
                writer.write(_response(502, "Bad Gateway", "the model server did not answer", True))
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            log.debug("route %s: connection ended: %s", model, exc)
        except asyncio.CancelledError:      # its port closed or re-pointed (apply): the connection ends
            pass
        finally:
            tasks.discard(task)
            if upstream is not None:
                upstream[1].close()
            writer.close()

    async def _drain_asked(self, reader: asyncio.StreamReader, model: str, length: int, task: asyncio.Task) -> bytes:
        """The answer to the operator's drain ask: {"seconds": N}, N in [0, MAX_DRAIN_S]."""
        if length > MAX_DRAIN_BODY:
            return _response(413, "Payload Too Large", f"a drain ask of at most {MAX_DRAIN_BODY} bytes", True)
        try:
            body = json.loads((await asyncio.wait_for(reader.readexactly(length), self.idle_timeout_s)) or b"{}")
            seconds = float(body.get("seconds", 0)) if isinstance(body, dict) else -1.0
        except (ValueError, TypeError):
            seconds = -1.0
        if not 0 <= seconds <= MAX_DRAIN_S:
            return _response(400, "Bad Request", f'send {{"seconds": 0..{MAX_DRAIN_S:g}}}', True)
        was_draining = self.drain_until.get(model, 0.0) > time.monotonic()
        open_now = self._drain(model, seconds, task)
        # Asked every round of a swap: said at INFO only when the drain begins or ends.
        log.log(logging.INFO if was_draining != (seconds > 0) else logging.DEBUG,
                "route %s: %s (%d connections open)", model,
                f"draining for {seconds:g}s" if seconds else "drain ended", open_now)
        answer = json.dumps({"model": model, "draining": seconds > 0, "open": open_now,
                             "staged": self._staged(model)}).encode()
        return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(answer)}\r\n"
                "Connection: close\r\n\r\n").encode() + answer

    def _staged(self, model: str) -> list[int] | None:
        """The member's version directories on the pod's volume (the stager's: a hidden one is a fetch
        under way); None without a repository to look in."""
        if self.repository is None:
            return None
        try:
            names = [entry.name for entry in (self.repository / model).iterdir()]
        except OSError:
            return []
        return sorted(int(n) for n in names if _VERSION_DIR.fullmatch(n))[:MAX_STAGED_LISTED]

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await asyncio.wait_for(writer.drain(), self.idle_timeout_s)

    async def _relay_response(self, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              method: str, closing: bool = False) -> bool:
        """Relays one answer; True when the upstream connection ends with it. `closing`: the client's
        connection ends after it (a drain): its head says `Connection: close`."""
        try:
            while True:
                head = await asyncio.wait_for(_read_line_or_head(upstream, b"\r\n\r\n", "Triton's answer head"),
                                              self.idle_timeout_s)
                if head is None:
                    raise UpstreamError("Triton closed the connection before answering")
                lines = head[:-4].decode("latin-1").split("\r\n")
                fields = _fields(lines[1:], UpstreamError)
                status = lines[0].split(" ", 2)
                if len(status) < 2 or not status[1].isdigit() or len(status[1]) != 3:
                    raise UpstreamError(f"not an HTTP status line: {lines[0][:80]!r}")
                code = int(status[1])
                if closing and code >= 200:
                    kept = [line for line in lines[1:] if line.split(":", 1)[0].strip().lower() != "connection"]
                    head = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
                writer.write(head)
                if code >= 200 or code == 101:
                    break      # 1xx interim answers are relayed and the final one awaited
            closes = (_get(fields, "connection", UpstreamError) or "").lower() == "close"
            if method == "HEAD" or code in (204, 304):
                await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
                return closes
            length = _get(fields, "content-length", UpstreamError)
            if length is not None:
                await self._copy(upstream, writer, _length(fields, UpstreamError))
            elif (_get(fields, "transfer-encoding", UpstreamError) or "").lower() == "chunked":
                while True:
                    size_line = await asyncio.wait_for(_read_line_or_head(upstream, b"\r\n", "a chunk size"),
                                                       self.idle_timeout_s)
                    if size_line is None:
                        raise UpstreamError("Triton's chunked answer ended early")
                    writer.write(size_line)
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        while (line := await asyncio.wait_for(
                                _read_line_or_head(upstream, b"\r\n", "a trailer"), self.idle_timeout_s)) != b"\r\n":
                            if line is None:
                                raise UpstreamError("Triton's chunked answer ended early")
                            writer.write(line)
                        writer.write(b"\r\n")
                        break
                    await self._copy(upstream, writer, size + 2)
            else:
                while chunk := await asyncio.wait_for(upstream.read(1 << 16), self.idle_timeout_s):
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
                closes = True
            await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
            return closes
        except ValueError as exc:      # an unparsable chunk size or a line over the limit
            raise UpstreamError(f"Triton's answer: {exc}") from None

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int) -> None:
        left = length
        while left:
            chunk = await asyncio.wait_for(reader.read(min(left, 1 << 16)), self.idle_timeout_s)
            if not chunk:
                raise asyncio.IncompleteReadError(b"", left)
            writer.write(chunk)
            left -= len(chunk)
            if writer.transport.get_write_buffer_size() > (1 << 20):
                await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
        await asyncio.wait_for(writer.drain(), self.idle_timeout_s)


async def run(upstream: tuple[str, int], routes_file: Path | None, static: Mapping[int, str],
              host: str = "0.0.0.0", reload_s: float = 2.0, stop: asyncio.Event | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, api_key: str | None = None,
              repository: Path | None = None) -> None:
    """Serve `static` routes and those of `routes_file` (read again every `reload_s`) until `stop`.
    A file that cannot be read or does not parse keeps the ports as they were (said once per change)."""
    router = Router(upstream, host, max_body_bytes, api_key=api_key, repository=repository)
    stop = stop or asyncio.Event()
    last_text, current = None, dict(static)
    try:
        while True:
            if routes_file is not None:
                try:
                    text = routes_file.read_bytes().decode("utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    text = f"unreadable: {exc}"
                if text != last_text:
                    last_text = text
                    try:
                        if text.startswith("unreadable: "):
                            raise RouteError(text)
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
