"""The request path's upstream client (gateway/upstream/client.py) against real sockets on loopback:
a raw asyncio server in the test's loop answers with exactly the bytes each test scripts (keep-alive,
chunked split at every byte, read to close, HTTP/1.0, 100 Continue, and the hostile ones: a bad
status line, huge heads, a body cut mid-chunk, an idle connection closed as it is reused)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from gateway.pipeline.body_parts import Parts
from gateway.upstream.client import (
    HIGH_WATER, BadResponse, ConnectFailed, Pool, ResponseClosed, ResponseCut, Target,
)
from tests.support.poll import until

# pytest-asyncio's replacement (a loop-factories hook) is conftest-wide; this module alone runs twice.
pytestmark = pytest.mark.filterwarnings("ignore:Overriding the .event_loop_policy. fixture")


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def event_loop_policy(request):
    """Both loops: the gateway runs on uvloop, whose transports differ (writelines, pause_reading)."""
    return uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class Seen:
    head: bytes
    body: bytes


@dataclass
class Server:
    url: str = ""
    connections: int = 0
    closed: int = 0  # connections that ended (the client closed, or the script did)
    requests: list[Seen] = field(default_factory=list)


Handler = Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> Seen | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return Seen(head, await reader.readexactly(length) if length else b"")


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    """`handler(server, reader, writer, n)` serves the n-th connection (from 0)."""
    srv = Server()
    tasks: list[asyncio.Task] = []
    writers: list[asyncio.StreamWriter] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = srv.connections
        srv.connections += 1
        tasks.append(asyncio.current_task())
        writers.append(writer)
        try:
            await handler(srv, reader, writer, n)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            srv.closed += 1

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    srv.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield srv
    finally:
        server.close()
        for writer in writers:
            writer.close()  # the handlers still reading see the end of their connection
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)


def answer_each(*pieces: bytes, pause: float = 0.0) -> Handler:
    """Serve requests on a connection until it closes, each answered with `pieces` in order."""
    async def handler(srv: Server, reader, writer, n: int) -> None:
        while (seen := await read_request(reader)) is not None:
            srv.requests.append(seen)
            for i, piece in enumerate(pieces):
                if i and pause:
                    await asyncio.sleep(pause)  # the client reads the pieces separately
                writer.write(piece)
                await writer.drain()
    return handler


async def read_all(resp) -> bytes:
    parts = []
    while chunk := await resp.content.readany():
        parts.append(chunk)
    return b"".join(parts)


def target(srv: Server, path: str = "/v1/chat/completions") -> Target:
    return Target.parse(srv.url + path, {"Content-Type": "application/json", "Accept-Encoding": "identity"})


@pytest.fixture
async def pool():
    p = Pool(connect_timeout=2.0, keep_alive=4.0)
    yield p
    p.close()


async def test_keep_alive_reuses_one_connection_and_sends_one_clean_request(pool) -> None:
    async with serving(answer_each(OK)) as srv:
        for i in range(3):
            resp = await pool.post(target(srv), b'{"n":%d}' % i, b"X-Request-Id: r%d\r\n" % i)
            assert resp.status == 200 and resp.content_type == "application/json"
            assert resp.headers.get("content-TYPE") == "application/json"
            assert await read_all(resp) == b"{}" and resp.content.at_eof()
            resp.release()
        assert srv.connections == 1 and pool.held() == 0
        head = srv.requests[2].head
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: {srv.url[7:]}\r\n".encode() in head and b"X-Request-Id: r2\r\n" in head
        assert b"Content-Length: 7\r\n" in head and srv.requests[2].body == b'{"n":2}'


async def test_a_large_body_arrives_whole(pool) -> None:
    body = bytes(range(256)) * 8192  # 2 MB: written beside its head, not copied into it
    async with serving(answer_each(OK)) as srv:
        for _ in range(2):
            resp = await pool.post(target(srv), body)
            assert await read_all(resp) == b"{}"
            resp.release()
        assert [r.body == body for r in srv.requests] == [True, True] and srv.connections == 1


async def test_a_body_in_parts_arrives_whole_and_in_order(pool) -> None:
    """A body held as parts (the rewritten fields around the client's own bytes of its messages,
    gateway/pipeline/body_parts.py) is written as its parts, never joined, and arrives as their sum."""
    messages = bytes(range(256)) * 8192
    body = Parts((b'{"model":"up","messages":', memoryview(messages)[1:-1], b'}'))
    async with serving(answer_each(OK)) as srv:
        for _ in range(2):
            resp = await pool.post(target(srv), body)
            assert await read_all(resp) == b"{}"
            resp.release()
        whole = b'{"model":"up","messages":' + messages[1:-1] + b'}'
        assert [r.body == whole for r in srv.requests] == [True, True] and srv.connections == 1
        assert b"Content-Length: %d\r\n" % len(whole) in srv.requests[0].head


async def test_a_chunked_answer_split_at_every_byte(pool) -> None:
    events = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in (b"data: {\"a\":1}\n\n", b"data: [DONE]\n\n"))
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" \
          + events + b"0\r\n\r\n"
    async with serving(answer_each(*[raw[i:i + 1] for i in range(len(raw))], pause=0.0002)) as srv:
        for _ in range(2):
            resp = await pool.post(target(srv), b"{}")
            assert resp.content_type == "text/event-stream"
            assert await read_all(resp) == b'data: {"a":1}\n\ndata: [DONE]\n\n'
            resp.release()
        assert srv.connections == 1


async def test_an_idle_connection_closed_as_it_is_reused_is_retried_once_on_a_fresh_one(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        while (seen := await read_request(reader)) is not None:
            srv.requests.append(seen)
            if n == 0 and len(srv.requests) == 2:
                return  # the engine's idle close, racing the gateway's second request
            writer.write(OK)
            await writer.drain()

    async with serving(handler) as srv:
        for _ in range(2):
            resp = await pool.post(target(srv), b"{}")
            assert resp.status == 200 and await read_all(resp) == b"{}"
            resp.release()
        assert srv.connections == 2 and len(srv.requests) == 3


async def test_a_fresh_connection_closed_without_an_answer_is_not_retried(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        srv.requests.append(await read_request(reader))

    async with serving(handler) as srv:
        with pytest.raises(ResponseCut):
            await pool.post(target(srv), b"{}")
        assert srv.connections == 1 and pool.held() == 0


async def test_connection_close_and_http_1_0_answers_are_not_pooled(pool) -> None:
    close = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    old = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    for answer in (close, old):
        async with serving(answer_each(answer)) as srv:
            for _ in range(2):
                resp = await pool.post(target(srv), b"{}")
                assert await read_all(resp) == b"{}" and not resp.keep_alive
                resp.release()
            assert srv.connections == 2


async def test_an_answer_without_length_is_read_to_the_close(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\":")
        await writer.drain()
        writer.write(b"1}")  # then the handler returns: the connection closes

    async with serving(handler) as srv:
        resp = await pool.post(target(srv), b"{}")
        assert await read_all(resp) == b'{"a":1}'
        resp.release()
        assert pool.held() == 0 and not pool.idle.get(target(srv).key)


async def test_100_continue_is_skipped(pool) -> None:
    async with serving(answer_each(b"HTTP/1.1 100 Continue\r\n\r\n", OK, pause=0.001)) as srv:
        resp = await pool.post(target(srv), b"{}")
        assert resp.status == 200 and await read_all(resp) == b"{}"
        resp.release()


@pytest.mark.parametrize("answer", [
    b"SPAM\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 9000 + b"\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"X-Many: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" * 2000
    + b"Content-Length: 0\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
], ids=["not http", "bad status", "header line too long", "head too large", "upgrade"])
async def test_answers_that_are_not_http_raise_a_clear_oserror(pool, answer) -> None:
    async with serving(answer_each(answer)) as srv:
        with pytest.raises(BadResponse) as info:
            await pool.post(target(srv), b"{}")
        assert isinstance(info.value, OSError) and str(info.value)
        assert pool.held() == 0
        await until(lambda: srv.closed == 1)  # the connection was dropped


async def test_an_endless_header_line_is_cut_off(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        for _ in range(64):
            writer.write(b"a" * 16384)
            await writer.drain()
        await reader.read()

    async with serving(handler) as srv:
        with pytest.raises(BadResponse):
            await pool.post(target(srv), b"{}")


async def test_a_body_cut_mid_chunk_delivers_what_came_then_raises(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\ndata: {\"a\"")
        await writer.drain()

    async with serving(handler) as srv:
        resp = await pool.post(target(srv), b"{}")
        got = b""
        with pytest.raises(ResponseCut):
            while True:
                got += await resp.content.readany()
        assert got == b'data: {"a"'
        resp.release()
        assert pool.held() == 0 and srv.connections == 1


async def test_a_body_shorter_than_its_length_raises(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")  # and closes

    async with serving(handler) as srv:
        resp = await pool.post(target(srv), b"{}")
        with pytest.raises(ResponseCut):
            await read_all(resp)


async def test_bytes_after_the_end_keep_the_connection_out_of_the_pool(pool) -> None:
    async with serving(answer_each(OK + OK)) as srv:
        resp = await pool.post(target(srv), b"{}")
        assert await read_all(resp) == b"{}"
        resp.release()
        resp = await pool.post(target(srv), b"{}")
        assert await read_all(resp) == b"{}"
        resp.release()
        assert srv.connections == 2


async def test_a_reader_that_stops_reading_pauses_the_socket(pool) -> None:
    size = 4 * 1024 * 1024
    wrote = 0

    async def handler(srv: Server, reader, writer, n: int) -> None:
        nonlocal wrote
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
            wrote += 65536
        await reader.read()

    async with serving(handler) as srv:
        resp = await pool.post(target(srv), b"{}")
        await until(lambda: resp._conn.paused)
        buffered = resp._size
        assert buffered <= HIGH_WATER + 65536 * 4
        assert len(await read_all(resp)) == size and wrote == size
        resp.release()
        assert srv.connections == 1


async def test_close_ends_a_pending_read_and_the_connection(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    async with serving(handler) as srv:
        resp = await pool.post(target(srv), b"{}")
        assert await resp.content.readany() == b"hello"
        pending = asyncio.ensure_future(resp.content.readany())
        await asyncio.sleep(0)  # one turn of the loop, the scenario: the read is waiting when the close comes
        resp.close()  # as relay.inflight.IdleWatchdog does
        with pytest.raises(ResponseClosed):
            await pending
        await until(lambda: srv.closed == 1)
        assert pool.held() == 0


async def test_cancelled_while_waiting_for_the_answer_closes_the_connection(pool) -> None:
    async def handler(srv: Server, reader, writer, n: int) -> None:
        srv.requests.append(await read_request(reader))
        await reader.read()

    async with serving(handler) as srv:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.post(target(srv), b"{}")
        await until(lambda: srv.closed == 1)  # the engine sees the request go
        assert pool.held() == 0 and not pool.idle.get(target(srv).key)


async def test_idle_connections_are_closed_after_keep_alive() -> None:
    pool = Pool(connect_timeout=2.0, keep_alive=0.1)
    try:
        async with serving(answer_each(OK)) as srv:
            resp = await pool.post(target(srv), b"{}")
            await read_all(resp)
            resp.release()
            assert pool.idle[target(srv).key]
            await until(lambda: srv.closed == 1)
            assert not pool.idle[target(srv).key]
    finally:
        pool.close()


async def test_a_refused_connection_is_a_connect_failure(pool) -> None:
    async with serving(answer_each(OK)) as srv:
        pass  # closed: its port now refuses
    with pytest.raises(ConnectFailed) as info:
        await pool.post(target(srv), b"{}")
    assert isinstance(info.value, OSError) and "cannot connect" in str(info.value)


def test_targets_are_parsed_once_with_their_host_header() -> None:
    t = Target.parse("http://engine:8000/base/v1/chat/completions?x=1", {"A": "b"})
    assert t.key == ("http", "engine", 8000)
    assert t.head == b"POST /base/v1/chat/completions?x=1 HTTP/1.1\r\nHost: engine:8000\r\nA: b\r\n"
    assert Target.parse("https://[::1]/p", {}).head.startswith(b"POST /p HTTP/1.1\r\nHost: [::1]\r\n")
    with pytest.raises(ValueError):
        Target.parse("ftp://x/p", {})
    with pytest.raises(ValueError):
        Target.parse("http://x/p", {"X-Id": "a\r\nX-Evil: 1"})
    # Credentials in the URL: Basic, as aiohttp sent them; never beside the lane's own key.
    assert b"\r\nAuthorization: Basic dTpwIHc=\r\n" in Target.parse("http://u:p%20w@x/p", {}).head
    assert b"Basic" not in Target.parse("http://u:p@x/p", {"Authorization": "Bearer k"}).head


async def test_upstream_send_fails_over_from_a_refused_replica_with_the_lane_headers() -> None:
    from gateway.core.config import Timeouts
    from gateway.upstream.replicas import Replica, Upstream

    async with serving(answer_each(OK)) as dead:
        pass  # its port now refuses
    async with serving(answer_each(OK)) as live:
        up = Upstream([Replica(dead.url), Replica(live.url)], Timeouts(connect=1), api_key="lane-key")
        try:
            for i in range(2):
                replica, resp = await up.send(up.replicas, "/v1/chat/completions", b"{}", f"rid-{i}")
                assert replica.url == live.url and resp.status == 200 and await read_all(resp) == b"{}"
                assert up.connections_held() == 1
                resp.release()
                replica.inflight -= 1  # as relay.inflight.InFlight.done does
            assert up.connections_held() == 0 and live.connections == 1
            assert up.replicas[0].failures == 2 and "cannot connect" in (up.replicas[0].last_error or "")
            head = live.requests[-1].head
            for line in (b"Authorization: Bearer lane-key", b"Accept-Encoding: identity",
                         b"Content-Type: application/json", b"X-Request-Id: rid-1", b"Content-Length: 2"):
                assert line + b"\r\n" in head
        finally:
            await up.close()

