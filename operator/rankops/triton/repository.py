"""Triton's model repository API (explicit model control) for the in-place version switch (issue 41):
the index (which versions a pod has loaded, in what state), load, and unload.

Two versions are served at once by loading the model with a config override whose version policy
lists both (`with_versions`); one version is dropped the same way, listing only the one to keep:
Triton's unload endpoint takes the whole model down, every version at once.

The pod's answer is its tenant's, read as its metrics are (bounded_http): one deadline, a capped
body, no redirect. The index is checked as Triton writes it: a list of entries, each a model name,
a numeric version and a known state, at most MAX_INDEX_ENTRIES of them; anything else is refused.
The model-repository API is behind the model's restricted-API key (render/serving.py): the caller
passes its header.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rankops.triton import bounded_http

STATES = ("READY", "LOADING", "UNLOADING", "UNAVAILABLE")
# The header a caller of the restricted APIs carries the key in: the server is started with it
# (render/serving.py), the operator's shell sends it, and the shared server's router checks it.
API_KEY_HEADER = "rankops-api-key"
# A rankops pod's repository holds one model and the few versions of a switch; Triton writes about
# 80 bytes an entry. 64 KiB and 256 entries leave room for a shared server's many models.
MAX_INDEX_BYTES = 64 << 10
MAX_INDEX_ENTRIES = 256
MAX_REASON_CHARS = 1024
INDEX_DEADLINE_S = 2.0
# A load answers when the version is READY or failed: an ONNX model with the TensorRT accelerator
# builds its engine first (render/serving.startup_seconds gives such a pod 1800 s to start).
LOAD_DEADLINE_S = 1800.0
UNLOAD_DEADLINE_S = 60.0
MAX_ERROR_BYTES = 64 << 10
# A rendered config is a few KiB; a model's labels or warm-up data live in files, not in it.
MAX_CONFIG_BYTES = 256 << 10
CONFIG_DEADLINE_S = 5.0


class RepositoryError(Exception):
    """The request was not done, or the answer not Triton's; the message says which, for status."""


class KeyRefused(RepositoryError):
    """Triton refused the restricted API's key (401/403): the key the caller holds is not the pod's."""


def _refusal(code: int, message: str) -> RepositoryError:
    return (KeyRefused if code in (401, 403) else RepositoryError)(message)


@dataclass(frozen=True)
class IndexEntry:
    name: str
    version: int
    state: str
    reason: str = ""


