"""The proxy endpoints served from the HTTP protocol itself, without the ASGI layer.

uvicorn's httptools protocol parses the request (and keeps doing keep-alive, pipelining, flow
control, `Expect: 100-continue` and the read deadlines of serving.py); for a POST to one of the
proxy paths the protocol hands the request to `serve` instead of starting the ASGI app, and
`serve` writes the answer to the transport itself:

- a whole answer is one `transport.write` (status line, headers and body): under ASGI, Starlette
  sends the start and the body as two messages and uvicorn writes each, two syscalls where one
  does, and those writes were a large share of a small request's CPU;
- a stream is written chunk by chunk with chunked encoding, without Starlette's per-response task
  group (a task to listen for the disconnect and one to stream) and without a `send` message dict
  per chunk;
- the client leaving is heard from `connection_lost`, which cancels the task that serves it (see
  client_link.py): no watcher task per upstream wait.

Everything else (admin, metrics, the other routes, CORS preflights, a request with CORS configured)
goes through Starlette. GATEWAY_WIRE=0 (Settings.wire) turns this path off (the A/B of bench/anchors.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Protocol, TypeVar, runtime_checkable

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from .client_link import AsgiLink, ClientGone, ClientLink
from ..core.answer import Answer
from ..core.errors import GatewayError

if TYPE_CHECKING:
    from ..core.settings import Settings

log = logging.getLogger("gateway.wire")
T = TypeVar("T")
Handler = Callable[["WireRequest"], Awaitable[Answer]]

# A body longer than this is handed to the pipeline in pieces of this size (its size limit is
# checked per piece: a chunked upload over the limit is refused after at most this much more).
PIECE = 8 * 1024 * 1024


class WireHeaders(Headers):
    """Starlette's Headers with its lookups through a dict built on the first one: each `get` scanned
    the list and lower-cased the name, and a request makes several: the key check, the request
    id, the conversation header, the record's user-agent. The first of repeated headers wins, as there."""

    __slots__ = ("_index",)

    def __init__(self, scope: Any) -> None:
        super().__init__(scope=scope)
        self._index: dict[bytes, str] | None = None

    def _first(self) -> dict[bytes, str]:
        index = self._index = {}
        for name, value in reversed(self._list):
            index[name] = value.decode("latin-1")
        return index

    def __getitem__(self, key: str) -> str:
        value = (self._index or self._first()).get(key.lower().encode("latin-1"))
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return (self._index or self._first()).get(key.lower().encode("latin-1"), default)

    def __contains__(self, key: Any) -> bool:
        return key.lower().encode("latin-1") in (self._index or self._first())


class WireRequest:
    """What the pipeline and the key check read of a request: its headers, its body, its link."""

    __slots__ = ("scope", "headers", "link", "_cycle")

    def __init__(self, cycle: RequestResponseCycle, link: "WireLink") -> None:
        self.scope = cycle.scope
        self.headers = WireHeaders(cycle.scope)
        self.link = link
        self._cycle = cycle

    @property
    def receive(self) -> Callable[[], Awaitable[Any]]:
        return self._cycle.receive

    async def stream(self) -> AsyncIterator[bytes]:
        """The body, handed over whole (or in pieces of PIECE bytes, so that the pipeline's size
        limit still bounds a chunked upload), gathered by a `_Collector` put in the place of the
        cycle's bytearray. Otherwise as uvicorn's `receive`: `Expect: 100-continue` answered on the
        first read, a client gone is ClientDisconnect, and reading resumed at the end so that a
        client leaving while the upstream thinks is heard."""
        cycle = self._cycle
        collected = _Collector.take_over(cycle)
        flow = cycle.flow
        event = cycle.message_event
        while True:
            if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
                cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                cycle.waiting_for_100_continue = False
            if cycle.disconnected or cycle.response_complete:
                raise ClientDisconnect()
            more = cycle.more_body
            if not more or collected.size >= PIECE:
                body = collected.take()
                if not more:
                    flow.resume_reading()
                    if body:
                        yield body
                    return
                yield body
            flow.resume_reading()
            await event.wait()
            event.clear()


class _Collector:
    """Stands in for the cycle's bytearray while the wire path reads a body.

    uvicorn's protocol appends every read to `cycle.body` (`+=`, a copy into a growing bytearray)
    and pauses reading once more than 64 KB wait; its `receive` copied them out again (`bytes`)
    and the pipeline joined the pieces: four copies of a 2 MB body, a pause and a resume (two
    epoll_ctl calls) per 64-256 KB read, and a wake-up of the reading task for each. Here `+=`
    keeps the parser's own bytes objects and the pieces are joined once; and the protocol's
    `len()` check sees 0 until PIECE bytes wait, so it does not pause reading below that (the body
    is being read whole anyway; the pipeline's limit is checked per piece, and a declared
    Content-Length before any is read). Measured by bench/receive_ab.py."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    @classmethod
    def take_over(cls, cycle: RequestResponseCycle) -> "_Collector":
        collected = cls()
        early = cycle.body  # what arrived with the head, before this task ran
        if isinstance(early, _Collector):
            return early
        if early:
            collected += bytes(early)
        cycle.body = collected  # type: ignore[assignment]
        return collected

    def __iadd__(self, chunk: bytes) -> "_Collector":
        self.chunks.append(chunk)
        self.size += len(chunk)
        return self

    def __len__(self) -> int:
        return self.size if self.size >= PIECE else 0

    def __bytes__(self) -> bytes:  # uvicorn's `receive`, should anything still call it
        return self.take()

    def take(self) -> bytes:
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.size = 0
        return body


class WireLink:
    """The connection's side of client_link.ClientLink: `connection_lost` calls `lost`."""

    __slots__ = ("task", "racing", "streaming", "gone")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None  # the task serving this request
        self.racing: asyncio.Task[Any] | None = None  # set while it waits for the upstream
        self.streaming = False  # the answer is being relayed
        self.gone = False

    async def race(self, awaitable: Awaitable[T]) -> T:
        if self.gone:
            if isinstance(awaitable, Coroutine):
                awaitable.close()  # a coroutine never awaited
            raise ClientGone()
        self.racing = self.task
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self.gone:
                raise ClientGone() from None
            raise
        finally:
            self.racing = None

    def lost(self) -> None:
        """The client's connection closed before the answer was complete."""
        if self.gone:
            return
        self.gone = True
        # Waiting for the upstream: ClientGone there (a 499 record). Streaming: the relay sees the
        # cancellation at its next wait and ends the exchange as cancelled. Anywhere else (the
        # policies' store lookups) the request goes on and meets `gone` at its next race: a
        # cancellation there would skip the exchange's end.
        task = self.racing if self.racing is not None else self.task if self.streaming else None
        if task is not None and not task.done():
            task.cancel()


