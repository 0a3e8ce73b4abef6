"""KServe v2 inference over HTTP, through tritonclient, for the gates.

Triton's binary tensor extension is on by default; `binary_data=False` sends and receives plain
JSON tensors, which every v2 server (MLServer, KServe runtimes) accepts. A request is built once
from a sample and the model's metadata (inputs cast to the declared datatypes) and can then be
sent any number of times from any thread; each thread opens its own `Connection`, because a
tritonclient HTTP client must not be shared between threads.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rankops.gates.samples import Sample, SamplesError


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


class Connection:
    def __init__(self, endpoint: Endpoint):
        import tritonclient.http as httpclient  # heavy import, only where a gate talks to a server

        self.endpoint = endpoint
        self._http = httpclient
        self._conn = None          # http.client connection for inference, opened on first use
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
        try:
            live = self._client.is_server_live()
        except Exception as exc:
            raise ServerUnreachable(f"the inference server at {ep.url} does not answer: {_message(exc)}") from None
        if not live:
            raise ServerUnreachable(f"the inference server at {ep.url} reports it is not live")
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
        body, json_size = self._http.InferenceServerClient.generate_request_body(infer_inputs, outputs=outputs)
        return Request(sample=sample, infer_inputs=infer_inputs, requested_outputs=outputs,
                       body=bytes(body), json_size=json_size)

    def infer(self, request: Request) -> dict[str, np.ndarray]:
        """Send the request's pre-encoded body on this connection's kept-alive socket.

        Encoding a request once, not per send, is what keeps the gate's own latency out of the
        P99 it measures: re-serialising a 500-candidate request took longer than Triton's batching.
        """
        ep = self.endpoint
        headers = {"Content-Type": "application/octet-stream" if request.json_size else "application/json"}
        if request.json_size:
            headers["Inference-Header-Content-Length"] = str(request.json_size)
        try:
            status, response_headers, body = self._post(self._infer_path, request.body, headers)
        except OSError as exc:
            raise InferenceFailed(f"{ep.url}: {exc}") from None
        if status != 200:
            raise InferenceFailed(_error_text(status, body))
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

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        import http.client

        for attempt in (1, 2):      # a kept-alive socket the server closed: reconnect once
            if self._conn is None:
                host, _, port = self.endpoint.url.rpartition(":")
                self._conn = http.client.HTTPConnection(host or self.endpoint.url, int(port) if port.isdigit() else 80,
                                                        timeout=self.endpoint.timeout_s)
            try:
                self._conn.request("POST", path, body=body, headers=headers)
                response = self._conn.getresponse()
                data = response.read()
                return response.status, {k.lower(): v for k, v in response.getheaders()}, data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                    http.client.CannotSendRequest):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


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
