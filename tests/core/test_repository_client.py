"""Issue 41: the repository API client against pods that answer what they like: bounded in time and
bytes, Triton's index or nothing, Triton's error said back (the real server: tests/triton)."""
from __future__ import annotations

import json
import time

import pytest

from rankops.triton.repository import (MAX_INDEX_ENTRIES, IndexEntry, KeyRefused, Repository, RepositoryError,
                                       parse_index, with_versions)
from tests.hostile import Endpoint


def http(body: bytes, head: str = "HTTP/1.1 200 OK\r\n") -> bytes:
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def send(payload: bytes):
    return lambda conn, stop: conn.sendall(payload)


def silent(conn, stop):
    stop.wait(30)


def endless(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n[")
    while not stop.is_set():
        conn.sendall(b'{"name": "ranker", "version": "1", "state": "READY"},' * 100)


def asked(behave, call):
    server = Endpoint(behave)
    try:
        started = time.monotonic()
        with pytest.raises(RepositoryError) as raised:
            call(Repository("127.0.0.1", server.port))
        return str(raised.value), time.monotonic() - started
    finally:
        server.close()


@pytest.mark.parametrize("behave, says", [
    (silent, "no full answer in 2s"),
    (endless, "body over 64 KiB"),
    (send(b"HTTP/1.1 200 OK\r\nContent-Length: 900000000\r\n\r\n"), "body over 64 KiB (Content-Length 900000000)"),
    (send(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://10.0.0.1/\r\nContent-Length: 0\r\n\r\n"),
     "redirect (307) to 'http://10.0.0.1/' refused: the repository API is asked of the pod itself"),
    (send(http(b"<html>")), "index is not JSON"),
    (send(http(b'{"models": []}')), "index is not a list"),
    (send(http(b'[{"name": "ranker", "version": "../1", "state": "READY"}]')), "is not a Triton version"),
    (send(http(b'[{"name": "ranker", "version": "1", "state": "SERVING"}]')), "state 'SERVING' is not one Triton"),
    (send(http(json.dumps([{"name": "ranker", "version": "1", "state": "READY"}] * 2).encode())), "listed twice"),
    (send(http(json.dumps([{"name": "ranker", "version": "\u00b2", "state": "READY"}]).encode())),
     "is not a Triton version"),
    (send(http(b"[" * 60000)), "index is not JSON"),
    (send(http(json.dumps([{"name": f"m{i}", "version": "1"} for i in range(MAX_INDEX_ENTRIES + 1)]).encode())),
     f"over {MAX_INDEX_ENTRIES}"),
    (send(http(b'{"error": "This API is restricted"}', "HTTP/1.1 400 Bad Request\r\n")),
     "index refused: This API is restricted"),
])
def test_an_index_answer_is_triton_s_or_refused_within_its_deadline(behave, says):
    message, took = asked(behave, lambda repo: repo.index())
    assert says in message and message.startswith("127.0.0.1:")
    assert took < 3.0


def test_a_refused_key_is_its_own_error():
    # tritonserver 2.51 answers a restricted API without the right key 403 (measured)
    refused = http(b'{"error":"This API is restricted, expecting header \'rankops-api-key\'"}', "HTTP/1.1 403 Forbidden\r\n")
    server = Endpoint(send(refused))
    try:
        with pytest.raises(KeyRefused, match="index refused: This API is restricted"):
            Repository("127.0.0.1", server.port).index()
    finally:
        server.close()
    other = Endpoint(send(http(b'{"error": "bad"}', "HTTP/1.1 400 Bad Request\r\n")))
    try:
        with pytest.raises(RepositoryError) as raised:
            Repository("127.0.0.1", other.port).index()
        assert not isinstance(raised.value, KeyRefused)
    finally:
        other.close()


def test_a_refused_load_says_triton_s_error():
    error = http(b'{"error": "failed to load \'ranker\' version 9: Not found"}', "HTTP/1.1 400 Bad Request\r\n")
    message, _ = asked(send(error), lambda repo: repo.load("ranker", {"name": "ranker"}))
    assert message.endswith("load of ranker refused: failed to load 'ranker' version 9: Not found")


def test_the_index_is_read_as_triton_writes_it():
    body = json.dumps([{"name": "ranker", "version": "3", "state": "READY", "reason": ""},
                       {"name": "ranker", "version": "4", "state": "UNAVAILABLE", "reason": "unloaded"},
                       {"name": "other"}]).encode()
    assert parse_index(body) == [IndexEntry("ranker", 3, "READY"), IndexEntry("ranker", 4, "UNAVAILABLE", "unloaded")]


def test_the_request_carries_the_key_and_the_override():
    seen = {}

    def capture(conn):         # in place of Endpoint's reader: keep the request
        seen["request"] = conn.recv(65536)
        conn.sendall(http(b""))
        conn.close()

    server = Endpoint(send(b""))
    server._one = capture
    try:
        Repository("127.0.0.1", server.port, {"rankops-api-key": "k"}).load(
            "ranker", with_versions({"name": "ranker"}, [4, 3]))
    finally:
        server.close()
    head, _, body = seen["request"].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v2/repository/models/ranker/load HTTP/1.1") and b"rankops-api-key: k" in head
    config = json.loads(json.loads(body)["parameters"]["config"])
    assert config == {"name": "ranker", "version_policy": {"specific": {"versions": [3, 4]}}}


def test_names_and_versions_are_checked_before_anything_is_sent():
    with pytest.raises(ValueError):
        Repository("127.0.0.1", 1).load("../etc")
    with pytest.raises(ValueError):
        with_versions({}, [])


@pytest.mark.parametrize("behave, says", [
    (silent, "no full answer in 5s"),
    (send(b"HTTP/1.1 200 OK\r\nContent-Length: 900000000\r\n\r\n"), "body over 256 KiB"),
    (send(http(b"<html>")), "is not a Triton model config"),
    (send(http(b'{"name": "ranker", "max_batch_size": "many"}')), "is not a Triton model config"),
    (send(http(b'{"name": "ranker", "backdoor": true}')), "is not a Triton model config"),
    (send(http(b'{"name": "other", "max_batch_size": 8}')), "config of ranker names model 'other'"),
    (send(http(b'{"error": "Request for unknown model"}', "HTTP/1.1 400 Bad Request\r\n")),
     "config of ranker refused: Request for unknown model"),
])
def test_a_config_answer_is_triton_s_model_config_of_that_model_or_refused(behave, says):
    message, took = asked(behave, lambda repo: repo.model_config("ranker"))
    assert says in message and took < 8, message


def test_a_config_answer_comes_back_as_the_json_a_load_override_takes():
    body = json.dumps({"name": "ranker", "max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32",
                                                                         "dims": ["4"]}],
                       "instance_group": [{"kind": "KIND_GPU", "count": 1}]}).encode()
    server = Endpoint(send(http(body)))
    try:
        config = Repository("127.0.0.1", server.port).model_config("ranker")
    finally:
        server.close()
    assert config["name"] == "ranker" and config["input"][0]["dims"] == ["4"]
    assert with_versions(config, [2, 1])["version_policy"] == {"specific": {"versions": [1, 2]}}
