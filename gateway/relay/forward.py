"""Forward a prepared request to a lane and relay the answer: streams event by event, never buffered."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncGenerator, Callable

import aiohttp
import orjson

from . import chunk_run, reshape
from ..pipeline import messages_from_chat, passthrough, token_ids
from ..pipeline.body_parts import Body
from ..server.client_link import ClientGone, ClientLink
from ..upstream.encoding import DecodeError, decoder_for
from ..core.answer import SSE, Answer
from ..core.errors import GatewayError, error_body
from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime
from ..pipeline.messages_relay import MessagesObserver
from .sse import DONE, MAX_EVENT_BYTES, BadStream, EventSplitter, EventObserver, StreamObserver, observe_completion
from ..upstream.replicas import UpstreamFailure
from ..upstream.client import Response as UpstreamResponse
from ..upstream.errors import MAX_ERROR_BODY, client_status, normalise_error
from .wellformed import completion_problem

log = logging.getLogger("gateway.proxy")
MAX_BODY_BYTES = 64 * 1024 * 1024  # a whole (non-streamed) answer; the largest real ones are a few MB
_NOT_JSON = object()

async def forward(
    ex: Exchange,
    lane: LaneRuntime,
    path: str,
    body: Body,
    link: ClientLink,
) -> Answer:
    """Send `body` to the lane and return the client's answer (whose `close` ends what it holds).

    Whatever the upstream does (any status, any body, any encoding, a stream cut anywhere), the
    client gets either the upstream's answer, checked to be well formed, or an OpenAI-shaped error:
    as a status before the first byte, as a final error event and [DONE] after it.
    """
    upstream = lane.upstream
    order = lane.router.order(upstream.replicas, ex)
    ex.t_forwarded = time.perf_counter()

    def retried(replica: Any) -> None:
        ex.retries += 1

    try:
        traceparent = ex.trace.upstream_started(ex, lane.config) if ex.trace is not None else None
        replica, resp = await _race(link, upstream.send(order, path, body, ex.request_id, on_retry=retried,
                                                        traceparent=traceparent), ex)
    except UpstreamFailure as exc:
        ex.upstream_error = exc.message
        raise exc.as_gateway_error() from None
    ex.replica = replica.url
    lane.router.served(replica, ex)
    ex.t_first_byte = time.perf_counter()

    status = resp.status
    if not 200 <= status < 300:
        return await _relay_error(ex, lane, replica, resp)
    try:
        decoder = decoder_for(resp.headers.get("Content-Encoding"), MAX_BODY_BYTES)
    except DecodeError as exc:
        resp.close()
        _done(replica, lane, ok=False, why=str(exc))
        raise _bad_response(ex, str(exc)) from None
    if ex.stream:
        return await _relay_stream(ex, lane, replica, resp, decoder, link, len(body))
    return await _relay_whole(ex, lane, replica, resp, decoder, link)


async def _read_all(resp: UpstreamResponse, decoder: Any, have: bytes = b"",
                    limit: int = MAX_BODY_BYTES) -> bytes:
    """The rest of the body, decoded, at most `limit` bytes (DecodeError beyond)."""
    parts = [have] if have else []
    size = len(have)
    while True:
        raw = await resp.content.readany()
        data = decoder.feed(raw) if raw else decoder.finish()
        if data:
            size += len(data)
            if size > limit:
                raise DecodeError(f"the upstream's answer is larger than {limit} bytes")
            parts.append(data)
        if not raw:
            return b"".join(parts)


async def _relay_whole(ex, lane, replica, resp, decoder, link, have: bytes = b"") -> Answer:
    try:
        async with asyncio.timeout(lane.upstream.timeouts.first_byte):
            data = await _race(link, _read_all(resp, decoder, have), ex)
    except TimeoutError:
        resp.close()
        _done(replica, lane, ok=False, why="timeout reading the body")
        raise GatewayError(504, "the upstream did not finish its answer in time", code="upstream_timeout") from None
    except (aiohttp.ClientError, OSError) as exc:
        resp.close()
        _done(replica, lane, ok=False, why=type(exc).__name__)
        raise GatewayError(502, f"the upstream connection failed: {type(exc).__name__}",
                           code="upstream_error") from None
    except DecodeError as exc:
        resp.close()
        _done(replica, lane, ok=False, why=str(exc))
        raise _bad_response(ex, str(exc)) from None
    except BaseException:
        resp.close()
        replica.inflight -= 1
        raise
    resp.release()
    # The prompt's ids leave as their JSON, parsed by the analysis off the event loop (token_ids.py).
    read = token_ids.take_prompt(ex, data)
    try:
        parsed = orjson.loads(read)
    except orjson.JSONDecodeError:
        parsed = _NOT_JSON
    if type(parsed) is dict and (parsed.get("error") is not None or parsed.get("object") == "error"):
        # An error inside a 2xx (some proxies and engines; vLLM's flat shape): an error all the same.
        _done(replica, lane, ok=False, why="error object in a 2xx answer")
        body = normalise_error(502, parsed, lane.upstream.scrubber)
        return _error_answer(ex, 502, body)
    if ex.stream:
        _done(replica, lane, ok=False, why="no stream")
        raise _bad_response(ex, "the upstream answered a streaming request without a stream")
    wire = ex.upstream_path or ex.path  # the engine's API (the client's, unless the gateway translates)
    problem = "it is not JSON" if parsed is _NOT_JSON else (
        completion_problem(parsed) if wire in passthrough.STREAM_OPTIONS
        else None if type(parsed) is dict else "the answer is not a JSON object")
    if problem is not None:
        _done(replica, lane, ok=False, why="malformed answer")
        raise _bad_response(ex, f"the upstream's answer is malformed: {problem}")
    _done(replica, lane, ok=True)
    ex.status = 200
    now = time.perf_counter()
    ex.t_first_token = ex.t_last_token = now
    (observe_completion if wire in passthrough.STREAM_OPTIONS else passthrough.observe_response_body)(ex, parsed)
    if ex.answered:
        await _answered(ex)
    if ex.upstream_path is not None:  # a translated API: the answer in the client's API
        data = orjson.dumps(messages_from_chat.message_of(parsed, ex.public_model or ""))
    else:
        if ex.token_ids_strip:  # the gateway asked for the ids, the client did not
            data = token_ids.strip_body(read)[0]
        data = reshape.for_lane(ex, lane).body(data)  # the client's model name, the lane's reasoning field
    ex.response_bytes = len(data)
    return Answer.json(200, data)


async def _relay_error(ex, lane, replica, resp) -> Answer:
    data = b""
    complete = False
    try:
        async with asyncio.timeout(lane.upstream.timeouts.first_byte):
            decoder = decoder_for(resp.headers.get("Content-Encoding"), MAX_ERROR_BODY)
            while len(data) < MAX_ERROR_BODY:
                raw = await resp.content.readany()
                data += decoder.feed(raw) if raw else decoder.finish()
                if not raw:
                    complete = True
                    break
    except (aiohttp.ClientError, OSError, TimeoutError, DecodeError):
        pass  # what arrived is all there is to say
    except BaseException:
        resp.close()
        replica.inflight -= 1
        raise
    if complete:
        resp.release()  # read to the end: the connection can serve the next request
    else:
        resp.close()
    upstream_status = resp.status
    status, imposed = client_status(upstream_status)
    _done(replica, lane, ok=upstream_status < 500 and imposed is None, why=f"HTTP {upstream_status}")
    body = normalise_error(upstream_status, data[:MAX_ERROR_BODY], lane.upstream.scrubber)
    headers = {}
    if imposed == "upstream_auth_failed":
        ex.upstream_error = f"HTTP {upstream_status}: {body['error']['message']}"
        body = error_body("the upstream rejected the gateway's credentials for this model; "
                          "the gateway's operator has to fix the lane's key", type="api_error",
                          code="upstream_auth_failed")
    elif imposed is not None:
        ex.upstream_error = f"HTTP {upstream_status}: {body['error']['message']}"
        body["error"]["code"] = body["error"]["code"] if imposed == "upstream_error" and body["error"]["code"] \
            else imposed
        body["error"]["type"] = "api_error"
        if imposed == "upstream_bad_response":
            body["error"]["message"] = f"the upstream answered HTTP {upstream_status}: {body['error']['message']}"
    retry_after = resp.headers.get("Retry-After", "")
    if status in (429, 503) and retry_after.isdigit() and len(retry_after) <= 5:
        headers["Retry-After"] = retry_after
    return _error_answer(ex, status, body, headers)


def _error_answer(ex: Exchange, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    err = body["error"]
    ex.fail(status, err.get("code"), str(err.get("message")))
    if ex.upstream_error is None:
        ex.upstream_error = ex.error_message
    answer = Answer.json(status, orjson.dumps(body), headers)
    ex.response_bytes = len(answer.body)
    return answer


def _bad_response(ex: Exchange, why: str) -> GatewayError:
    ex.upstream_error = why
    return GatewayError(502, why, code="upstream_bad_response", type="upstream_error")


_SSE_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")


def _looks_like_sse(resp: UpstreamResponse, first: bytes) -> bool:
    if resp.content_type == "text/event-stream":
        return True
    return first.lstrip().startswith(_SSE_STARTS)


async def _relay_stream(ex, lane, replica, resp, decoder, link, body_bytes: int) -> Answer:
    # token ids: the gateway asked for them, the client did not: the observer takes them out
    observer: EventObserver
    shape: Callable[[bytes], bytes] = reshape.for_lane(ex, lane).event
    if ex.upstream_path is not None:  # Anthropic Messages, served by the engine's chat completions
        observer = messages_from_chat.ChatAsMessages(
            StreamObserver(ex, drop_usage_chunk=False, scrubber=lane.upstream.scrubber, strip_ids=ex.token_ids_strip),
            ex.public_model or "")
        shape = _same
    elif ex.path == passthrough.RESPONSES:
        observer = passthrough.ResponsesObserver(ex, lane.upstream.scrubber)
    elif ex.path == passthrough.MESSAGES:
        observer = MessagesObserver(ex, lane.upstream.scrubber)
    else:
        observer = StreamObserver(ex, drop_usage_chunk=not ex.client_wants_usage, scrubber=lane.upstream.scrubber,
                                  strip_ids=ex.token_ids_strip)
    runs = chunk_run.Runs(observer, shape) if type(observer) is StreamObserver else None
    timeouts = lane.upstream.timeouts
    # Wait for the first data before answering, so a stalled or dead upstream still gets a clean
    # 504/502 status; the client's first byte leaves the moment the upstream's arrives.
    first = b""
    try:
        async with asyncio.timeout(timeouts.first_byte):
            # Enough to tell SSE from JSON when the Content-Type does not say (see _looks_like_sse).
            need = 1 if resp.content_type == "text/event-stream" else 8
            while len(first.lstrip()) < need and len(first) < 65536:
                raw = await _race(link, resp.content.readany(), ex)
                if not raw:
                    first += decoder.finish()
                    break
                first += decoder.feed(raw)
    except TimeoutError:
        resp.close()
        _done(replica, lane, ok=False, why="first-byte timeout")
        raise GatewayError(504, f"the upstream sent nothing within {timeouts.first_byte:g}s",
                           code="upstream_timeout") from None
    except (aiohttp.ClientError, OSError) as exc:
        resp.close()
        _done(replica, lane, ok=False, why=type(exc).__name__)
        raise GatewayError(502, f"the upstream connection failed: {type(exc).__name__}",
                           code="upstream_error") from None
    except DecodeError as exc:
        resp.close()
        _done(replica, lane, ok=False, why=str(exc))
        raise _bad_response(ex, str(exc)) from None
    except BaseException:
        resp.close()
        replica.inflight -= 1
        raise
    if not first:
        resp.close()
        _done(replica, lane, ok=False, why="empty stream")
        raise GatewayError(502, "the upstream closed the stream without sending anything", code="upstream_error")
    if not _looks_like_sse(resp, first):
        # A JSON answer (an engine that ignored `stream`, or an error in a 200): judged whole.
        return await _relay_whole(ex, lane, replica, resp, decoder, link, have=first)
    ex.status = 200

    started = False

    def abandon() -> None:
        # The response was never sent (the client left as it started): the relay's own `finally`
        # will never run, so release what it would have.
        if not started:
            resp.close()
            _done(replica, lane, ok=False, why="the response was never sent")

    async def relay() -> AsyncGenerator[bytes, None]:
        nonlocal started
        started = True
        # An event's bound grows with the request: the first chunk carries the prompt's ids when they
        # were asked for (~7 bytes per token, at most a token per byte of the body), 10 MB for a
        # 1.4M-token prompt, past the fixed bound alone.
        splitter = EventSplitter(MAX_EVENT_BYTES + 8 * body_bytes)
        ok = clean = False
        why = ""
        # The first event is split and relayed before the rest of its read is (a read can hold a
        # whole burst: splitting all of it first would delay the client's first token).
        data, later = _first_event_apart(first)
        watchdog = IdleWatchdog(resp, timeouts.idle)
        failure: tuple[int, str, str] | None = None
        try:
            try:
                raw = first
                sent = False
                while True:
                    out: list[bytes] = []
                    if sent and runs is not None:  # runs of token chunks at once (chunk_run.py)
                        runs.relay_read(splitter, data, not raw, out)
                    else:
                        for event in splitter.feed(data, final=not raw):
                            piece = observer.relay(event)
                            if piece is not None:
                                out.append(shape(piece))
                                if not sent:
                                    # The first event leaves on its own, not after the rest of its
                                    # read (an engine's first read can hold dozens): the first token.
                                    sent = True
                                    ex.response_bytes += len(out[0])
                                    yield out.pop()
                            if observer.done:
                                break
                    if observer.done and ex.answered:
                        await _answered(ex)  # before the last bytes: the next turn may follow at once
                    if out:
                        piece = b"".join(out) if len(out) > 1 else out[0]
                        ex.response_bytes += len(piece)
                        yield piece
                    if observer.done or not raw:
                        break  # whatever an upstream sends after [DONE] is not for the client
                    if later:
                        data, later = later, b""
                        continue
                    # The idle timeout covers only the wait for the upstream, never a slow client.
                    watchdog.waiting()
                    raw = await resp.content.readany()
                    watchdog.got_data()
                    data = decoder.feed(raw) if raw else decoder.finish()
                if watchdog.fired:
                    raise TimeoutError
                tail = splitter.rest().strip()
                if not observer.done and tail[:5] == b"data:" and tail[5:].strip() == b"[DONE]":
                    # The final blank line was cut off: the answer is complete, and ends as the observer
                    # ends it (a Messages client served by chat completions gets its closing events).
                    piece = observer.relay(tail + b"\n\n")
                    if ex.answered:
                        await _answered(ex)
                    if piece is not None:
                        yield shape(piece)
                if observer.done:
                    ok = True
                    clean = await _drain(resp)
                else:
                    failure = (502, "upstream_disconnected", "the upstream closed the stream before it ended")
            except TimeoutError:
                failure = (504, "upstream_idle_timeout", f"no data from the upstream for {timeouts.idle:g}s")
            except BadStream as exc:
                failure = (502, "upstream_bad_response", exc.message)
            except DecodeError as exc:
                failure = (502, "upstream_bad_response", str(exc))
            except (aiohttp.ClientError, OSError) as exc:
                if watchdog.fired:  # the watchdog closed the connection: an idle timeout, not a failure
                    failure = (504, "upstream_idle_timeout", f"no data from the upstream for {timeouts.idle:g}s")
                else:
                    failure = (502, "upstream_disconnected",
                               f"the upstream connection failed mid-stream: {type(exc).__name__}")
            except Exception:
                # A fault of the gateway's own: the client still gets a well-formed end of the stream.
                log.exception("request %s: relaying the stream failed", ex.request_id)
                failure = (500, "internal_error", "internal gateway error while relaying the stream")
            if failure is not None:
                status, code, why = failure
                if code != "internal_error":
                    ex.upstream_error = ex.upstream_error or why
                if observer.error is None:
                    ex.fail(status, code, why)
                    yield observer.failure_event(why, code)
                else:  # the upstream's own error event already told the client what went wrong
                    yield DONE
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
            if clean and not ex.cancelled:
                resp.release()  # back to the pool
            else:
                resp.close()
            if observer.error is not None and ex.error_code is None:
                ex.fail(ex.status, observer.error.get("code"), str(observer.error.get("message"))[:500])
                ex.upstream_error = ex.error_message
            _done(replica, lane, ok=ok or ex.cancelled, why=why)

    return Answer(200, list(SSE), stream=relay(), release=abandon)


ANSWERED_S = 0.5  # at most this long for what waits on a complete answer (a store write), then it goes on


async def _answered(ex: Exchange) -> None:
    """What waits on the complete answer before its last bytes leave (ex.answered), each bounded: a slow
    or broken store delays the end of an answer by at most ANSWERED_S, never fails it."""
    hooks, ex.answered = ex.answered, []
    for hook in hooks:
        try:
            async with asyncio.timeout(ANSWERED_S):
                await hook()
        except Exception:  # bookkeeping never costs the client its answer
            log.exception("request %s: a write before the answer's end failed", ex.request_id)


def _same(piece: bytes) -> bytes:
    return piece


def _first_event_apart(first: bytes) -> tuple[bytes, bytes]:
    """The first read cut after its first event's blank line (the splitter takes any cut)."""
    cut = first.find(b"\n\n") + 2
    if cut <= 1 or cut == len(first):
        return first, b""
    return first[:cut], first[cut:]


