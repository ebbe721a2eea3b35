"""The Anthropic Messages API on lanes whose engine does not serve it (SGLang, generic): the request goes
to the engine as the chat completion vLLM would make of it (messages_chat.chat_body, so both paths
render the same prompt), and the answer comes back in Anthropic's shape, converted as vLLM converts
its own chat answers (`vllm/entrypoints/anthropic/serving.py`, `messages_full_converter` and
`message_stream_converter`):

- a whole answer: a `thinking` block (the reasoning, with a signature), a `text` block, a `tool_use`
  block per call (its arguments parsed); an empty answer is one empty text block;
- a stream: `message_start`, then per block `content_block_start`, deltas (`thinking_delta` then a
  `signature_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`; text that arrives
  while a tool call is open is held and sent as its own block after it; the usage chunk becomes
  `message_delta` with the stop reason, `[DONE]` becomes `message_stop`;
- stop reasons: `length` -> `max_tokens`; a tool call -> `tool_use`; a matched stop string ->
  `stop_sequence`; otherwise `end_turn`;
- usage: `input_tokens` the prompt tokens not read from cache, `cache_read_input_tokens` the cached
  ones (from the engine's `prompt_tokens_details`).

The chat stream is read by the chat relay's own observer first (usage, the generated output, scrubbed
upstream errors, malformed events end the stream), so the analysis sees a chat turn.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

from ..relay.sse import BadStream, StreamObserver, data_of
from ..core.errors import anthropic_body

CHAT_PATH = "/v1/chat/completions"


def anthropic_usage(usage: Any) -> dict[str, Any]:
    """Chat usage in Anthropic's terms: input tokens are the prompt tokens not read from cache."""
    if not isinstance(usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    out: dict[str, Any] = {"output_tokens": usage.get("completion_tokens") or 0}
    fresh = usage.get("prompt_tokens") or 0
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int):
        fresh -= cached
        out["cache_read_input_tokens"] = cached
    out["input_tokens"] = max(0, fresh)
    return out


def stop_reason(finish: Any, stop: Any, tool_used: bool, tool_complete: bool) -> tuple[str | None, str | None]:
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def _reasoning(d: dict[str, Any]) -> Any:
    return d.get("reasoning") if d.get("reasoning") is not None else d.get("reasoning_content")


