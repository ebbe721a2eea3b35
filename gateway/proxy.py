"""Forward a prepared request to a lane and relay the answer: streams event by event, never buffered."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable

import aiohttp
import orjson
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive

from .errors import GatewayError, error_body
from .exchange import Exchange
from .runtime import LaneRuntime
from .sse import DONE, EventSplitter, StreamObserver, error_event, observe_completion
from .upstream import UpstreamFailure

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def forward(
    ex: Exchange,
    lane: LaneRuntime,
    path: str,
    body: bytes,
    receive: Receive,
    on_end: Callable[[], None],
) -> Response:
    """Send `body` to the lane and return the client's response. `on_end` runs once, when it is over."""
    upstream = lane.upstream
    order = lane.router.order(upstream.replicas, ex)
    ex.t_forwarded = time.perf_counter()

    def retried(replica: Any) -> None:
        ex.retries += 1

    try:
        replica, resp = await _race_disconnect(
            upstream.send(order, path, body, ex.request_id, on_retry=retried), receive, ex
        )
    except UpstreamFailure as exc:
        ex.upstream_error = exc.message
        raise exc.as_gateway_error() from None
    ex.replica = replica.url
    lane.router.served(replica, ex)
    ex.t_first_byte = time.perf_counter()

    if resp.status >= 400:
        return await _relay_error(ex, lane, replica, resp, on_end)
    if ex.stream and resp.content_type == "text/event-stream":
        return await _relay_stream(ex, lane, replica, resp, receive, on_end)
    return await _relay_whole(ex, lane, replica, resp, receive, on_end)


async def _relay_whole(ex, lane, replica, resp, receive, on_end) -> Response:
    try:
        async with asyncio.timeout(lane.upstream.timeouts.first_byte):
            data = await _race_disconnect(resp.read(), receive, ex)
    except TimeoutError:
        resp.close()
        _done(replica, lane, ok=False, why="timeout reading the body")
        raise GatewayError(504, "the upstream did not finish its answer in time", code="upstream_timeout") from None
    except aiohttp.ClientError as exc:
        resp.close()
        _done(replica, lane, ok=False, why=str(exc))
        raise GatewayError(502, f"the upstream connection failed: {type(exc).__name__}", code="upstream_error") from None
    except BaseException:
        resp.close()
        replica.inflight -= 1
        raise
    _done(replica, lane, ok=True)
    ex.status = resp.status
    now = time.perf_counter()
    ex.t_first_token = ex.t_last_token = now
    observe_completion(ex, data)
    response = Response(data, status_code=resp.status, media_type=resp.content_type or "application/json")
    on_end()
    return response


async def _relay_error(ex, lane, replica, resp, on_end) -> Response:
    try:
        data = await resp.read()
    except aiohttp.ClientError:
        data = b""
    finally:
        resp.release()
    _done(replica, lane, ok=resp.status < 500, why=f"HTTP {resp.status}")
    body = normalise_error(resp.status, data)
    ex.fail(resp.status, str(body["error"].get("code")), str(body["error"].get("message"))[:500])
    ex.upstream_error = ex.error_message
    response = Response(orjson.dumps(body), status_code=resp.status, media_type="application/json")
    on_end()
    return response


