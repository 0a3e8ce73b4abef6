"""JSON for the operator's hot path, with orjson: every watch event of every watched kind is decoded
once by kopf and encoded twice by the watch cache (controller/cache.py). At N=500 new models that
was 45% of the operator's CPU (py-spy, benchmarks/reconcile_bench.py --profile-cpu): json.loads
26%, json.dumps 16%. orjson decodes a Deployment's watch event 2.4x and encodes it 8x faster."""
from __future__ import annotations

import json
import types
from typing import Any

import orjson

from kopf._cogs.clients import api as kopf_api


def dumps(obj: Any, sort_keys: bool = False) -> bytes:
    """Compact UTF-8 JSON bytes. What orjson refuses (an integer beyond 64 bits, a non-string key)
    the json module encodes, as before."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except TypeError:
        return json.dumps(obj, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode()


def loads(text: str | bytes) -> Any:
    """What json.loads gives. orjson refuses NaN and numbers beyond a double; json reads them."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def speed_up_kopf_watches() -> None:
    """kopf decodes each watch line with the `json` module its api module imported
    (`json.loads(line.decode('utf-8'))`): give that module orjson's loads, nothing else changes.
    tests/test_fastjson.py fails if a kopf release moves that line."""
    if getattr(kopf_api.json, "__name__", "") != "rankops-orjson":
        fast = types.SimpleNamespace(**{name: getattr(json, name) for name in dir(json) if not name.startswith("__")})
        fast.loads, fast.__name__ = loads, "rankops-orjson"
        kopf_api.json = fast