def message_of(chat: dict[str, Any], model: str) -> dict[str, Any]:
    """A whole chat completion as an Anthropic Message."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    calls = msg.get("tool_calls") or []
    reason, seq = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), bool(calls), bool(calls))
    content: list[dict[str, Any]] = []
    if _reasoning(msg):
        content.append({"type": "thinking", "thinking": _reasoning(msg), "signature": uuid.uuid4().hex})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in calls:
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": args})
    return {"id": chat.get("id"), "type": "message", "role": "assistant", "content": content or [
        {"type": "text", "text": ""}], "model": model, "stop_reason": reason, "stop_sequence": seq,
        "usage": anthropic_usage(chat.get("usage"))}


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class ChatAsMessages:
    """relay.sse.EventObserver: a chat completion stream, read by the chat observer, relayed as an
    Anthropic Messages stream."""

    __slots__ = ("chat", "model", "started", "ended", "index", "block", "block_index", "signature", "tool_id",
                 "pending", "finish", "stop", "tool_used", "last_args", "ids")

    def __init__(self, chat: StreamObserver, model: str) -> None:
        self.chat = chat
        self.model = model
        self.started = False
        self.ended = False  # an error event was sent: the stream is over for the client
        self.index = 0  # the next block's index
        self.block: str | None = None  # the open block's type
        self.block_index: int | None = None
        self.signature: str | None = None  # a thinking block's, sent as it closes
        self.tool_id: str | None = None
        self.pending: list[str] = []  # text that came while a tool call was open
        self.finish: Any = None
        self.stop: Any = None
        self.tool_used = False
        self.last_args: list[str] = []
        self.ids: dict[int, str] = {}  # tool call index -> its id

    @property
    def done(self) -> bool:
        return self.chat.done or self.ended

    @done.setter
    def done(self, value: bool) -> None:
        self.chat.done = value

    @property
    def error(self) -> dict[str, Any] | None:
        return self.chat.error

    def failure_event(self, message: str, code: str) -> bytes:
        return _event("error", anthropic_body(502, message))

    def relay(self, event: bytes) -> bytes | None:
        piece = self.chat.relay(event)
        if piece is None:
            return None
        payload = data_of(piece)
        if payload is None:
            return piece  # a comment (keep-alive)
        if payload == b"[DONE]":
            return b"".join(self._close()) + _event("message_stop", {"type": "message_stop"})
        chunk = orjson.loads(payload)  # the chat observer let through a JSON object only
        if chunk.get("error") is not None:  # the upstream's error, scrubbed by the chat observer
            err = chunk["error"] if isinstance(chunk["error"], dict) else {}
            self.ended = True
            return _event("error", anthropic_body(502, str(err.get("message") or "upstream error")))
        try:
            return b"".join(self._convert(chunk)) or None
        except (AttributeError, TypeError, ValueError, KeyError):
            raise BadStream("upstream_bad_response", "the upstream sent a chat chunk of an unexpected shape") from None

    # -- the conversion ------------------------------------------------------------------------------

    def _convert(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if not self.started:
            self.started = True
            out.append(_event("message_start", {"type": "message_start", "message": {
                "id": chunk.get("id"), "type": "message", "role": "assistant", "content": [], "model": self.model,
                "stop_reason": None, "stop_sequence": None, "usage": anthropic_usage(chunk.get("usage"))}}))
        choices = chunk.get("choices") or []
        if not choices:
            if isinstance(chunk.get("usage"), dict):  # the usage chunk: the message's end
                out.extend(self._close())
                tool_complete = self.tool_used and _is_json("".join(self.last_args))
                reason, seq = stop_reason(self.finish or "stop", self.stop, self.tool_used, tool_complete)
                out.append(_event("message_delta", {"type": "message_delta", "delta": {
                    "stop_reason": reason, "stop_sequence": seq}, "usage": anthropic_usage(chunk["usage"])}))
            return out
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish, self.stop = choice["finish_reason"], choice.get("stop_reason")
        delta = choice.get("delta") or {}
        thinking = _reasoning(delta)
        if thinking:
            if self.block != "thinking":
                out.extend(self._close())
                out.append(self._start({"type": "thinking", "thinking": ""}))
            out.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
        text = delta.get("content")
        if text:
            if self.block == "tool_use":
                self.pending.append(text)
            else:
                if self.block != "text":
                    out.extend(self._close())
                    out.append(self._start({"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            if call.get("id") is not None:
                self.ids[call.get("index", 0)] = call["id"]
                if self.tool_id != call["id"] and fn.get("name") is not None:
                    out.extend(self._close())
                    self.tool_used = True
                    self.last_args = []
                    out.append(self._start({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}}))
                current = call["id"]
            else:
                current = self.ids.get(call.get("index", 0))
            if fn.get("arguments") and current is not None and self.tool_id == current:
                self.last_args.append(fn["arguments"])
                out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def _start(self, block: dict[str, Any]) -> bytes:
        self.block, self.block_index = block["type"], self.index
        self.signature = uuid.uuid4().hex if block["type"] == "thinking" else None
        self.tool_id = block.get("id") if block["type"] == "tool_use" else None
        return _event("content_block_start", {"type": "content_block_start", "index": self.index,
                                              "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self.block_index,
                                              "delta": delta})

    def _stop_block(self) -> list[bytes]:
        if self.block is None:
            return []
        out = []
        if self.signature is not None:
            out.append(self._delta({"type": "signature_delta", "signature": self.signature}))
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": self.block_index}))
        self.block = self.block_index = self.signature = self.tool_id = None
        self.index += 1
        return out

    def _close(self) -> list[bytes]:
        """Close the open block; text held behind a tool call follows as its own block."""
        held, self.pending = "".join(self.pending), []
        out = self._stop_block()
        if held:
            out.append(self._start({"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": held}))
            out.extend(self._stop_block())
        return out


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
