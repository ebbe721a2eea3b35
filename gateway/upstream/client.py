"""The request path's upstream client: pooled HTTP/1.1 on an asyncio Protocol and httptools' parser.

Why not aiohttp here: its client is a general one (a connector with limits and DNS cache, a
request object, a writer task, a StreamReader, multidicts, traces) and on a small request it was
the largest step of the hot path (bench/steps.py "forward").
The gateway needs much less: one POST with a body whose length it knows, to a handful of replicas,
one request per connection at a time. So:

- the request is one `transport.write` (status line, headers, body), the head pre-encoded per
  replica and path, only the request id and length formatted per request;
- the response is parsed by llhttp (httptools, which uvicorn already brings) straight into a
  buffer that `readany` hands out whole; no intermediate reader, no task per connection;
- idle connections wait in a LIFO list per replica (the most recently used is the warmest and the
  furthest from the engine's idle close) and are dropped after `keep_alive`, below the engines' 5 s;
- a reused connection that dies before any byte of the answer (the engine closed it as idle in
  that very moment) is retried once on a fresh one, as aiohttp and nginx do; a fresh connection's
  failure is the caller's to handle (failover "connect").

So it spends less CPU than aiohttp's client per request and per read (the figures, and where they
are measured: docs/performance.md). Like aiohttp's, it leaves no reference cycle per request: a
parser must not hold its response's bound methods, or every request leaves work to the cyclic
collector.

The response offers what the relay (gateway/relay/) reads of a response (status, headers.get, content_type,
content.readany / at_eof, close, release), as aiohttp's does. Every error is an OSError
(ConnectionError), which the relay's and replicas.py's except clauses take.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httptools

from ..pipeline.body_parts import Body, Parts

# aiohttp's limits: 8190 bytes per header line; the whole head (status line and headers) is
# capped so an upstream cannot make the gateway buffer an endless head.
MAX_LINE = 8190
MAX_HEAD = 64 * 1024
# Unread body bytes above which the socket is no longer read (a slow client must not make the
# gateway buffer an endless stream); reading resumes once `readany` has taken them.
HIGH_WATER = 256 * 1024
# Above this a body is written beside its head (writelines: one writev on uvloop) rather than
# copied into one bytes object with it.
_JOIN_BELOW = 64 * 1024


class UpstreamConnectionError(ConnectionError):
    """Anything that went wrong talking to the upstream (an OSError, as the callers expect)."""


class ConnectFailed(UpstreamConnectionError):
    """No connection could be opened (refused, unreachable, timed out)."""


class BadResponse(UpstreamConnectionError):
    """The answer is not HTTP/1.x as this client reads it (bad status line, head too large, ...)."""


class ResponseCut(UpstreamConnectionError):
    """The connection closed before the end of the answer (or before its first byte)."""


class ResponseClosed(UpstreamConnectionError):
    """The response was closed by the gateway (the idle watchdog, a client that left)."""


class _Stale(UpstreamConnectionError):
    """A reused connection ended before any byte of the answer: safe to retry once on a fresh one."""


class _SecondResponse(Exception):
    """More after the end of the answer: the connection cannot be reused."""


@dataclass(frozen=True)
class Target:
    """One replica and path: where to connect and the request's head, encoded once."""

    key: tuple[str, str, int]  # (scheme, host, port): the pool's key
    host: str
    port: int
    ssl: bool
    head: bytes  # "POST path HTTP/1.1", Host and the static headers; the per-request ones follow

    @classmethod
    def parse(cls, url: str, headers: dict[str, str]) -> "Target":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host = parts.hostname
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{port}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {path} HTTP/1.1", f"Host: {netloc}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if parts.username is not None and not any(name.lower() == "authorization" for name in headers):
            # Credentials in the replica's URL, as aiohttp sent them (Basic); a lane key wins.
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            lines.append("Authorization: Basic " + base64.b64encode(user.encode("latin-1")).decode("ascii"))
        if any(c in line for line in lines for c in "\r\n\0"):
            raise ValueError("a request header (or the replica's URL) holds a line break")
        head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        return cls((parts.scheme, host, port), host, port, tls, head)


