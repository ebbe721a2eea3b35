"""Server-sent events from the upstream: split into events, watch them, decide what the client sees.

The relay forwards each event's bytes untouched; the observer parses each JSON payload once to
learn timing (first and last generated token), usage, and what the model generated.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import orjson

from . import chunk_shape
from ..pipeline import token_ids
from .chunk_shape import Shape
from ..core.exchange import Exchange
from .scrub import Scrubber
from ..upstream.errors import normalise_error
from .wellformed import chunk_problem

DONE = b"data: [DONE]\n\n"
_NO_SECRETS = Scrubber()


MAX_EVENT_BYTES = 8 * 1024 * 1024  # one event (a chunk of a stream); engines send well under 64 KB


class BadStream(Exception):
    """The upstream's stream cannot be relayed further; the client gets an error event and [DONE]."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class EventSplitter:
    """Reassembles SSE events (separated by a blank line) from arbitrary network reads.

    Any of the three line endings the SSE spec allows (CRLF, LF, CR), cut anywhere; an event
    growing past `max_bytes` without ending is refused (a hostile upstream must not fill memory).
    """

    __slots__ = ("_buf", "max_bytes")

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self.max_bytes = max_bytes

    def feed(self, data: bytes, final: bool = False) -> list[bytes]:
        """The events completed by `data`; `final` at the end of the stream (a last CR ends a line)."""
        buf, hold = self.joined(data, final)
        events = buf.split(b"\n\n")
        self.keep(events.pop(), hold)
        return [e + b"\n\n" for e in events if e.strip()]

    def joined(self, data: bytes, final: bool) -> tuple[bytes, bytes]:
        """What was kept with `data` after it, line endings made LF (starts at an event boundary),
        and a CR held back for the next read."""
        buf = self._buf + data if self._buf else data
        hold = b""
        if b"\r" in buf:
            if buf[-1:] == b"\r" and not final:  # maybe the first half of a CRLF: decide with the next read
                buf, hold = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return buf, hold

    def keep(self, rest: bytes, hold: bytes) -> None:
        """Keep the unfinished rest (refused past `max_bytes`) for the next read."""
        if len(rest) > self.max_bytes:
            self._buf = b""
            raise BadStream("upstream_bad_response",
                            f"the upstream sent an event larger than {self.max_bytes} bytes")
        self._buf = rest + hold if hold else rest

    def rest(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


class EventObserver(Protocol):
    """What the relay asks of a stream's observer, whatever the API (chat, completions, Responses)."""

    done: bool  # the stream's end was seen: what follows is not for the client

    @property
    def error(self) -> dict[str, Any] | None:
        """The upstream's own error, scrubbed, once one was relayed."""
        ...

    def relay(self, event: bytes) -> bytes | None:
        """The bytes the client gets for this event (None: nothing). Raises BadStream."""
        ...

    def failure_event(self, message: str, code: str) -> bytes:
        """How this API ends a stream the gateway had to cut short, in its own error shape."""
        ...


class StreamObserver:
    """Looks at every event of a chat-completion stream on its way to the client.

    Decides what the client sees: the event's own bytes (the usual case, no copy), a clean copy
    (an event with several fields or lines becomes one `data:` line; an upstream error is scrubbed
    and reshaped), nothing (the usage chunk the client did not ask for), or the end of the stream
    (`BadStream`: an event that is not a completion chunk must not reach the client's parser).
    """

    __slots__ = ("ex", "drop_usage_chunk", "done", "error", "scrubber", "strip_ids", "shapes", "tries")

    def __init__(self, ex: Exchange, drop_usage_chunk: bool, scrubber: Scrubber | None = None,
                 strip_ids: bool = False, learn_shapes: bool = True) -> None:
        self.ex = ex
        self.strip_ids = strip_ids  # token ids: the gateway asked for them, the client did not
        self.drop_usage_chunk = drop_usage_chunk
        self.done = False
        self.error: dict[str, Any] | None = None
        self.scrubber = scrubber or _NO_SECRETS
        self.shapes: list[Shape] = []  # the token chunks' shapes learnt in this stream (chunk_shape.py)
        self.tries = 0 if learn_shapes else chunk_shape.MAX_TRIES

    def observe(self, event: bytes) -> bool:
        """Record what the event says; return False when the client must not see it (tolerant)."""
        try:
            return self.relay(event) is not None
        except BadStream as exc:
            if self.error is None:
                self.error = {"message": exc.message, "code": exc.code}
            return False

    def failure_event(self, message: str, code: str) -> bytes:
        return error_event(message, code) + DONE

    def relay(self, event: bytes) -> bytes | None:
        """The bytes the client gets for this event (None: nothing). Raises BadStream."""
        if self._known(event):
            return event
        if self.strip_ids:  # out before anything else reads the event (vLLM sends ids in every chunk)
            # (An event known above had none to take: its bytes are a stripped chunk's, `null` where
            # an id array was; an engine that sends none skips this search.)
            stripped = token_ids.take(self.ex, event)
            if stripped is None:
                return None
            if stripped is not event:
                event = stripped
                if self._known(event):
                    return event
        simple = event[:5] == b"data:" and event.find(b"\n", 0, len(event) - 2) == -1
        payload: bytes | None
        if simple:
            payload = event[5:].strip()
        else:
            payload = data_of(event)
            if payload is None:
                return b":\n\n"  # a comment (keep-alive): harmless, and without the upstream's text
        if payload == b"[DONE]":
            self.done = True
            return DONE
        if not payload:
            return None  # an empty data field: the SSE spec dispatches nothing
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise BadStream("upstream_bad_response", "the upstream sent a stream event that is not JSON") from None
        if type(chunk) is dict and chunk.get("error") is not None:
            body = normalise_error(502, chunk, self.scrubber)
            self.error = body["error"]
            return b"data: " + orjson.dumps(body) + b"\n\n"
        problem = chunk_problem(chunk)
        if problem is not None:
            raise BadStream("upstream_bad_response", f"the upstream sent a malformed stream event: {problem}")
        usage = chunk.get("usage")
        if usage:
            self.ex.usage = usage
        pti = chunk.get("prompt_token_ids")  # vLLM return_token_ids: first chunk only
        if pti:
            self.ex.generated.prompt_token_ids = pti
        choices = chunk.get("choices")
        if not choices:
            # The usage-only chunk: the gateway asked for it; hide it unless the client did too.
            if usage and self.drop_usage_chunk:
                return None
        else:
            self._observe_choice(choices[0])
            if simple and self.tries < chunk_shape.MAX_TRIES and len(self.shapes) < chunk_shape.MAX_SHAPES:
                self._learn(event, chunk)
        # Several data lines joined may hold newlines (pretty-printed JSON): one line again.
        return event if simple else b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _known(self, event: bytes) -> bool:
        """The usual token chunk, known from its bytes (chunk_shape.py): recorded, nothing to parse."""
        for shape in self.shapes:
            text = shape.text(event)
            if text is not None:
                if text or shape.kind == chunk_shape.ARGUMENTS:  # a tool call's delta counts even when empty
                    self._produced(shape, text)
                return True
        return False

    def _learn(self, event: bytes, chunk: dict[str, Any]) -> None:
        shape = chunk_shape.learn(event, chunk)
        if shape is None:
            self.tries += 1
        else:
            self.shapes.append(shape)
            self.tries = 0

    def _produced(self, shape: Shape, text: str) -> None:
        """What `_observe_choice` records for a chunk carrying only this text."""
        gen = self.ex.generated
        if shape.kind == chunk_shape.CONTENT:
            gen.content.append(text)
        elif shape.kind == chunk_shape.REASONING:
            gen.reasoning.append(text)
        else:
            gen.add_tool_call_delta({"index": shape.call, "function": {"arguments": text}})
        now = time.perf_counter()
        ex = self.ex
        if ex.t_first_token is None:
            ex.t_first_token = now
        ex.t_last_token = now
        ex.token_chunk_times.append(now)

    def _observe_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        gen = self.ex.generated
        produced = False
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            gen.reasoning.append(reasoning)
            produced = True
        content = delta.get("content")
        if content:
            gen.content.append(content)
            produced = True
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for call in tool_calls:
                gen.add_tool_call_delta(call)
            produced = True
        if choice.get("finish_reason"):
            gen.finish_reason = choice["finish_reason"]
        ids = choice.get("token_ids")
        if ids:
            gen.token_ids.extend(ids)
        if produced:
            now = time.perf_counter()
            if self.ex.t_first_token is None:
                self.ex.t_first_token = now
            self.ex.t_last_token = now
            self.ex.token_chunk_times.append(now)


def observe_completion(ex: Exchange, body: bytes | dict[str, Any]) -> None:
    """Non-streaming response: read usage and the generated message from the JSON body (or the
    already parsed body: the proxy parses it once to check its shape)."""
    if isinstance(body, dict):
        data: Any = body
    else:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
    if not isinstance(data, dict):
        return
    if isinstance(data.get("usage"), dict):
        ex.usage = data["usage"]
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return
    choice = choices[0]
    msg = choice.get("message") or {}
    if not isinstance(msg, dict):
        return
    gen = ex.generated
    if isinstance(data.get("prompt_token_ids"), list):
        gen.prompt_token_ids = data["prompt_token_ids"]
    if isinstance(choice.get("token_ids"), list):
        gen.token_ids = choice["token_ids"]
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        gen.reasoning.append(reasoning)
    content = msg.get("content")
    if isinstance(content, str) and content:
        gen.content.append(content)
    for i, call in enumerate(msg.get("tool_calls") or []):
        if not isinstance(call, dict):
            continue
        gen.tool_calls[i] = {
            "id": call.get("id"),
            "type": "function",
            "function": {
                "name": (call.get("function") or {}).get("name", ""),
                "arguments": (call.get("function") or {}).get("arguments", ""),
            },
        }
    gen.finish_reason = choice.get("finish_reason")


def error_event(message: str, code: str, type: str = "api_error") -> bytes:
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def data_of(event: bytes) -> bytes | None:
    """The event's data as the SSE spec defines it: every `data` field, joined by newlines.

    Comments (`:...`) and other fields (`event`, `id`, `retry`) are dropped: the openai client
    treats a named event as something else than a chunk, so the client only ever sees `data:`.
    """
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if not line or line[:1] == b":":
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if value[:1] == b" " else value)
    return b"\n".join(data).strip() if data else None


def typed_event(payload: bytes) -> dict[str, Any]:
    """A typed stream event's data (Responses, Anthropic Messages): a JSON object with a string `type`,
    else BadStream (it must not reach the client's parser)."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise BadStream("upstream_bad_response", "the upstream sent a stream event that is not JSON") from None
    if type(obj) is not dict or not isinstance(obj.get("type"), str):
        raise BadStream("upstream_bad_response", "the upstream sent a stream event without a type")
    return obj
