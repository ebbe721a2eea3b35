"""The relay's observer (relay.sse.EventObserver) for Anthropic Messages streams.

Events pass byte for byte, but for two documented rewrites: an upstream `error` event's message is
scrubbed, and an event whose data is not a JSON object with a `type` is not relayed: the stream ends
with an Anthropic `error` event instead. What the events say (usage, text, tool calls, the stop
reason) is read into the exchange as a chat stream's is.
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

from ..core.exchange import Exchange
from ..relay.scrub import Scrubber
from ..relay.sse import data_of, typed_event
from ..core.errors import anthropic_body
from .messages_chat import chat_usage, take_message


class MessagesObserver:
    __slots__ = ("ex", "done", "error", "scrubber", "_usage", "_blocks")

    def __init__(self, ex: Exchange, scrubber: Scrubber | None = None) -> None:
        self.ex = ex
        self.done = False
        self.error: dict[str, Any] | None = None
        self.scrubber = scrubber or Scrubber()
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}  # index -> the content block as it builds up

    def failure_event(self, message: str, code: str) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(anthropic_body(502, message)) + b"\n\n"

    def relay(self, event: bytes) -> bytes | None:
        payload = data_of(event)
        if payload is None:
            return b":\n\n" if event.strip() else None
        if not payload:
            return None
        obj = typed_event(payload)
        if obj["type"] == "error":
            self.done = True
            err = e if isinstance(e := obj.get("error"), dict) else {}
            err["message"] = self.scrubber.text(str(err.get("message") or ""))
            obj["error"] = err
            self.error = {"message": err["message"], "code": self.scrubber.code(err.get("type"))}
            return b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"
        self._observe(obj)
        return event

    def _observe(self, obj: dict[str, Any]) -> None:
        kind = obj["type"]
        ex = self.ex
        if kind == "message_start":
            message = m if isinstance(m := obj.get("message"), dict) else {}
            if isinstance(message.get("usage"), dict):
                self._usage.update(message["usage"])
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict) and isinstance(obj.get("index"), int):
                self._blocks[obj["index"]] = dict(block, partial="")
        elif kind == "content_block_delta":
            delta = d if isinstance(d := obj.get("delta"), dict) else {}
            now = time.perf_counter()
            if ex.t_first_token is None:
                ex.t_first_token = now
            ex.t_last_token = now
            ex.token_chunk_times.append(now)
            block = self._blocks.get(i) if isinstance(i := obj.get("index"), int) else None
            if delta.get("type") == "text_delta" and block is not None:
                block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
            elif delta.get("type") == "thinking_delta" and block is not None:
                block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
            elif delta.get("type") == "input_json_delta" and block is not None:
                block["partial"] += str(delta.get("partial_json") or "")
        elif kind == "message_delta":
            if isinstance(obj.get("usage"), dict):
                self._usage.update({k: v for k, v in obj["usage"].items() if v is not None})
            delta = d if isinstance(d := obj.get("delta"), dict) else {}
            if isinstance(delta.get("stop_reason"), str):
                ex.generated.finish_reason = delta["stop_reason"]
        elif kind == "message_stop":
            self.done = True
            blocks = []
            for _, block in sorted(self._blocks.items()):
                partial = block.pop("partial", "")
                if block.get("type") == "tool_use" and partial:
                    try:
                        block["input"] = json.loads(partial)
                    except ValueError:
                        block["input"] = {}
                blocks.append(block)
            reason = ex.generated.finish_reason
            take_message(ex.generated, {"content": blocks})
            ex.generated.finish_reason = reason
            usage = chat_usage(self._usage)
            if usage:
                ex.usage = usage
