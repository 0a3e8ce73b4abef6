"""KServe v2 inference over HTTP, through tritonclient, for the gates.

Triton's binary tensor extension is on by default; `binary_data=False` sends and receives plain
JSON tensors, which every v2 server (MLServer, KServe runtimes) accepts. A request is built once
from a sample and the model's metadata (inputs cast to the declared datatypes) and can then be
sent any number of times from any thread; each thread opens its own `Connection`, because a
tritonclient HTTP client must not be shared between threads.

A request may carry a priority (Triton's schedule-policy extension, `"parameters": {"priority": N}`
in the JSON header): the rendered config has two levels, live traffic at the default level 1 and
the gates, the warm container and any replay at GATE_PRIORITY, so a gate never delays a production
request. Triton 2.51 accepts the parameter whatever the config (no dynamic batching, batching
without `priority_levels`: ignored; a level above `priority_levels`: the default level); 0 sends none.
"""
from __future__ import annotations

import socket
import struct
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rankops.triton.samples import Sample, SamplesError


# The level the gates, the warm container and replays send: below live traffic's default level 1
# in the rendered `priority_levels: 2`, and never shed there (its queue policy delays, no timeout).
GATE_PRIORITY = 2


class GateClientError(Exception):
    """A failure talking to a server; the message is meant for the verdict."""


class ServerUnreachable(GateClientError):
    pass


class ModelNotReady(GateClientError):
    pass


class InferenceFailed(GateClientError):
    """The server answered the request with an error."""


class InputsMismatch(GateClientError):
    """The samples do not fit the model's declared inputs."""


def parse_model_ref(text: str) -> tuple[str, str]:
    """'ranker:3' -> ('ranker', '3'); 'ranker' -> ('ranker', '') (the server's choice)."""
    name, _, version = text.partition(":")
    if not name or (version and not version.isdigit()):
        raise ValueError(f"model {text!r} must be NAME or NAME:VERSION with a numeric version")
    return name, version


def check_priority(priority: int, flag: str = "--priority") -> int:
    """A request priority as the command lines take it: 0 (none sent) or a level, 1 the highest."""
    if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
        raise ValueError(f"{flag} must be 0 (send none: the model's default level) or a priority level "
                         f"1, 2, ... (1 the highest), got {priority!r}")
    return priority


