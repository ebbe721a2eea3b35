"""Server-sent events from the upstream: split into events, watch them, decide what the client sees.

The relay forwards each event's bytes untouched; the observer parses each JSON payload once to
learn timing (first and last generated token), usage, and what the model generated.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from .exchange import Exchange

DONE = b"data: [DONE]\n\n"


class EventSplitter:
    """Reassembles SSE events (separated by a blank line) from arbitrary network reads."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        if b"\r\n" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        return [e + b"\n\n" for e in events if e.strip()]

    def rest(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


class StreamObserver:
    """Looks at every event of a chat-completion stream on its way to the client."""

    __slots__ = ("ex", "drop_usage_chunk", "done", "error")

    def __init__(self, ex: Exchange, drop_usage_chunk: bool) -> None:
        self.ex = ex
        self.drop_usage_chunk = drop_usage_chunk
        self.done = False
        self.error: dict[str, Any] | None = None

    def observe(self, event: bytes) -> bool:
        """Record what the event says; return False when the client must not see it."""
        payload = _data_of(event)
        if payload is None:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(chunk, dict):
            return True
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            return True
        usage = chunk.get("usage")
        if usage:
            self.ex.usage = usage
        pti = chunk.get("prompt_token_ids")  # vLLM return_token_ids: first chunk only
        if pti:
            self.ex.generated.prompt_token_ids = pti
        choices = chunk.get("choices")
        if not choices:
            # The usage-only chunk: the gateway asked for it; hide it unless the client did too.
            return not (usage and self.drop_usage_chunk)
        self._observe_choice(choices[0])
        return True

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


def observe_completion(ex: Exchange, body: bytes) -> None:
    """Non-streaming response: read usage and the generated message from the JSON body."""
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
    gen = ex.generated
    if isinstance(data.get("prompt_token_ids"), list):
        gen.prompt_token_ids = data["prompt_token_ids"]
    if isinstance(choice.get("token_ids"), list):
        gen.token_ids = choice["token_ids"]
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        gen.reasoning.append(reasoning)
    if msg.get("content"):
        gen.content.append(msg["content"])
    for i, call in enumerate(msg.get("tool_calls") or []):
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


def _data_of(event: bytes) -> bytes | None:
    # Events from engines are a single `data: ...` line; tolerate comments and other fields.
    if event.startswith(b"data:"):
        return event[5:].strip()
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None