class Headers(dict):
    """The response's headers by lower-case name (the first of repeated ones), read case-insensitively."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name.lower() if isinstance(name, str) else name)


class Response:
    """One answer on one connection; also the parser's callbacks (a parser per answer)."""

    __slots__ = ("status", "headers", "keep_alive", "_conn", "_loop", "_parser", "_reused", "_seen",
                 "_raw", "_head_size", "_head_bytes", "_head", "_interim", "_until_close", "_buf", "_size", "_waiter",
                 "_complete", "_error", "_finished")

    def __init__(self, conn: "_Connection", reused: bool) -> None:
        self.status = 0
        self.headers = Headers()
        self.keep_alive = False
        self._conn = conn
        self._loop = conn.loop
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._reused = reused
        self._seen = False  # any byte of the answer arrived
        self._raw: list[tuple[bytes, bytes]] = []
        self._head_size = 0  # header bytes parsed
        self._head_bytes = 0  # bytes received while the head was incomplete
        self._head: asyncio.Future[None] | None = self._loop.create_future()  # None once the head is in
        self._interim = False
        self._until_close = False
        self._buf: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._error: BaseException | None = None
        self._finished = False  # released or closed

    # -- what the relay reads ------------------------------------------------------------------

    @property
    def content(self) -> "Response":
        """aiohttp's `resp.content.readany()`, without an object between (a property: no self-cycle)."""
        return self

    @property
    def content_type(self) -> str:
        value = self.headers.get("content-type")
        return value.split(";", 1)[0].strip().lower() if value else "application/octet-stream"

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call (waits for some); b"" at the end."""
        while True:
            buf = self._buf
            if buf:
                data = buf[0] if len(buf) == 1 else b"".join(buf)
                buf.clear()
                self._size = 0
                if self._conn.paused:
                    self._conn.resume()
                return data
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def at_eof(self) -> bool:
        return self._complete and not self._buf

    def release(self) -> None:
        """Done with it: the connection goes back to the pool if the answer was read to its end."""
        if self._finished:
            return
        self._finished = True
        self._parser = None  # it holds our bound methods: a reference cycle otherwise
        conn = self._conn
        if self._complete and self._error is None and self.keep_alive and conn.reusable:
            conn.idle()
        else:
            conn.drop()

    def close(self) -> None:
        """Drop the connection (an engine aborts a request whose connection closes); reads end in error."""
        if self._finished:
            return
        self._finished = True
        self._parser = None
        if not self._complete and self._error is None:
            self._error = ResponseClosed("the upstream response was closed by the gateway")
        self._buf.clear()
        self._size = 0
        self._conn.drop()
        self._wake()

    # -- the connection's side ----------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # released or closed
            return
        self._seen = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if self._complete:  # a second answer, or bytes after the end: not reusable, nothing lost
                self._conn.reusable = False
                self._conn.drop()
            else:
                self._fail(cause if isinstance(cause, BadResponse) else BadResponse(f"bad answer: {cause or exc}"))
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self._complete:
                self._conn.reusable = False
                self._conn.drop()
            else:
                self._fail(BadResponse(f"the upstream's answer is not HTTP/1.1: {exc or type(exc).__name__}"))
        else:
            if self._head is not None:  # an endless head line never reaches on_header
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD:
                    self._fail(BadResponse(f"the upstream's response head is larger than {MAX_HEAD} bytes"))
        if self._size > HIGH_WATER and not self._conn.paused:
            self._conn.pause()
        self._wake()

    def lost(self) -> None:
        """The connection closed."""
        if self._complete or self._error is not None:
            return
        if self._head is not None:
            if self._reused and not self._seen:
                self._fail(_Stale("a pooled connection closed before the answer"))
            else:
                self._fail(ResponseCut("the upstream closed the connection before answering"))
        elif self._until_close:
            self._complete = True  # no length, not chunked: the end of the connection ends the body
            self.keep_alive = False
        else:
            self._fail(ResponseCut("the upstream closed the connection before the end of its answer"))
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._buf.clear()  # never half an answer after an error of the protocol's
        self._size = 0
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        self._conn.reusable = False
        self._conn.drop()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- httptools callbacks ------------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        if self._complete:
            raise _SecondResponse()

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        if size > MAX_LINE:
            raise BadResponse(f"a header line of the upstream's answer is longer than {MAX_LINE} bytes")
        self._head_size += size
        if self._head_size > MAX_HEAD:
            raise BadResponse(f"the upstream's response head is larger than {MAX_HEAD} bytes")
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # the parser's own callback
        status = parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise BadResponse("the upstream switched protocols")
            self._interim = True  # 100 Continue and the like: the answer follows
            self._raw = []
            return
        found: dict[str, str] = {}
        for name, value in self._raw:
            key = name.decode("latin-1").lower()
            if key not in found:
                found[key] = value.decode("latin-1")
        self.headers = Headers(found)
        self._raw = []
        self.status = status
        self.keep_alive = parser.should_keep_alive()
        chunked = "chunked" in found.get("transfer-encoding", "").lower()
        self._until_close = not chunked and "content-length" not in found and status not in (204, 304)
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._buf.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._complete = True


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica, serving one request at a time."""

    def __init__(self, pool: "Pool", key: tuple[str, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.reusable = True
        self.closed = False
        self.paused = False
        self.idle_since = 0.0

    async def send(self, head: bytes, body: Body, reused: bool) -> Response:
        resp = self.response = Response(self, reused)
        self.pool.busy.add(self)
        transport = self.transport
        assert transport is not None
        if type(body) is Parts:
            # A large body in parts (the client's bytes of its messages and the rewritten fields
            # around them, body_parts.py): written as they are, never joined.
            transport.writelines((head, *body.buffers))
        elif len(body) < _JOIN_BELOW:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        waiter = resp._head
        try:
            if waiter is not None:
                await waiter
        except BaseException:
            resp.close()  # cancelled or failed: the engine must see the request go
            raise
        return resp

    def idle(self) -> None:
        self.response = None
        if self.paused:
            self.resume()
        self.pool.busy.discard(self)
        self.pool.put(self)

    def drop(self) -> None:
        self.reusable = False
        self.pool.busy.discard(self)
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def pause(self) -> None:
        self.paused = True
        if not self.closed and self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        if not self.closed and self.transport is not None:
            self.transport.resume_reading()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None:  # an idle connection talking: it cannot be trusted with a request
            self.pool.forget(self)
            self.drop()
            return
        resp.feed(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.reusable = False
        self.pool.forget(self)
        self.pool.busy.discard(self)
        resp = self.response
        if resp is not None:
            self.response = None  # the response keeps its connection, not the other way round
            resp.lost()


class Pool:
    """An Upstream's connections: idle ones per replica, LIFO, dropped after `keep_alive` seconds."""

    def __init__(self, connect_timeout: float, keep_alive: float) -> None:
        self.connect_timeout = connect_timeout
        self.keep_alive = keep_alive
        self.loop = asyncio.get_running_loop()
        self.idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self.busy: set[_Connection] = set()  # lent to a response (tests count them)
        self._sweep: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None
        self.closed = False

    async def post(self, target: Target, body: Body, extra_headers: bytes = b"") -> Response:
        """Send the request and wait for the answer's head (the caller bounds the wait)."""
        head = b"%b%bContent-Length: %d\r\n\r\n" % (target.head, extra_headers, len(body))
        conn = self._take(target.key)
        if conn is not None:
            try:
                return await conn.send(head, body, reused=True)
            except _Stale:
                pass  # the engine closed it as idle as we sent: once more, on a fresh connection
        conn = await self._connect(target)
        return await conn.send(head, body, reused=False)

    async def _connect(self, target: Target) -> _Connection:
        if self.closed:
            raise ConnectFailed("the upstream client is closed")
        tls = None
        if target.ssl:
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await self.loop.create_connection(lambda: _Connection(self, target.key),
                                                            target.host, target.port, ssl=tls)
        except TimeoutError:
            raise ConnectFailed(f"connecting to {target.host}:{target.port} timed out "
                                f"after {self.connect_timeout:g}s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {target.host}:{target.port}: {exc.strerror or exc}") from None
        return conn

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self.idle.get(key)
        if not idle:
            return None
        oldest = self.loop.time() - self.keep_alive
        while idle:
            conn = idle.pop()
            if conn.idle_since > oldest and not conn.closed:
                return conn
            conn.drop()  # the rest are older still
        return None

    def put(self, conn: _Connection) -> None:
        if self.closed:
            conn.drop()
            return
        conn.idle_since = self.loop.time()
        idle = self.idle.get(conn.key)
        if idle is None:
            idle = self.idle[conn.key] = []
        idle.append(conn)
        if self._sweep is None:
            self._sweep = self.loop.call_later(self.keep_alive / 2, self._expire)

    def forget(self, conn: _Connection) -> None:
        idle = self.idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def _expire(self) -> None:
        """Close what has been idle for `keep_alive` (one timer per pool, not one per connection)."""
        self._sweep = None
        oldest = self.loop.time() - self.keep_alive
        left = False
        for idle in self.idle.values():
            while idle and idle[0].idle_since <= oldest:
                idle.pop(0).drop()
            left = left or bool(idle)
        if left and not self.closed:
            self._sweep = self.loop.call_later(self.keep_alive / 2, self._expire)

    def held(self) -> int:
        """Connections lent to a response not yet released or closed."""
        return len(self.busy)

    def close(self) -> None:
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for idle in self.idle.values():
            for conn in idle:
                conn.drop()
        self.idle.clear()
        for conn in list(self.busy):
            conn.drop()
