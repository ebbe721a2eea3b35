"""A stream relayed event by event, never buffered: each event checked and shaped for the client as
it arrives; whatever the upstream does after the first byte (stall, cut, garbage), the client's
stream ends well formed, with an error event and [DONE] where the upstream's did not end it."""

from __future__ import annotations

import logging
from typing import AsyncGenerator, Callable

import aiohttp

from . import chunk_run, reshape
from ..core.answer import SSE, Answer
from ..core.errors import GatewayError
from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime
from ..pipeline import messages_from_chat, passthrough
from ..pipeline.messages_relay import MessagesObserver
from ..upstream.client import Response as UpstreamResponse
from ..upstream.encoding import DecodeError, Decoder
from .inflight import IdleWatchdog, InFlight, answered, drain
from .sse import DONE, MAX_EVENT_BYTES, BadStream, EventObserver, EventSplitter, StreamObserver
from .whole import relay_whole

log = logging.getLogger("gateway.proxy")

_SSE_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")


async def relay_stream(f: InFlight, decoder: Decoder, body_bytes: int) -> Answer:
    """The client's answer to a streaming request: a stream once the upstream's first data is in (a
    stalled or dead upstream still gets a clean 504/502 status), or the whole answer an upstream
    sent instead of a stream."""
    observer, shape = _observer_for(f.ex, f.lane)
    first = await _first_data(f, decoder)
    if not _looks_like_sse(f.resp, first):
        # A JSON answer (an engine that ignored `stream`, or an error in a 200): judged whole.
        return await relay_whole(f, decoder, have=first)
    f.ex.status = 200
    relay = StreamRelay(f, decoder, observer, shape, first, body_bytes)
    return Answer(200, list(SSE), stream=relay.events(), release=relay.abandon)


def _observer_for(ex: Exchange, lane: LaneRuntime) -> tuple[EventObserver, Callable[[bytes], bytes]]:
    """What reads each event (usage, output, errors; token ids out where the client did not ask) and
    what shapes it for the client (its model name, the lane's reasoning field)."""
    scrubber = lane.upstream.scrubber
    if ex.upstream_path is not None:  # Anthropic Messages, served by the engine's chat completions
        chat = StreamObserver(ex, drop_usage_chunk=False, scrubber=scrubber, strip_ids=ex.token_ids_strip)
        return messages_from_chat.ChatAsMessages(chat, ex.public_model or ""), _same
    shape = reshape.for_lane(ex, lane).event
    if ex.path == passthrough.RESPONSES:
        return passthrough.ResponsesObserver(ex, scrubber), shape
    if ex.path == passthrough.MESSAGES:
        return MessagesObserver(ex, scrubber), shape
    return StreamObserver(ex, drop_usage_chunk=not ex.client_wants_usage, scrubber=scrubber,
                          strip_ids=ex.token_ids_strip), shape


async def _first_data(f: InFlight, decoder: Decoder) -> bytes:
    """The upstream's first bytes, decoded: enough to tell SSE from JSON when the Content-Type does
    not say (see _looks_like_sse); the client's first byte leaves the moment the upstream's arrives."""
    timeouts = f.lane.upstream.timeouts
    first = b""
    async with f.before_answer(timeouts.first_byte, "first-byte timeout",
                               f"the upstream sent nothing within {timeouts.first_byte:g}s"):
        need = 1 if f.resp.content_type == "text/event-stream" else 8
        while len(first.lstrip()) < need and len(first) < 65536:
            raw = await f.race(f.resp.content.readany())
            if not raw:
                first += decoder.finish()
                break
            first += decoder.feed(raw)
    if not first:
        f.failed("empty stream")
        raise GatewayError(502, "the upstream closed the stream without sending anything", code="upstream_error")
    return first


def _looks_like_sse(resp: UpstreamResponse, first: bytes) -> bool:
    if resp.content_type == "text/event-stream":
        return True
    return first.lstrip().startswith(_SSE_STARTS)


class StreamRelay:
    """The stream's events from the upstream's first data to its end; `abandon` releases what the
    relay would have when the client left before it started."""

    __slots__ = ("f", "decoder", "observer", "shape", "runs", "first", "body_bytes", "started")

    def __init__(self, f: InFlight, decoder: Decoder, observer: EventObserver, shape: Callable[[bytes], bytes],
                 first: bytes, body_bytes: int) -> None:
        self.f = f
        self.decoder = decoder
        self.observer = observer
        self.shape = shape
        # Runs of token chunks relayed at once (chunk_run.py), for chat completions as the engine sends them.
        self.runs = chunk_run.Runs(observer, shape) if type(observer) is StreamObserver else None
        self.first = first
        self.body_bytes = body_bytes
        self.started = False

    def abandon(self) -> None:
        # The response was never sent (the client left as it started): the relay's own `finally`
        # will never run, so release what it would have.
        if not self.started:
            self.f.failed("the response was never sent")

    async def events(self) -> AsyncGenerator[bytes, None]:
        self.started = True
        f, observer, shape, runs, decoder = self.f, self.observer, self.shape, self.runs, self.decoder
        ex, resp = f.ex, f.resp
        idle_s = f.lane.upstream.timeouts.idle
        # An event's bound grows with the request: the first chunk carries the prompt's ids when they
        # were asked for (~7 bytes per token, at most a token per byte of the body), 10 MB for a
        # 1.4M-token prompt, past the fixed bound alone.
        splitter = EventSplitter(MAX_EVENT_BYTES + 8 * self.body_bytes)
        ok = clean = False
        why = ""
        # The first event is split and relayed before the rest of its read is (a read can hold a
        # whole burst: splitting all of it first would delay the client's first token).
        data, later = _first_event_apart(self.first)
        watchdog = IdleWatchdog(resp, idle_s)
        failure: tuple[int, str, str] | None = None
        try:
            try:
                raw = self.first
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
                        await answered(ex)  # before the last bytes: the next turn may follow at once
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
                        await answered(ex)
                    if piece is not None:
                        yield shape(piece)
                if observer.done:
                    ok = True
                    clean = await drain(resp)
                else:
                    failure = (502, "upstream_disconnected", "the upstream closed the stream before it ended")
            except TimeoutError:
                failure = (504, "upstream_idle_timeout", f"no data from the upstream for {idle_s:g}s")
            except BadStream as exc:
                failure = (502, "upstream_bad_response", exc.message)
            except DecodeError as exc:
                failure = (502, "upstream_bad_response", str(exc))
            except (aiohttp.ClientError, OSError) as exc:
                if watchdog.fired:  # the watchdog closed the connection: an idle timeout, not a failure
                    failure = (504, "upstream_idle_timeout", f"no data from the upstream for {idle_s:g}s")
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
            f.done(ok=ok or ex.cancelled, why=why)


def _same(piece: bytes) -> bytes:
    return piece


def _first_event_apart(first: bytes) -> tuple[bytes, bytes]:
    """The first read cut after its first event's blank line (the splitter takes any cut)."""
    cut = first.find(b"\n\n") + 2
    if cut <= 1 or cut == len(first):
        return first, b""
    return first[:cut], first[cut:]
