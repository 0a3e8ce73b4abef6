"""One HTTP exchange with a pod, bounded: what a pod answers is its tenant's.

One deadline for connect, headers and body together; the headers capped in bytes and count; the
body capped in bytes (by its Content-Length before it is read, by what arrived otherwise); no
redirect followed; `Connection: close` (HTTP/1.0 unless asked otherwise), no chunked body, no
kept-alive socket to resynchronise. Triton's metrics (metrics.py) and its repository API (repository.py) are read
through it. AnswerRefused says what went wrong; nothing else is raised.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Mapping

MAX_HEADER_BYTES = 16 << 10
MAX_HEADERS = 64


class AnswerRefused(Exception):
    """No full answer, in time and within bounds; the message starts with HOST:PORT."""


def exchange(host: str, port: int, method: str, path: str, body: bytes = b"", *, deadline_s: float,
             max_bytes: int, headers: Mapping[str, str] | None = None, accept: str = "application/json",
             redirect_note: str = "a pod is asked itself", error_bodies: bool = False,
             http11: bool = False) -> tuple[int, bytes]:
    """(status, body) of one request. A status other than 200 is refused before its body is read,
    unless `error_bodies` (then a 4xx/5xx body is read within the same bounds: the server's error).
    `http11`: ask in HTTP/1.1 (still `Connection: close`), for a server that frames its answers
    only then: Triton answers a 1.0 load with neither a Content-Length nor a close."""
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    end = time.monotonic() + deadline_s

    def left() -> float:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise AnswerRefused(f"{where}: no full answer in {deadline_s:g}s")
        return remaining

    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sized = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body or method != "GET" else ""
    request = (f"{method} {path} HTTP/1.{1 if http11 else 0}\r\nHost: {where}\r\nAccept: {accept}\r\n{sized}{extra}"
               "Connection: close\r\n\r\n").encode("latin-1") + body
    data = bytearray()
    code = 0
    try:
        with socket.create_connection((host, port), timeout=left()) as sock:
            sock.settimeout(left())
            sock.sendall(request)
            head_end, length = -1, None
            while True:
                sock.settimeout(left())
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if head_end < 0:
                    head_end = data.find(b"\r\n\r\n")
                    if head_end < 0:
                        if len(data) > MAX_HEADER_BYTES:
                            raise AnswerRefused(f"{where}: headers over {MAX_HEADER_BYTES >> 10} KiB")
                        continue
                    if head_end > MAX_HEADER_BYTES:
                        raise AnswerRefused(f"{where}: headers over {MAX_HEADER_BYTES >> 10} KiB")
                    code, length = _check_head(bytes(data[:head_end]), where, max_bytes, redirect_note,
                                               error_bodies, http11)
                received = len(data) - head_end - 4
                if received > max_bytes:
                    raise AnswerRefused(f"{where}: body over {max_bytes >> 10} KiB")
                if length is not None and received >= length:
                    break
    except AnswerRefused:
        raise
    except (OSError, ValueError) as exc:   # refused, reset, unreachable, a timeout within the deadline
        reason = "no full answer in " + f"{deadline_s:g}s" if isinstance(exc, socket.timeout) else \
            (exc.strerror or str(exc) or type(exc).__name__)
        raise AnswerRefused(f"{where}: {reason}") from None
    if head_end < 0:
        raise AnswerRefused(f"{where}: not an HTTP answer" if data else f"{where}: closed without an answer")
    answer = bytes(data[head_end + 4:])
    if length is not None and len(answer) < length:
        raise AnswerRefused(f"{where}: short body, {len(answer)} of {length} bytes")
    return code, answer[:length] if length is not None else answer


def _check_head(head: bytes, where: str, max_bytes: int, redirect_note: str,
                error_bodies: bool, http11: bool) -> tuple[int, int | None]:
    """The status and Content-Length of an answer the caller takes (length None: read to the close)."""
    lines = head.split(b"\r\n")
    status = lines[0].split(None, 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
        raise AnswerRefused(f"{where}: not an HTTP answer ({printable(lines[0].decode('latin-1'))})")
    if len(lines) - 1 > MAX_HEADERS:
        raise AnswerRefused(f"{where}: more than {MAX_HEADERS} headers")
    code = int(status[1])
    headers: dict[bytes, bytes] = {}
    for raw in lines[1:]:
        name, _, value = raw.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if 300 <= code < 400:
        target = headers.get(b"location", b"?").decode("latin-1")
        raise AnswerRefused(f"{where}: redirect ({code}) to {printable(target)} refused: {redirect_note}")
    if code != 200 and not (error_bodies and 400 <= code < 600):
        raise AnswerRefused(f"{where}: HTTP {code}")
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        raise AnswerRefused(f"{where}: a chunked answer" + (" (a Content-Length is required)" if http11 else
                                                           " to an HTTP/1.0 request"))
    if b"content-length" not in headers:
        return code, None
    raw_length = headers[b"content-length"]
    if not raw_length.isdigit() or len(raw_length) > 12:
        raise AnswerRefused(f"{where}: Content-Length {printable(raw_length.decode('latin-1'))} is not a length")
    length = int(raw_length)
    if length > max_bytes:
        raise AnswerRefused(f"{where}: body over {max_bytes >> 10} KiB (Content-Length {length})")
    return code, length


def printable(text: str, limit: int = 60) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")
