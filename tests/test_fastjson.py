"""controller/fastjson.py: orjson in kopf's watch decoding and the watch cache, byte for byte what json gave."""
from __future__ import annotations

import inspect
import json

from kopf._cogs.clients import api as kopf_api

from rankops.controller import fastjson
from rankops.controller.cache import WatchCache


def test_kopf_still_decodes_watch_lines_with_its_api_modules_json_loads():
    """The one line speed_up_kopf_watches relies on: a kopf release that moves it fails here,
    instead of the operator quietly decoding with the slow json again."""
    assert "json.loads(line.decode('utf-8'))" in inspect.getsource(kopf_api.stream), \
        "kopf's watch stream no longer decodes with api.json.loads: update controller/fastjson.py"


def test_kopf_watches_decode_with_orjson_and_the_rest_of_json_is_untouched(monkeypatch):
    monkeypatch.setattr(kopf_api, "json", json)
    fastjson.speed_up_kopf_watches()
    fastjson.speed_up_kopf_watches()   # twice: still one layer
    assert kopf_api.json.loads is fastjson.loads and kopf_api.json.dumps is json.dumps
    line = b'{"type":"MODIFIED","object":{"metadata":{"name":"m","labels":{"a":"\\u00e9"}},"spec":{"n":1.5}}}'
    assert kopf_api.json.loads(line.decode("utf-8")) == json.loads(line)
    # what orjson refuses, json reads: a hostile number never breaks the watch
    assert kopf_api.json.loads('{"a": NaN, "b": 1e400}')["b"] == float("inf")


def test_the_cache_encodes_as_compact_json_did():
    obj = {"metadata": {"name": "m", "namespace": "n", "resourceVersion": "7", "labels": {"z": "1", "a": "é"}},
           "spec": {"b": [1, 2.5, None, True], "a": {"y": "x"}}}
    assert fastjson.dumps(obj) == json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    assert fastjson.dumps(obj, sort_keys=True) == \
        json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert fastjson.dumps({"big": 2 ** 70}) == b'{"big":1180591620717411303424}'
    cache = WatchCache()
    cache.observe("Deployment", obj)
    assert cache.get("Deployment", "n", "m") == obj
