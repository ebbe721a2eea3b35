"""What a heal kind is, and the relayed message every message kind compares the client's version with.

A message kind looks at one assistant message of the request and the message the gateway relayed for
it (found by `heal_digest`, which ignores exactly what the kinds may repair) and returns the field
updates that put the relayed bytes back, or None. It must return updates only when the client's
version means the same as the relayed one; `plan` is a pure function of the two messages, so the
policy can remember its answer for as long as the client's bytes do not change.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import xxhash

from ..conversations.identity import SEP, message_digest

POP = object()  # an update value: remove the field
REASONING_FIELDS = ("reasoning_content", "reasoning")
# The name every lane's template reads: SGLang hands messages to the template as they are (and the
# DeepSeek-V4.1 template reads `reasoning_content`); vLLM copies it to `reasoning` and gives both.
TEMPLATE_FIELD = "reasoning_content"
KINDS = ("arguments", "reasoning", "content", "tool_result_order", "reasoning_field")

Updates = dict[str, Any]


@dataclass(frozen=True)
class Relayed:
    """An assistant message exactly as the gateway relayed it to the client."""

    content: str
    reasoning: str
    calls: tuple[tuple[str | None, str, str], ...]  # (id, name, arguments string as relayed)

    def to_bytes(self) -> bytes:
        return orjson.dumps({"c": self.content, "r": self.reasoning, "k": [list(c) for c in self.calls]})

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Relayed":
        d = orjson.loads(raw)
        return cls(d["c"], d["r"], tuple((c[0], c[1], c[2]) for c in d["k"]))

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> "Relayed":
        calls = tuple((c.get("id"), c["function"]["name"], c["function"]["arguments"])
                      for c in msg.get("tool_calls") or ())
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
        return cls(msg.get("content") or "", reasoning, calls)

    def size(self) -> int:
        return len(self.content) + len(self.reasoning) + sum(len(a) + len(n) + 24 for _, n, a in self.calls) + 64


class MessageKind(Protocol):
    """One kind of repair of an assistant message."""

    name: str

    def plan(self, msg: dict[str, Any], relayed: Relayed) -> Updates | None: ...


_U_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{4}(?:\\u[0-9a-fA-F]{4})?")


def _unescape(m: re.Match[str]) -> str:
    units = m.group(0).split("\\u")[1:]
    data = b"".join(int(u, 16).to_bytes(2, "big") for u in units)
    try:
        return data.decode("utf-16-be")
    except UnicodeDecodeError:  # a lone surrogate: leave the text as it was
        return m.group(0)


def norm_text(text: str) -> str:
    """The content normalisation: literal \\uXXXX escapes decoded, Unicode NFC, whitespace at the ends
    trimmed. Text equal under it reads the same to a person; the relayed bytes are what the model wrote."""
    if "\\u" in text:
        text = _U_ESCAPE.sub(_unescape, text)
    return unicodedata.normalize("NFC", text).strip()


def canonical_args(value: Any) -> bytes | None:
    """A JSON value's meaning as bytes (sorted keys, no whitespace); None when not JSON.
    Types stay distinct: 1, 1.0 and true are three values (the template renders them differently)."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def heal_digest(msg: dict[str, Any]) -> int:
    """The lineage digest (no reasoning, arguments by meaning) with the content normalised too: a
    client's trimmed, re-encoded, re-serialised or reasoning-stripped version finds what was relayed."""
    content = msg.get("content")
    if isinstance(content, str):
        norm = norm_text(content)
        if norm != content:
            msg = {**msg, "content": norm}
        fast = _plain_digest(msg, norm)
        if fast is not None:
            return fast
    return message_digest(msg)


def _plain_digest(msg: dict[str, Any], content: str) -> int | None:
    """`message_digest` of a plain assistant message (string content, calls with a name and JSON
    arguments), the same bytes hashed without its general normalisation, which costs several times as
    much (the heal step plans every message new to a conversation). None for anything else."""
    if msg.get("role") != "assistant" or "tool_call_id" in msg:
        return None
    h = xxhash.xxh64()
    h.update(b"assistant" + SEP + content.encode("utf-8", "surrogatepass"))
    calls = msg.get("tool_calls")
    if calls is None:
        return h.intdigest()
    if not isinstance(calls, list):
        return None
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not isinstance(args, str):
            return None
        try:  # what message_digest hashes: the arguments' value, keys sorted (any other value: its way)
            value = orjson.loads(args)
            meaning = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except (orjson.JSONDecodeError, TypeError):
            return None
        if not isinstance(value, dict):
            return None
        h.update(SEP + name.encode("utf-8", "surrogatepass") + SEP + meaning)
    return h.intdigest()


def client_reasoning(msg: dict[str, Any]) -> tuple[str | None, str]:
    """(field, text) of the message's reasoning; (None, "") when it has none."""
    for name in REASONING_FIELDS:
        value = msg.get(name)
        if isinstance(value, str) and value:
            return name, value
    return None, ""
