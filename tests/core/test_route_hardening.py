"""Issue 42: the per-model router (triton/route.py) against hostile clients, over a fake upstream that
records what reaches it (the real-Triton tests are in tests/triton/test_shared_server_on_triton.py)."""
import asyncio
import json

import pytest

from rankops.triton import route
from rankops_dev.ports import free_port

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Upstream:
    def __init__(self):
        self.received = bytearray()

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.received += head
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.received += await reader.readexactly(length)
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def _exchange(port: int, data: bytes, read_s: float = 2.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), read_s):
            answer += chunk
    except asyncio.TimeoutError:
        pass
    writer.close()
    return answer


def _with_router(test, routes=None, upstream_up=True, **router_args):
    async def main():
        upstream = Upstream()
        up_port = free_port()
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", up_port) if upstream_up else None
        router = route.Router(("127.0.0.1", up_port), "127.0.0.1", **{"idle_timeout_s": 1.0, **router_args})
        port = free_port()
        await router.apply(routes or {port: "coarse"})
        try:
            return await test(router, port, upstream)
        finally:
            await router.close()
            if server:
                server.close()
    return asyncio.run(main())


def test_a_members_request_passes_and_the_answer_comes_back():
    async def test(router, port, upstream):
        answer = await _exchange(port, b"POST /v2/models/coarse/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                                       b"GET /v2/models/coarse/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.count(b"200 OK") == 2
        assert bytes(upstream.received).endswith(b"abc" + b"GET /v2/models/coarse/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    _with_router(test)


@pytest.mark.parametrize("request_bytes", [
    b"GET\t/v2/repository/index\tX /v2/models/coarse HTTP/1.1\r\n\r\n",         # tabs as separators
    b"GET /v2/models/coarse/ready HTTP/1.1\r\nX-A: b\nTransfer-Encoding: chunked\r\n\r\n",   # a bare LF
    b"POST /v2/models/coarse/infer HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc",
    b"POST /v2/models/coarse/infer HTTP/1.1\r\nContent-Length: 1_0\r\n\r\nabc",
    b"POST /v2/models/coarse/infer HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /v2/models/coarse/ready HTTP/2.0\r\n\r\n",
    b"GET /v2/models/coarse/ready\x00 HTTP/1.1\r\n\r\n",
    b"GET http://triton/v2/repository/index HTTP/1.1\r\n\r\n",                       # absolute form
    b"GET /v2/models/coarse/ready HTTP/1.1\r\nBad Name: x\r\n\r\n",
])
def test_a_request_read_otherwise_by_triton_is_refused_and_never_sent(request_bytes):
    async def test(router, port, upstream):
        answer = await _exchange(port, request_bytes)
        assert answer.startswith(b"HTTP/1.1 400") and not upstream.received, answer
    _with_router(test)


def test_a_refused_request_with_a_body_ends_the_connection_unread():
    async def test(router, port, upstream):
        answer = await _exchange(port, b"POST /v2/repository/models/fine/unload HTTP/1.1\r\nContent-Length: 2\r\n\r\n"
                                       b"{}GET /v2/models/coarse/ready HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 404") and answer.count(b"HTTP/1.1") == 1
        assert b"Connection: close" in answer and not upstream.received
    _with_router(test)


def test_chunked_request_bodies_and_oversized_ones_are_refused():
    async def test(router, port, upstream):
        chunked = await _exchange(port, b"POST /v2/models/coarse/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                        b"3\r\nabc\r\n0\r\n\r\n")
        big = await _exchange(port, b"POST /v2/models/coarse/infer HTTP/1.1\r\nContent-Length: 101\r\n\r\n")
        assert chunked.startswith(b"HTTP/1.1 411") and big.startswith(b"HTTP/1.1 413") and not upstream.received
    _with_router(test, max_body_bytes=100)


def test_triton_down_is_a_502():
    async def test(router, port, upstream):
        assert (await _exchange(port, b"GET /v2/models/coarse/ready HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 502")
    _with_router(test, upstream_up=False)


def test_a_repointed_port_ends_its_open_connections():
    async def test(router, port, upstream):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v2/models/coarse/ready HTTP/1.1\r\n\r\n")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        await router.apply({port: "fine"})
        assert await asyncio.wait_for(reader.read(), 2) == b""          # closed: it never reaches fine's door
        writer.close()
        answer = await _exchange(port, b"GET /v2/models/coarse/ready HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 404")
    _with_router(test)


def test_connections_over_the_cap_are_refused():
    async def test(router, port, upstream):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.1)
        assert (await _exchange(port, b"GET /v2/models/coarse/ready HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503")
        for _, writer in held:
            writer.close()
    _with_router(test, max_connections=2)


def test_a_routes_file_that_cannot_be_read_keeps_the_ports(tmp_path):
    routes_file = tmp_path / "routes.json"
    port = free_port()

    async def main():
        stop = asyncio.Event()
        routes_file.write_text(json.dumps({str(port): "coarse"}))
        runner = asyncio.create_task(route.run(("127.0.0.1", free_port()), routes_file, {}, "127.0.0.1", 0.05, stop))
        await asyncio.sleep(0.3)
        for bad in (b'{"\xc2\xb2": "x"}', b"\xff\xfe", b"{nope"):
            routes_file.write_bytes(bad)
            await asyncio.sleep(0.2)
            assert not runner.done()
            _, writer = await asyncio.open_connection("127.0.0.1", port)     # still listening
            writer.close()
        stop.set()
        await runner
    asyncio.run(main())


def test_a_member_named_stats_gets_no_port():
    with pytest.raises(route.RouteError, match="statistics"):
        route.checked_routes({"8100": "stats"})
    assert not route.allowed("/v2/models/stats", "stats")


def _drain_ask(seconds, key="k3y", model="coarse") -> bytes:
    body = json.dumps({"seconds": seconds}).encode()
    return (f"POST /rankops/drain HTTP/1.1\r\nHost: x\r\nrankops-api-key: {key}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def test_a_drain_asked_with_the_key_closes_the_members_idle_connections_and_ends_each_other_after_its_answer():
    """A swap drains the member on the pod it takes (rollout/inplace.py): pooled clients must leave it."""
    async def test(router, port, upstream):
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)       # a pooled, idle connection
        busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
        busy_w.write(b"GET /v2/models/coarse/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        await busy_w.drain()
        assert await asyncio.wait_for(busy_r.readexactly(len(ANSWER)), 2) == ANSWER
        await asyncio.sleep(route.IDLE_CLOSE_S + 0.1)      # a pool's spare: idle long enough to be closed
        asked = await _exchange(port, _drain_ask(30))
        assert b"200 OK" in asked and json.loads(asked.split(b"\r\n\r\n", 1)[1]) == \
            {"model": "coarse", "draining": True, "open": 2, "staged": None}, "both idle ones closing"
        assert await asyncio.wait_for(idle_r.read(1), 2) == b"", "the idle keep-alive connection is closed"
        # busy was idle too by now: closed. A new connection (stale endpoints) is answered, then closed.
        assert await asyncio.wait_for(busy_r.read(1), 2) == b""
        assert b'"open": 0' in await _exchange(port, _drain_ask(30)), "the next ask counts none open"
        late = await _exchange(port, b"GET /v2/models/coarse/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                                     b"GET /v2/models/coarse/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert late.count(b"200 OK") == 1 and b"Connection: close" in late, late
        # the drain ended: keep-alive again
        assert b'"draining": false' in await _exchange(port, _drain_ask(0))
        again = await _exchange(port, b"GET /v2/models/coarse/ready HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
        assert again.count(b"200 OK") == 2 and b"Connection: close" not in again
        for w in (idle_w, busy_w):
            w.close()
    _with_router(test, api_key="k3y", idle_timeout_s=10.0)


@pytest.mark.parametrize("ask", [_drain_ask(30, key="wrong"), _drain_ask(30, key=""), _drain_ask(301),
                                 _drain_ask(-1)])
def test_a_drain_ask_without_the_key_or_out_of_bounds_drains_nothing(ask):
    async def test(router, port, upstream):
        answer = await _exchange(port, ask)
        assert b"200 OK" not in answer and not router.draining("coarse"), answer
        assert b"/rankops/drain" not in bytes(upstream.received), "never passed to Triton"
    _with_router(test, api_key="k3y")


def test_a_router_without_a_key_takes_no_drain():
    async def test(router, port, upstream):
        answer = await _exchange(port, _drain_ask(30))
        assert b"404" in answer and not router.draining("coarse")
    _with_router(test)


def test_a_drain_answer_lists_the_members_version_directories_on_the_pods_volume(tmp_path):
    for name in ("1", "4", ".4.fetching", "notes"):
        (tmp_path / "coarse" / name).mkdir(parents=True)

    async def test(router, port, upstream):
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)   # in use just now: not closed
        answer = json.loads((await _exchange(port, _drain_ask(30))).split(b"\r\n\r\n", 1)[1])
        assert answer["staged"] == [1, 4] and answer["open"] == 1
        idle_w.write(b"GET /v2/models/coarse/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        await idle_w.drain()
        said = await asyncio.wait_for(idle_r.read(65536), 2)
        assert b"200 OK" in said and b"Connection: close" in said, "answered, then told to leave"
        idle_w.close()
    _with_router(test, api_key="k3y", repository=tmp_path, idle_timeout_s=10.0)