async def _relay_stream(ex, lane, replica, resp, receive, on_end) -> Response:
    observer = StreamObserver(ex, drop_usage_chunk=not ex.client_wants_usage)
    timeouts = lane.upstream.timeouts
    # Wait for the first event before answering, so a stalled or dead upstream still gets a clean
    # 504/502 status; the client's first byte leaves the moment the upstream's arrives.
    try:
        async with asyncio.timeout(timeouts.first_byte):
            first = await _race_disconnect(resp.content.readany(), receive, ex)
    except TimeoutError:
        resp.close()
        _done(replica, lane, ok=False, why="first-byte timeout")
        raise GatewayError(504, f"the upstream sent nothing within {timeouts.first_byte:g}s",
                           code="upstream_timeout") from None
    except (aiohttp.ClientError, OSError) as exc:
        resp.close()
        _done(replica, lane, ok=False, why=str(exc))
        raise GatewayError(502, f"the upstream connection failed: {type(exc).__name__}",
                           code="upstream_error") from None
    except BaseException:
        resp.close()
        replica.inflight -= 1
        raise
    if not first:
        resp.close()
        _done(replica, lane, ok=False, why="empty stream")
        raise GatewayError(502, "the upstream closed the stream without sending anything", code="upstream_error")
    ex.status = resp.status

    started = False

    def abandon() -> None:
        # The response was never sent (the client left as it started): the relay's own `finally`
        # will never run, so release what it would have.
        if not started:
            resp.close()
            _done(replica, lane, ok=False, why="the response was never sent")
            on_end()

    async def relay() -> AsyncIterator[bytes]:
        nonlocal started
        started = True
        splitter = EventSplitter()
        ok = False
        why = ""
        data: bytes = first
        watchdog = IdleWatchdog(resp, timeouts.idle)
        try:
            while data:
                out = [e for e in splitter.feed(data) if observer.observe(e)]
                if out:
                    yield b"".join(out) if len(out) > 1 else out[0]
                # The idle timeout covers only the wait for the upstream, never a slow client.
                watchdog.waiting()
                data = await resp.content.readany()
                watchdog.got_data()
            if watchdog.fired:
                raise TimeoutError
            if observer.done:
                ok = True
            else:
                why = "the upstream closed the stream before it ended"
                ex.fail(502, "upstream_disconnected", why)
                yield error_event(why, "upstream_disconnected") + DONE
        except TimeoutError:
            why = f"no data from the upstream for {timeouts.idle:g}s"
            ex.fail(504, "upstream_idle_timeout", why)
            yield error_event(why, "upstream_idle_timeout") + DONE
        except (aiohttp.ClientError, OSError) as exc:
            if watchdog.fired:  # the watchdog closed the connection: an idle timeout, not a failure
                why = f"no data from the upstream for {timeouts.idle:g}s"
                ex.fail(504, "upstream_idle_timeout", why)
                yield error_event(why, "upstream_idle_timeout") + DONE
                return
            why = f"the upstream connection failed mid-stream: {type(exc).__name__}"
            ex.fail(502, "upstream_disconnected", why)
            yield error_event(why, "upstream_disconnected") + DONE
        except BaseException:
            # The client went away (closing the response cancels the upstream). After [DONE] that is
            # just a client hanging up early on a finished answer, not a cancelled request.
            if observer.done:
                ok = True
            else:
                ex.cancelled = True
                why = "client disconnected"
            raise
        finally:
            watchdog.stop()
            if ok and not ex.cancelled:
                resp.release()
            else:
                resp.close()
            if observer.error is not None and ex.error_code is None:
                ex.fail(ex.status, str(observer.error.get("code")), str(observer.error.get("message"))[:500])
            _done(replica, lane, ok=ok or ex.cancelled, why=why)
            on_end()

    return RelayResponse(relay(), abandon, status_code=resp.status, media_type="text/event-stream",
                         headers=dict(SSE_HEADERS))


class RelayResponse(StreamingResponse):
    """A relayed stream that can be abandoned before it starts (see `Pipeline`: every exchange ends)."""

    def __init__(self, content: AsyncIterator[bytes], abandon: Callable[[], None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.abandon = abandon


class IdleWatchdog:
    """The idle timeout of a stream without a timer per chunk: one check every quarter of the
    timeout; when the upstream has sent nothing for the whole timeout while we waited, it closes
    the upstream response (which ends the pending read)."""

    def __init__(self, resp: aiohttp.ClientResponse, idle_s: float) -> None:
        self.resp = resp
        self.idle_s = idle_s
        self.fired = False
        self._since: float | None = None
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(idle_s / 4, self._check)

    def waiting(self) -> None:
        self._since = self._loop.time()

    def got_data(self) -> None:
        self._since = None

    def _check(self) -> None:
        if self._since is not None and self._loop.time() - self._since >= self.idle_s:
            self.fired = True
            self.resp.close()
            return
        self._handle = self._loop.call_later(self.idle_s / 4, self._check)

    def stop(self) -> None:
        self._handle.cancel()


def _done(replica, lane: LaneRuntime, ok: bool, why: str = "") -> None:
    replica.inflight -= 1
    if ok:
        lane.upstream.record_success(replica)
    else:
        lane.upstream.record_failure(replica, why)


async def _race_disconnect(awaitable, receive: Receive, ex: Exchange):
    """Await `awaitable`, but give up (cancelling it) as soon as the client disconnects.

    One watcher task per call: when the client goes away it cancels the task awaiting here.
    """
    current = asyncio.current_task()
    gone = False

    def on_watcher_done(task: asyncio.Task) -> None:
        nonlocal gone
        if not task.cancelled() and task.exception() is None and current is not None:
            gone = True
            current.cancel()

    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    watcher.add_done_callback(on_watcher_done)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if gone:
            ex.cancelled = True
            raise ClientGone() from None
        raise
    finally:
        watcher.remove_done_callback(on_watcher_done)
        watcher.cancel()


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def normalise_error(status: int, data: bytes) -> dict[str, Any]:
    """Any engine's error body → OpenAI's `{"error": {message, type, param, code}}`."""
    try:
        parsed = orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        parsed = None
    err: dict[str, Any] | None = None
    if isinstance(parsed, dict):
        if isinstance(parsed.get("error"), dict):
            err = parsed["error"]
        elif "message" in parsed:  # SGLang and old vLLM: flat {"object": "error", ...}
            err = parsed
        elif isinstance(parsed.get("detail"), (str, list)):  # FastAPI's default
            err = {"message": str(parsed["detail"])}
    if err is None:
        text = data.decode("utf-8", "replace").strip()[:500] if data else ""
        err = {"message": text or f"upstream answered HTTP {status}"}
    code = err.get("code")
    return error_body(
        str(err.get("message", "")),
        type=str(err.get("type") or ("invalid_request_error" if status < 500 else "api_error")),
        param=err.get("param") if isinstance(err.get("param"), str) else None,
        code=code if isinstance(code, str) else None,
    )