def normalize_url(url: str) -> str:
    """tritonclient wants HOST:PORT; accept a pasted http:// URL too."""
    url = url.strip()
    for scheme in ("http://", "https://"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    url = url.rstrip("/")
    if not url:
        raise ValueError("the server URL is empty; pass HOST:PORT, e.g. ranker-canary:8000")
    return url


@dataclass(frozen=True)
class Endpoint:
    url: str                   # HOST:PORT
    model: str
    version: str = ""
    binary_data: bool = True
    timeout_s: float = 30.0
    # How long an unreachable server is waited for before it counts: a Service lists a pod a moment
    # after it turns Ready, and drops it while its node is marked NotReady (an API server back from
    # an outage does that to every node, until their kubelets report again).
    reach_within_s: float = 0.0
    # Triton's request priority (1 highest); 0 sends none: the model's default level, live traffic's.
    priority: int = 0

    def describe(self) -> str:
        return f"{self.model}{':' + self.version if self.version else ''} at {self.url}"

    def connect(self) -> "Connection":
        return Connection(self)


@dataclass(frozen=True)
class TensorInfo:
    datatype: str
    shape: tuple[int, ...]     # -1 for variable


@dataclass(frozen=True)
class ModelInfo:
    inputs: dict[str, TensorInfo]   # empty when the server declares none
    outputs: list[str]              # in the server's order; empty when undeclared


@dataclass(frozen=True)
class Request:
    """A ready-to-send request, its HTTP body encoded once; shared read-only between threads."""
    sample: Sample
    infer_inputs: list[Any]
    requested_outputs: list[Any] | None
    body: bytes = b""
    json_size: int | None = None     # the JSON header's length when binary tensors follow it
    message: bytes = b""             # the whole HTTP request, headers and body, sent in one write


class Connection:
    def __init__(self, endpoint: Endpoint):
        import tritonclient.http as httpclient  # heavy import, only where a gate talks to a server

        self.endpoint = endpoint
        self._http = httpclient
        self._conn: KeepAlive | None = None   # the inference socket, opened on first use
        try:
            self._client = httpclient.InferenceServerClient(
                endpoint.url, connection_timeout=endpoint.timeout_s, network_timeout=endpoint.timeout_s)
        except Exception as exc:  # bad URL syntax, resolver errors
            raise ServerUnreachable(f"cannot connect to {endpoint.url}: {_message(exc)}") from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        try:
            self._client.close()
        except Exception:
            pass

    def model_info(self) -> ModelInfo:
        """Check the server is live and the model ready, and read the model's metadata."""
        ep = self.endpoint
        self.wait_live()
        try:
            ready = self._client.is_model_ready(ep.model, ep.version)
        except Exception as exc:
            raise ServerUnreachable(f"cannot ask {ep.url} about model {ep.describe()}: {_message(exc)}") from None
        if not ready:
            raise ModelNotReady(f"model {ep.describe()} is not ready (not loaded, or failed to load)")
        try:
            meta = self._client.get_model_metadata(ep.model, ep.version)
        except Exception as exc:
            raise ModelNotReady(f"cannot read the metadata of model {ep.describe()}: {_message(exc)}") from None
        inputs = {t["name"]: TensorInfo(t.get("datatype", ""), tuple(int(d) for d in t.get("shape", [])))
                  for t in meta.get("inputs") or [] if "name" in t}
        outputs = [t["name"] for t in meta.get("outputs") or [] if "name" in t]
        return ModelInfo(inputs=inputs, outputs=outputs)

    def wait_live(self, sleep=time.sleep, clock=time.monotonic) -> None:
        """Return once the server says it is live; raise ServerUnreachable after reach_within_s."""
        ep = self.endpoint
        deadline, pause = clock() + max(ep.reach_within_s, 0.0), 0.5
        while True:
            try:
                problem = None if self._client.is_server_live() else "reports it is not live"
            except Exception as exc:
                problem = f"does not answer: {_message(exc)}"
            if problem is None:
                return
            left = deadline - clock()
            if left <= 0:
                waited = f" (waited {ep.reach_within_s:g}s)" if ep.reach_within_s > 0 else ""
                raise ServerUnreachable(f"the inference server at {ep.url} {problem}{waited}")
            sleep(min(pause, left))
            pause = min(pause * 2, 5.0)

    def build_request(self, sample: Sample, info: ModelInfo) -> Request:
        """Inputs cast to the model's datatypes; raises InputsMismatch when they do not fit."""
        check_inputs(sample, info, self.endpoint)
        infer_inputs = []
        for name, array in sample.inputs.items():
            declared = info.inputs.get(name)
            datatype = declared.datatype if declared and declared.datatype else _datatype_of(array)
            array = _cast(array, datatype, sample, name)
            infer_input = self._http.InferInput(name, list(array.shape), datatype)
            infer_input.set_data_from_numpy(array, binary_data=self.endpoint.binary_data)
            infer_inputs.append(infer_input)
        outputs = None
        if info.outputs:
            outputs = [self._http.InferRequestedOutput(name, binary_data=self.endpoint.binary_data)
                       for name in info.outputs]
        body, json_size = self._http.InferenceServerClient.generate_request_body(
            infer_inputs, outputs=outputs, priority=self.endpoint.priority)
        body = bytes(body)
        headers = [f"POST {self._infer_path} HTTP/1.1", f"Host: {self.endpoint.url}",
                   f"Content-Type: {'application/octet-stream' if json_size else 'application/json'}",
                   *([f"Inference-Header-Content-Length: {json_size}"] if json_size else []),
                   f"Content-Length: {len(body)}"]
        message = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + body
        return Request(sample=sample, infer_inputs=infer_inputs, requested_outputs=outputs,
                       body=body, json_size=json_size, message=message)

    def send(self, request: Request) -> tuple[dict[str, str], bytes]:
        """Send the request's pre-encoded message on this connection's kept-alive socket and
        return the response's headers and body; raises InferenceFailed unless the server said 200.

        Encoding a request once, not per send, and answering with as little Python as possible
        (one write, a minimal HTTP/1.1 reader) is what keeps the gate's own latency out of the
        P99 it measures: re-serialising a 500-candidate request took longer than Triton's batching.
        """
        self.begin(request)
        return self.finish()

    def begin(self, request: Request) -> None:
        """Send the request; `finish` reads its answer. Between the two the caller may wait on
        `socket` with a selector, several connections at once, in one thread."""
        try:
            self._keepalive().begin(request.message)
        except OSError as exc:
            raise InferenceFailed(f"{self.endpoint.url}: {exc}") from None

    def finish(self) -> tuple[dict[str, str], bytes]:
        try:
            status, response_headers, body = self._keepalive().finish()
        except (OSError, HTTPProtocolError) as exc:
            raise InferenceFailed(f"{self.endpoint.url}: {exc}") from None
        if status != 200:
            raise InferenceFailed(_error_text(status, body))
        return response_headers, body

    @property
    def socket(self) -> socket.socket | None:
        return self._conn.socket if self._conn is not None else None

    @property
    def latency_ms(self) -> float | None:
        """The last answered request's latency by the kernel's receive timestamp (see KeepAlive)."""
        return self._conn.latency_ms if self._conn is not None else None

    def abandon(self) -> None:
        """Drop the socket of a request that is not answered (a new one opens for the next)."""
        if self._conn is not None:
            self._conn.close()

    def infer(self, request: Request) -> dict[str, np.ndarray]:
        """Send the request (see `send`) and decode its outputs."""
        response_headers, body = self.send(request)
        return self.decode(response_headers, body)

    def decode(self, response_headers: dict[str, str], body: bytes) -> dict[str, np.ndarray]:
        try:
            header_length = response_headers.get("inference-header-content-length")
            result = self._http.InferenceServerClient.parse_response_body(
                body, header_length=int(header_length) if header_length else None)
        except Exception as exc:
            raise InferenceFailed(f"unreadable response: {_message(exc)}") from None
        names = [o["name"] for o in result.get_response().get("outputs", [])]
        return {name: np.asarray(result.as_numpy(name)) for name in names}

    @property
    def _infer_path(self) -> str:
        ep = self.endpoint
        return f"/v2/models/{ep.model}" + (f"/versions/{ep.version}" if ep.version else "") + "/infer"

    def _keepalive(self) -> "KeepAlive":
        if self._conn is None:
            host, _, port = self.endpoint.url.rpartition(":")
            self._conn = KeepAlive(host.strip("[]") or self.endpoint.url, int(port) if port.isdigit() else 80,
                                   self.endpoint.timeout_s)
        return self._conn


class HTTPProtocolError(Exception):
    """The server's answer is not HTTP/1.1 the reader understands."""


class KeepAlive:
    """One kept-alive HTTP/1.1 socket: a request sent in one write, its response read by a
    minimal parser (status line, headers, a Content-Length or chunked body). One thread at a time.

    The least Python per request that HTTP allows (http.client writes twice and parses headers
    with the email package), and on Linux the kernel's receive timestamp of the response
    (SO_TIMESTAMPNS): `latency_ms` ends when the answer arrived, not when this process, sharing
    the cores with the server it measures, next got to run. The kernel switches timestamps on a
    moment after the first socket asks, so the first answers may carry none (latency_ms None).
    """

    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._stamps = sys.platform == "linux"
        self._sent_ns = self._received_ns = 0

    @property
    def latency_ms(self) -> float | None:
        """The last exchange's latency: from just before its request was written to the kernel's
        receive time of its answer's last read; None without a usable timestamp."""
        if self._received_ns and self._sent_ns <= self._received_ns <= time.time_ns():
            return (self._received_ns - self._sent_ns) / 1e6
        return None     # no timestamp, or the wall clock stepped meanwhile

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer.clear()

    @property
    def socket(self) -> socket.socket | None:
        """The socket a request was last sent on (for a selector waiting on several)."""
        return self._sock

    def exchange(self, message: bytes) -> tuple[int, dict[str, str], bytes]:
        self.begin(message)
        return self.finish()

    def begin(self, message: bytes) -> None:
        """Send a request; `finish` reads its response (after a selector says it is readable)."""
        self._message, self._reused = message, self._sock is not None
        try:
            self._send(message)
        except (BrokenPipeError, ConnectionResetError):
            self.close()
            if not self._reused:
                raise
            self._reused = False    # a kept-alive socket the server closed: reconnect once
            self._send(message)

    def finish(self) -> tuple[int, dict[str, str], bytes]:
        try:
            return self._response()
        except (_ClosedBeforeAnswer, ConnectionResetError):
            self.close()
            if not self._reused:
                raise ConnectionResetError("the server closed the connection without answering") from None
        except BaseException:
            self.close()            # a half-read response leaves the socket unusable
            raise
        self._reused = False        # closed unanswered on a kept-alive socket: send it again once
        try:
            self._send(self._message)
            return self._response()
        except _ClosedBeforeAnswer:
            self.close()
            raise ConnectionResetError("the server closed the connection without answering") from None
        except BaseException:
            self.close()
            raise

    def _send(self, message: bytes) -> None:
        if self._sock is None:
            self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._stamps:
                try:
                    self._sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                except OSError:
                    self._stamps = False
        self._received_ns = 0
        self._sent_ns = time.time_ns()  # the receive timestamps are of the wall clock
        try:
            self._sock.sendall(message)
        except (BrokenPipeError, ConnectionResetError):
            raise
        except BaseException:
            self.close()
            raise

    def _fill(self) -> bool:
        if self._stamps:
            chunk, ancillary, _, _ = self._sock.recvmsg(262144, _STAMP_SPACE)
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
                    seconds, nanoseconds = struct.unpack("qq", data[:16])
                    self._received_ns = seconds * 1_000_000_000 + nanoseconds
        else:
            chunk = self._sock.recv(262144)
        if chunk:
            self._buffer += chunk
        return bool(chunk)

    def _response(self) -> tuple[int, dict[str, str], bytes]:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if not self._fill():
                if buffer:
                    raise HTTPProtocolError("the connection closed inside the response's headers")
                raise _ClosedBeforeAnswer()
        lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
        del buffer[:end + 4]
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise HTTPProtocolError(f"not an HTTP/1.1 response: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if code[0] == "1":                      # 100 Continue and friends: the answer follows
            return self._response()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._chunked()
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        else:                                   # the body runs to the end of the connection
            while self._fill():
                pass
            body = bytes(buffer)
            buffer.clear()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close" or version == "HTTP/1.0":
            self.close()
        return int(code), headers, body

    def _exactly(self, length: int) -> bytes:
        buffer = self._buffer
        while len(buffer) < length:
            if not self._fill():
                raise HTTPProtocolError("the connection closed inside the response's body")
        body = bytes(buffer[:length])
        del buffer[:length]
        return body

    def _line(self) -> bytes:
        buffer = self._buffer
        while (end := buffer.find(b"\r\n")) < 0:
            if not self._fill():
                raise HTTPProtocolError("the connection closed inside a chunked body")
        line = bytes(buffer[:end])
        del buffer[:end + 2]
        return line

    def _chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self._line().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self._line():             # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._exactly(size))
            self._line()


class _ClosedBeforeAnswer(Exception):
    pass


_SO_TIMESTAMPNS = 35        # Linux's value; Python's socket module does not name it
_STAMP_SPACE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0


def rejects_binary_data(endpoint: Endpoint, sample: Sample, info: ModelInfo) -> bool:
    """After a failure with binary tensors: does the same request succeed as plain JSON?

    Plain v2 servers (MLServer, for one) answer Triton's binary extension with 4xx errors;
    that is a misconfigured gate (--no-binary-data missing), not a faulty model.
    """
    if not endpoint.binary_data:
        return False
    try:
        connection = replace(endpoint, binary_data=False).connect()
    except GateClientError:
        return False
    try:
        connection.infer(connection.build_request(sample, info))
        return True
    except (GateClientError, SamplesError):
        return False
    finally:
        connection.close()


BINARY_HINT = ("the server rejects Triton's binary tensor extension but accepts plain JSON tensors; "
               "pass --no-binary-data for this server")


def check_inputs(sample: Sample, info: ModelInfo, endpoint: Endpoint) -> None:
    if not info.inputs:
        return  # the server declares nothing: let it judge the request
    given, wanted = set(sample.inputs), set(info.inputs)
    if given != wanted:
        raise InputsMismatch(
            f"model {endpoint.describe()} takes inputs {sorted(wanted)}, but sample {sample.line} "
            f"provides {sorted(given)}" + _diff(wanted, given))
    for name, array in sample.inputs.items():
        shape = info.inputs[name].shape
        if shape and (len(shape) != array.ndim
                      or any(d != -1 and d != s for d, s in zip(shape, array.shape))):
            raise InputsMismatch(f"model {endpoint.describe()} takes input {name!r} of shape "
                                 f"{list(shape)}, but sample {sample.line} has shape {list(array.shape)}")


def _diff(wanted: set[str], given: set[str]) -> str:
    parts = []
    if wanted - given:
        parts.append(f"missing {sorted(wanted - given)}")
    if given - wanted:
        parts.append(f"unexpected {sorted(given - wanted)}")
    return " (" + ", ".join(parts) + ")"


def _datatype_of(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(array.dtype)


def _cast(array: np.ndarray, datatype: str, sample: Sample, name: str) -> np.ndarray:
    from tritonclient.utils import triton_to_np_dtype

    np_type = triton_to_np_dtype(datatype)
    if np_type is None or np_type is np.object_:
        raise SamplesError(f"sample {sample.line}: input {name!r} has datatype {datatype}, "
                           "which the gates cannot send")
    cast = array.astype(np_type)
    if array.dtype.kind == "f" and np.dtype(np_type).kind in "iub" and not np.array_equal(cast, array):
        raise SamplesError(f"sample {sample.line}: input {name!r} is {datatype} but holds fractional "
                           "values; record integers for it")
    return cast


def _error_text(status: int, body: bytes) -> str:
    """The server's error: v2 JSON {"error": ...}, or the status and the body's start."""
    import json

    try:
        error = json.loads(body.decode("utf-8", errors="replace")).get("error")
    except (ValueError, AttributeError):
        error = None
    text = str(error) if error else f"HTTP {status}: {body[:200].decode('utf-8', errors='replace')}"
    return " ".join(text.split())[:300]


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None)
    text = text() if callable(text) else text
    text = str(text or exc) or type(exc).__name__
    # A plain-text error body (not v2 JSON) makes tritonclient report a decoding failure;
    # the status and the body are what the reader needs.
    status = getattr(exc, "status", lambda: None)()
    details = getattr(exc, "debug_details", lambda: None)()
    if status and details and text.startswith("an exception occurred in the client while decoding"):
        text = f"HTTP {status}: {details}"
    return " ".join(text.split())[:300]