def config_json(pbtxt: str) -> dict[str, Any]:
    """A config.pbtxt (Triton's model config in protobuf text) as the JSON a load's config override takes."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    try:
        message = text_format.Parse(pbtxt, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"config.pbtxt is not a Triton model config: {exc}") from None
    return json.loads(json_format.MessageToJson(message, preserving_proto_field_name=True))


def with_versions(config: Mapping[str, Any], versions: Iterable[int]) -> dict[str, Any]:
    """`config` (Triton's model config as JSON, e.g. the rendered config.pbtxt converted) with a
    version policy that holds exactly `versions`."""
    held = sorted({int(v) for v in versions})
    if not held or any(v < 1 for v in held):
        raise ValueError(f"a version policy needs Triton versions >= 1, got {held}")
    out = copy.deepcopy(dict(config))
    out["version_policy"] = {"specific": {"versions": held}}
    return out


@dataclass(frozen=True)
class Repository:
    """One Triton's repository API at HOST:PORT (its HTTP port), with the key header of its model."""
    host: str
    port: int
    headers: Mapping[str, str] | None = None

    def index(self, deadline_s: float = INDEX_DEADLINE_S) -> list[IndexEntry]:
        """Every version Triton knows of, loaded or not (an unloaded one: UNAVAILABLE, reason "unloaded")."""
        code, body = self._post("/v2/repository/index", {"ready": False}, deadline_s, MAX_INDEX_BYTES)
        if code != 200:
            raise _refusal(code, f"{self._where}: index refused: {_error(code, body)}")
        return parse_index(body, self._where)

    def versions(self, model: str, deadline_s: float = INDEX_DEADLINE_S) -> dict[int, IndexEntry]:
        """The index entries of `model`, by Triton version."""
        return {e.version: e for e in self.index(deadline_s) if e.name == model}

    def model_config(self, model: str, deadline_s: float = CONFIG_DEADLINE_S) -> dict[str, Any]:
        """The config `model` is loaded with, as this Triton holds it (GET /v2/models/M/config), checked to be
        a Triton model config of that name: the base of an in-place load's override, so a load changes the
        version policy and nothing else the pod was started with."""
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2

        try:
            code, body = bounded_http.exchange(self.host, self.port, "GET", f"/v2/models/{_name(model)}/config", b"",
                                               deadline_s=deadline_s, max_bytes=MAX_CONFIG_BYTES, headers=self.headers,
                                               redirect_note="the model's config is asked of the pod itself",
                                               error_bodies=True, http11=True)
        except bounded_http.AnswerRefused as exc:
            raise RepositoryError(str(exc)) from None
        if code != 200:
            raise _refusal(code, f"{self._where}: config of {model} refused: {_error(code, body)}")
        try:
            message = json_format.ParseDict(json.loads(body), model_config_pb2.ModelConfig())
        except (ValueError, RecursionError, TypeError, AttributeError, json_format.ParseError) as exc:
            raise RepositoryError(f"{self._where}: config of {model} is not a Triton model config: "
                                  f"{bounded_http.printable(str(exc))[:200]}") from None
        if message.name != model:
            raise RepositoryError(f"{self._where}: config of {model} names model "
                                  f"{bounded_http.printable(message.name)[:100]}")
        return json.loads(json_format.MessageToJson(message, preserving_proto_field_name=True))

    def load(self, model: str, config: Mapping[str, Any] | None = None,
             deadline_s: float = LOAD_DEADLINE_S) -> None:
        """Load (or reload) `model`, with `config` (JSON) replacing its config.pbtxt when given."""
        body = {"parameters": {"config": json.dumps(config, separators=(",", ":"))}} if config is not None else {}
        code, answer = self._post(f"/v2/repository/models/{_name(model)}/load", body, deadline_s, MAX_ERROR_BYTES)
        if code != 200:
            raise _refusal(code, f"{self._where}: load of {model} refused: {_error(code, answer)}")

    def unload(self, model: str, deadline_s: float = UNLOAD_DEADLINE_S) -> None:
        """Unload every version of `model`; models that depend on it (ensembles) stay."""
        code, answer = self._post(f"/v2/repository/models/{_name(model)}/unload",
                                  {"parameters": {"unload_dependents": False}}, deadline_s, MAX_ERROR_BYTES)
        if code != 200:
            raise _refusal(code, f"{self._where}: unload of {model} refused: {_error(code, answer)}")

    @property
    def _where(self) -> str:
        return f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"

    def _post(self, path: str, body: dict, deadline_s: float, max_bytes: int) -> tuple[int, bytes]:
        try:
            return bounded_http.exchange(self.host, self.port, "POST", path, json.dumps(body).encode(),
                                         deadline_s=deadline_s, max_bytes=max_bytes, headers=self.headers,
                                         redirect_note="the repository API is asked of the pod itself",
                                         error_bodies=True, http11=True)
        except bounded_http.AnswerRefused as exc:
            raise RepositoryError(str(exc)) from None


def parse_index(body: bytes, where: str = "index") -> list[IndexEntry]:
    """Triton's index answer, strictly."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):   # RecursionError: 60 KiB of "[" nests past the parser's stack
        raise RepositoryError(f"{where}: index is not JSON") from None
    if not isinstance(data, list):
        raise RepositoryError(f"{where}: index is not a list")
    if len(data) > MAX_INDEX_ENTRIES:
        raise RepositoryError(f"{where}: index of {len(data)} entries, over {MAX_INDEX_ENTRIES}")
    entries, seen = [], set()
    for item in data:
        if not isinstance(item, dict):
            raise RepositoryError(f"{where}: index entry {bounded_http.printable(str(item))} is not an object")
        name, version, state = item.get("name"), item.get("version"), item.get("state", "UNAVAILABLE")
        reason = item.get("reason", "")
        if not isinstance(name, str) or not 0 < len(name) <= 256:
            raise RepositoryError(f"{where}: index entry without a model name")
        if version is None:       # a model Triton knows of but never loaded: no version to speak of
            continue
        if not isinstance(version, str) or not (version.isascii() and version.isdigit()) or len(version) > 19:
            raise RepositoryError(f"{where}: model {bounded_http.printable(name)}: version "
                                  f"{bounded_http.printable(str(version))} is not a Triton version")
        if state not in STATES:
            raise RepositoryError(f"{where}: model {bounded_http.printable(name)} v{version}: state "
                                  f"{bounded_http.printable(str(state))} is not one Triton writes")
        if not isinstance(reason, str):
            raise RepositoryError(f"{where}: model {bounded_http.printable(name)} v{version}: reason is not text")
        key = (name, int(version))
        if key in seen:
            raise RepositoryError(f"{where}: model {bounded_http.printable(name)} v{version} listed twice")
        seen.add(key)
        entries.append(IndexEntry(name, int(version), state, " ".join(reason.split())[:MAX_REASON_CHARS]))
    return entries


def _name(model: str) -> str:
    # A model name becomes a path segment: the operator's names are DNS labels; refuse anything else.
    if not model or not all(c.isalnum() or c in "-_." for c in model) or model in (".", ".."):
        raise ValueError(f"model name {model!r} cannot be a path segment")
    return model


def _error(code: int, body: bytes) -> str:
    """Triton's {"error": ...} or the status and the body's start, on one line."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    text = str(error) if error else f"HTTP {code}: {body[:200].decode('utf-8', errors='replace')}"
    return " ".join(text.split())[:300]
