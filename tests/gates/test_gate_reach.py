"""A gate waits a bounded time for a server that does not answer yet (a Service lists a pod a
moment after it turns Ready; an API server back from an outage marks every pod NotReady until its
kubelet reports again), then says ServerUnreachable with how long it waited."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rankops.triton.client import Endpoint, ServerUnreachable
from rankops_dev.ports import free_port


class _Live(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/v2/health/live" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_server_that_comes_up_within_the_wait_is_reached():
    port = free_port()
    servers = []

    def start_late():
        time.sleep(1.5)
        server = ThreadingHTTPServer(("127.0.0.1", port), _Live)
        servers.append(server)
        server.serve_forever()

    started = time.monotonic()    # before the thread: its 1.5 s sleep counts from here
    threading.Thread(target=start_late, daemon=True).start()
    connection = Endpoint(url=f"127.0.0.1:{port}", model="m", timeout_s=2, reach_within_s=20).connect()
    try:
        connection.wait_live()
        assert 1.0 < time.monotonic() - started < 15
    finally:
        connection.close()
        while not servers:
            time.sleep(0.1)
        servers[0].shutdown()


@pytest.mark.parametrize("within", [0.0, 2.0])
def test_a_server_that_never_answers_is_unreachable_after_the_wait(within):
    port = free_port()
    connection = Endpoint(url=f"127.0.0.1:{port}", model="m", timeout_s=1, reach_within_s=within).connect()
    try:
        started = time.monotonic()
        with pytest.raises(ServerUnreachable) as caught:
            connection.wait_live()
        took = time.monotonic() - started
    finally:
        connection.close()
    assert within <= took < within + 5
    assert f"127.0.0.1:{port} does not answer" in str(caught.value)
    assert ("waited 2s" in str(caught.value)) == (within > 0)
