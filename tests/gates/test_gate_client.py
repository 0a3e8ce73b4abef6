"""Model references and URLs as the gate command lines take them; the gates' HTTP/1.1 client."""
import time

import pytest

from rankops.triton.client import normalize_url, parse_model_ref


@pytest.mark.parametrize("text, ref", [("ranker", ("ranker", "")), ("ranker:3", ("ranker", "3")),
                                       ("ctr-ranker_v2:12", ("ctr-ranker_v2", "12"))])
def test_model_ref(text, ref):
    assert parse_model_ref(text) == ref


@pytest.mark.parametrize("text", ["", ":3", "ranker:latest", "ranker:1:2"])
def test_bad_model_ref(text):
    with pytest.raises(ValueError, match="NAME or NAME:VERSION"):
        parse_model_ref(text)


@pytest.mark.parametrize("text, url", [("svc:8000", "svc:8000"), ("http://svc:8000/", "svc:8000"),
                                       (" https://svc.ns.svc:8000 ", "svc.ns.svc:8000")])
def test_url(text, url):
    assert normalize_url(text) == url


def test_empty_url():
    with pytest.raises(ValueError, match="HOST:PORT"):
        normalize_url("http://")


# --- The kept-alive HTTP/1.1 reader the gates send inference requests with ----------------

class _Scripted:
    """A one-connection-at-a-time server answering each request with the next scripted bytes
    (None: close the connection without answering); records what it received."""

    def __init__(self, answers):
        import socket
        import threading

        self.answers, self.received, self.connections = list(answers), [], 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.answers:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return          # closed by the test with answers left
            self.connections += 1
            with conn:
                while self.answers:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
                    while len(body) < length:
                        body += conn.recv(65536)
                    self.received.append((head, body))
                    answer = self.answers.pop(0)
                    if answer is None:
                        break
                    conn.sendall(answer)
                    if b"connection: close" in answer.lower():
                        break

    def close(self):
        self.listener.close()


def _message(body: bytes = b"x" * 70000) -> bytes:
    return b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def test_keepalive_reads_length_and_chunked_bodies_on_one_socket():
    from rankops.triton.client import KeepAlive

    big = bytes(range(256)) * 1000
    server = _Scripted([b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nInference-Header-Content-Length: 3\r\n\r\n" % len(big) + big,
                        b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"er\r\n6;x=1\r\nror\":1\r\n1\r\n}\r\n0\r\n\r\n"])
    try:
        conn = KeepAlive("127.0.0.1", server.port, 5)
        status, headers, body = conn.exchange(_message())
        assert (status, body, headers["inference-header-content-length"]) == (200, big, "3")
        assert conn.exchange(_message(b"{}")) == (400, {"transfer-encoding": "chunked"}, b'{"error":1}')
        assert server.connections == 1 and [len(b) for _, b in server.received] == [70000, 2]
    finally:
        server.close()


def test_keepalive_latency_ends_at_the_kernel_receive_timestamp():
    """The kernel turns receive timestamps on a moment after the first socket asks (Linux defers
    the switch to a work item), so the first answers may carry none: the gates then fall back to
    the process clock. Within a few exchanges every answer is stamped, inside the call's time."""
    from rankops.triton.client import KeepAlive

    big = bytes(range(256)) * 1000
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big
    server = _Scripted([answer] * 50)
    try:
        conn = KeepAlive("127.0.0.1", server.port, 5)
        stamped = []
        for _ in range(50):
            start = time.perf_counter()
            assert conn.exchange(_message())[2] == big
            elapsed_ms = (time.perf_counter() - start) * 1000
            if conn.latency_ms is not None:
                stamped.append((conn.latency_ms, elapsed_ms))
                if len(stamped) == 5:
                    break
            else:
                time.sleep(0.05)
        assert len(stamped) == 5, "no kernel receive timestamps in 50 exchanges"
        assert all(0 < latency <= elapsed + 0.5 for latency, elapsed in stamped), stamped
    finally:
        server.close()


def test_keepalive_reconnects_once_when_the_server_closed_the_kept_socket():
    from rankops.triton.client import KeepAlive

    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server = _Scripted([ok, None, ok, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye", ok])
    try:
        conn = KeepAlive("127.0.0.1", server.port, 5)
        assert conn.exchange(_message())[2] == b"ok"
        assert conn.exchange(_message())[2] == b"ok"      # closed unanswered: sent again on a new socket
        assert conn.exchange(_message())[2] == b"bye"     # Connection: close is honoured ...
        assert conn.exchange(_message())[2] == b"ok"      # ... by opening a new one for the next request
        assert server.connections == 3
    finally:
        server.close()


def test_keepalive_fails_a_fresh_connection_closed_without_an_answer():
    from rankops.triton.client import KeepAlive

    server = _Scripted([None])
    try:
        with pytest.raises(ConnectionResetError, match="without answering"):
            KeepAlive("127.0.0.1", server.port, 5).exchange(_message())
    finally:
        server.close()