async def _drain(resp: UpstreamResponse, wait_s: float = 1.0, limit: int = 65536) -> bool:
    """After [DONE]: read to the end of the response so its connection can be pooled again.

    An engine's last chunk-terminator follows [DONE] within a millisecond; an upstream that keeps
    talking or stalls is cut off after `wait_s` or `limit` bytes (the client already has its answer).
    """
    content = resp.content
    if content.at_eof():
        return True
    seen = 0
    try:
        async with asyncio.timeout(wait_s):
            while not content.at_eof():
                raw = await content.readany()
                if not raw:
                    return True
                seen += len(raw)
                if seen > limit:
                    return False
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
    return True


class IdleWatchdog:
    """The idle timeout of a stream without a timer per chunk: one check every quarter of the
    timeout; when the upstream has sent nothing for the whole timeout while we waited, it closes
    the upstream response (which ends the pending read)."""

    def __init__(self, resp: UpstreamResponse, idle_s: float) -> None:
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


async def _race(link: ClientLink, awaitable, ex: Exchange):
    """`await awaitable` unless the client leaves first (then ClientGone, and the exchange is cancelled)."""
    try:
        return await link.race(awaitable)
    except ClientGone:
        ex.cancelled = True
        raise


__all__ = ["ClientGone", "forward"]