async def serve(cycle: RequestResponseCycle, handler: Handler, link: WireLink) -> None:
    """Run the (protected) handler for one request and write its answer."""
    request = WireRequest(cycle, link)
    try:
        try:
            response = await handler(request)
        except GatewayError as exc:  # the key check, before the pipeline
            _write_whole(cycle, exc.status, _error_headers(exc), exc.json_bytes())
            return
        await _respond(cycle, response, link)
    except asyncio.CancelledError:
        if not cycle.response_started:
            cycle.transport.close()
        raise
    except Exception:  # the pipeline answers its own errors; this is the last resort
        log.exception("request on %s failed in the gateway's wire path", cycle.scope.get("path"))
        if not cycle.response_started and not cycle.disconnected:
            err = GatewayError(500, "internal gateway error; it has been logged", code="internal_error")
            _write_whole(cycle, 500, [(b"content-type", b"application/json")], err.json_bytes())
        else:
            cycle.transport.close()
    finally:
        cycle.on_response = _nothing
        link.task = None


async def _respond(cycle: RequestResponseCycle, answer: Answer, link: WireLink) -> None:
    """The pipeline's answer, written; then closed, whatever happened (core/answer.py)."""
    try:
        if answer.stream is None:
            _write_whole(cycle, answer.status, answer.headers, answer.body)
        else:
            await _write_stream(cycle, answer.status, answer.headers, answer.stream, link)
    finally:
        await answer.close()


def link_of(request: Any) -> ClientLink:
    """How the pipeline's waits learn that the client left: the wire path hears it from the connection
    (WireRequest.link); under ASGI a watcher on `receive` does."""
    return request.link if isinstance(request, WireRequest) else AsgiLink(request.receive)


def _head(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], tail: bytes) -> list[bytes]:
    line = STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status
    out = [line]
    for name, value in cycle.default_headers:
        out += (name, b": ", value, b"\r\n")
    for name, value in headers:
        out += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        out.append(b"connection: close\r\n")
    out.append(tail)
    return out


def _write_whole(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    if cycle.disconnected or cycle.response_started:
        return
    cycle.response_started = True
    has_length = any(name == b"content-length" for name, _ in headers)
    out = _head(cycle, status, headers, b"\r\n" if has_length else b"content-length: %d\r\n\r\n" % len(body))
    out.append(body)
    cycle.transport.write(b"".join(out))
    _complete(cycle)


async def _write_stream(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]],
                        chunks: AsyncIterator[bytes], link: WireLink) -> None:
    if cycle.disconnected or cycle.response_started:
        return
    cycle.response_started = True
    transport = cycle.transport
    flow = cycle.flow
    link.streaming = True
    pending: list[bytes] | None = _head(cycle, status, headers, b"transfer-encoding: chunked\r\n\r\n")
    async for piece in chunks:
        if cycle.disconnected:
            return
        if not piece:
            continue
        if flow.write_paused:
            if pending is not None:
                transport.write(b"".join(pending))
                pending = None
            await flow.drain()  # a slow client: wait, without reading more from the upstream
            if cycle.disconnected:
                return
        frame = b"%x\r\n%b\r\n" % (len(piece), piece)
        if pending is not None:
            # The head leaves with the first chunk: one write, and a stalled upstream still gets
            # its clean error status (the pipeline only answers once it has the first data).
            pending.append(frame)
            transport.write(b"".join(pending))
            pending = None
        else:
            transport.write(frame)
    if cycle.disconnected:
        return
    if pending is not None:
        pending.append(b"0\r\n\r\n")
        transport.write(b"".join(pending))
    else:
        transport.write(b"0\r\n\r\n")
    _complete(cycle)


def _complete(cycle: RequestResponseCycle) -> None:
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def _error_headers(exc: GatewayError) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json")]
    for name, value in (exc.headers or {}).items():
        headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    return headers


def _nothing() -> None:
    return None


@runtime_checkable
class Served(Protocol):
    """What the HTTP protocol reads of the gateway's application (app.FastPath)."""

    @property
    def settings(self) -> Settings: ...

    def wire_handler(self, path: str) -> Handler | None: ...


def served_app(app: Any) -> Served | None:
    """The gateway's application below uvicorn's and our middleware (the one with wire routes), if any."""
    for _ in range(8):
        if isinstance(app, Served):
            return app
        app = getattr(app, "app", None)  # uvicorn's and Starlette's middleware hold what they wrap as `app`
        if app is None:
            return None
    return None
