"""A stream chunk recognised from its bytes: the usual token chunk relayed without parsing its JSON.

An engine's token chunks differ from each other only in the text they carry: vLLM and SGLang repeat
the same id, created, model and nulls in every chunk of a stream (../shared/fixtures/upstream/*.sse).
So once the observer has parsed one such chunk, the bytes before and after its text form a shape, and
a later event that starts and ends with the same bytes, with a plain JSON string between them (no
quote, backslash or control character, valid UTF-8), is that chunk with another text: valid JSON, the
same fields, every check the parse made already passed. Anything else (escapes, a finish reason, the
usage, a tool call's first chunk, an error) goes the general way.

A shape is learnt only when a probe proves it: the shape filled with another text parses to the
parsed chunk with only that text changed. So a shape's slot is exactly the text's value, whatever
else the chunk holds (the same words elsewhere, an engine's extra fields).

A chunk recognised costs a fraction of the general way (orjson parse, shape check, delta read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

# What may not appear raw inside a JSON string: the quote that ends it, the backslash that starts an
# escape, control characters. Their absence makes the slot one plain string token.
_NOT_PLAIN = re.compile(rb'["\\\x00-\x1f]')
_PROBE = "zq"
MAX_SHAPES = 4  # content, reasoning, a tool call's arguments, one spare: a stream uses two or three
MAX_TRIES = 16  # chunks parsed without yielding a shape before the stream stops trying (a varying field)

CONTENT, REASONING, ARGUMENTS = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Shape:
    head: bytes  # the event's bytes up to and including the text's opening quote
    tail: bytes  # from the text's closing quote to the event's end
    kind: int  # CONTENT, REASONING or ARGUMENTS
    call: int  # ARGUMENTS: the tool call's index

    def text(self, event: bytes) -> str | None:
        """The text this event carries when it is this shape's chunk, else None."""
        if not (event.startswith(self.head) and event.endswith(self.tail)):
            return None
        end = len(event) - len(self.tail)
        start = len(self.head)
        if end < start:
            return None
        raw = event[start:end]
        if _NOT_PLAIN.search(raw) is not None:
            return None
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return None


def learn(event: bytes, chunk: Any) -> Shape | None:
    """The shape of a simple `data:` event whose parsed chunk carries one text and nothing else of
    note (no finish reason, usage, token ids, role change), else None."""
    found = _slot(chunk)
    if found is None:
        return None
    kind, call, key, text, replace = found
    token = orjson.dumps(text)
    if b"\\" in token:
        return None  # an escaped text: its raw bytes may differ from orjson's; learn from a plainer chunk
    needle = b'"' + key + b'":' + token
    at = event.find(needle)
    if at < 0 or event.find(needle, at + 1) >= 0:
        return None
    start = at + len(needle) - len(token) + 1
    end = at + len(needle) - 1
    shape = Shape(event[:start], event[end:], kind, call)
    try:
        probe = orjson.loads(shape.head[5:] + _PROBE.encode() + shape.tail)
    except orjson.JSONDecodeError:
        return None
    return shape if probe == replace(_PROBE) else None


def _slot(chunk: Any) -> tuple[int, int, bytes, str, Any] | None:
    """Which text a token chunk carries, and a function giving the chunk with another text there."""
    if type(chunk) is not dict or chunk.get("usage") or chunk.get("prompt_token_ids") or chunk.get("error"):
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    choice = choices[0]
    if choice.get("finish_reason") or choice.get("token_ids"):
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or delta.get("role"):
        return None
    texts = [(k, v) for k, v in delta.items() if v]
    if len(texts) != 1:
        return None
    key, value = texts[0]

    def with_delta(new: dict) -> Any:
        return {**chunk, "choices": [{**choice, "delta": new}]}

    if type(value) is str and key in ("content", "reasoning_content", "reasoning"):
        if key == "content" and (delta.get("reasoning_content") or delta.get("reasoning")):
            return None
        kind = CONTENT if key == "content" else REASONING
        return kind, 0, key.encode(), value, lambda t: with_delta({**delta, key: t})
    if key != "tool_calls" or type(value) is not list or len(value) != 1 or type(value[0]) is not dict:
        return None
    call = value[0]
    index, fn = call.get("index"), call.get("function")
    if type(index) is not int or call.get("id") or type(fn) is not dict or fn.get("name"):
        return None
    args = fn.get("arguments")
    if type(args) is not str or not args:
        return None
    return ARGUMENTS, index, b"arguments", args, lambda t: with_delta(
        {**delta, "tool_calls": [{**call, "function": {**fn, "arguments": t}}]})
