"""What the gateway keeps per conversation between turns, compactly.

Per turn: a fingerprint of the render (per-segment digest, token count, text length, message
index), of what the model generated, and of each request message's fields (for naming a drift's
cause). Arrays are stored as packed bytes: about 60 bytes per message, so a 1,600-message,
480K-token conversation costs well under 100 KB.
"""

from __future__ import annotations

import binascii
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..core.verdict import CacheVerdict

ROLE_CODES = {"system": 1, "user": 2, "assistant": 3, "tool": 4, "developer": 5, "function": 6, "prefix": 7}
ROLE_NAMES = {v: k for k, v in ROLE_CODES.items()}


def _pack(values: list[int], code: str) -> str:
    if not values:
        return ""
    return binascii.b2a_base64(array(code, values), newline=False).decode("ascii")


def _unpack(data: str, code: str) -> list[int]:
    if not data:
        return []
    a = array(code)
    a.frombytes(binascii.a2b_base64(data, strict_mode=True))
    return a.tolist()


@dataclass
class SegmentPrints:
    """Per segment of a render: digest of its text, its tokens, its text length, its message."""

    digests: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    messages: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)

    def total_tokens(self) -> int:
        return sum(self.tokens)

    def to_json(self) -> dict[str, str]:
        return {
            "d": _pack(self.digests, "Q"), "t": _pack(self.tokens, "I"), "l": _pack(self.lengths, "I"),
            "m": _pack(self.messages, "i"), "r": _pack(self.roles, "B"),
        }

    @classmethod
    def from_json(cls, data: dict[str, str]) -> "SegmentPrints":
        return cls(_unpack(data["d"], "Q"), _unpack(data["t"], "I"), _unpack(data["l"], "I"),
                   _unpack(data["m"], "i"), _unpack(data["r"], "B"))


@dataclass
class MessagePrints:
    """Per request message: role and 32-bit digests of the fields a cause is named from."""

    roles: list[int] = field(default_factory=list)
    content: list[int] = field(default_factory=list)
    reasoning: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)
    tool_call_ids: list[int] = field(default_factory=list)
    images: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.roles)

    def to_json(self) -> dict[str, str]:
        return {
            "r": _pack(self.roles, "B"), "c": _pack(self.content, "I"), "s": _pack(self.reasoning, "I"),
            "k": _pack(self.tool_calls, "I"), "i": _pack(self.tool_call_ids, "I"), "g": _pack(self.images, "H"),
        }

    @classmethod
    def from_json(cls, data: dict[str, str]) -> "MessagePrints":
        return cls(_unpack(data["r"], "B"), _unpack(data["c"], "I"), _unpack(data["s"], "I"),
                   _unpack(data["k"], "I"), _unpack(data["i"], "I"), _unpack(data["g"], "H"))


@dataclass
class TurnPrint:
    segments: SegmentPrints
    generated: SegmentPrints  # zero or one segment: what the model produced, as the next turn renders it
    messages: MessagePrints
    generated_message: MessagePrints  # the generated assistant message's field digests
    thinking: bool | None
    effort: int | str | None
    tools_digest: int
    response_format_digest: int
    prompt_tokens: int
    exact: bool
    request_chain: int  # chain hash of the request's messages (retry detection)
    # Tokens of prompt + output the engine holds KV for, when fewer than the render says: an output cut
    # at max_tokens never generated the closing tokens the next render adds, and its last token was
    # never fed back (prompt + completion_tokens - 1). None: the whole render minus its final token.
    kv_tokens: int | None = None
    # What the template dropped in this render (Rendered.dropped): assistants below [0] lost their
    # reasoning, developer messages below [1] were deleted; (0, 0): nothing.
    dropped: tuple[int, int] = (0, 0)
    # Where the engine's generated ids part from the output's render (it said them: vLLM
    # return_token_ids); None: they agree, or unknown.
    retokenized_at: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "s": self.segments.to_json(), "g": self.generated.to_json(), "m": self.messages.to_json(),
            "gm": self.generated_message.to_json(), "th": self.thinking, "ef": self.effort,
            "td": self.tools_digest, "rd": self.response_format_digest, "pt": self.prompt_tokens,
            "ex": self.exact, "rc": self.request_chain, "kv": self.kv_tokens, "dp": list(self.dropped),
            "rt": self.retokenized_at,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TurnPrint":
        return cls(SegmentPrints.from_json(d["s"]), SegmentPrints.from_json(d["g"]), MessagePrints.from_json(d["m"]),
                   MessagePrints.from_json(d["gm"]), d["th"], d["ef"], d["td"], d["rd"], d["pt"], d["ex"], d["rc"],
                   d.get("kv"), tuple(d.get("dp") or (0, 0)), d.get("rt"))


@dataclass
class ConversationState:
    id: str
    source: str
    lane: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    turn: int = 0
    pinned_effort: int | str | None = None
    pinned_thinking: bool | None = None
    parent: str | None = None
    replica: str | None = None  # where the last turn ran (its KV cache lives there)
    last: TurnPrint | None = None
    last_cache: CacheVerdict | None = None  # the last turn's cache verdict, for admins
    n_messages: int = 0  # messages in the latest turn's request (from the head)

    def to_bytes(self) -> bytes:
        # A copy of exactly its length: orjson's bytes keep the buffer they were written into (at least
        # a page, often many times the state), and the analysis memo (memo.py) keeps this for its turn.
        return bytes(memoryview(orjson.dumps({
            "id": self.id, "src": self.source, "lane": self.lane, "c": self.created, "u": self.updated,
            "t": self.turn, "pe": self.pinned_effort, "pth": self.pinned_thinking, "p": self.parent,
            "rep": self.replica, "last": self.last.to_json() if self.last else None,
            "lc": self.last_cache.to_json() if self.last_cache is not None else None,
        })))

    @staticmethod
    def with_last_cache(data: bytes, cache: CacheVerdict) -> bytes:
        """`data` (to_bytes' output) with another last verdict, without decoding the rest: "lc" is its
        last key, and `,"lc":` cannot occur inside a JSON string (its quotes are escaped there)."""
        at = data.rindex(b',"lc":')
        return data[:at] + b',"lc":' + orjson.dumps(cache.to_json()) + b"}"

    @classmethod
    def from_bytes(cls, data: bytes) -> "ConversationState":
        d = orjson.loads(data)
        return cls(d["id"], d["src"], d.get("lane"), d["c"], d["u"], d["t"], d.get("pe"), d.get("pth"), d.get("p"),
                   d.get("rep"), TurnPrint.from_json(d["last"]) if d.get("last") else None,
                   CacheVerdict.from_json(d["lc"]) if isinstance(d.get("lc"), dict) and d["lc"] else None)


@dataclass
class Head:
    """The few facts the next turn needs at once: written when a response ends, before analysis."""

    turn: int
    pinned_effort: int | str | None
    pinned_thinking: bool | None
    replica: str | None
    n_messages: int
    source: str
    lane: str | None
    created: float

    def to_bytes(self) -> bytes:
        return orjson.dumps([self.turn, self.pinned_effort, self.pinned_thinking, self.replica, self.n_messages,
                             self.source, self.lane, self.created])

    @classmethod
    def from_bytes(cls, data: bytes) -> "Head":
        return cls(*orjson.loads(data))

    def apply(self, state: ConversationState) -> None:
        state.turn = self.turn
        state.pinned_effort, state.pinned_thinking = self.pinned_effort, self.pinned_thinking
        state.replica = self.replica
        state.n_messages = self.n_messages

    def as_state(self, cid: str) -> ConversationState:
        state = ConversationState(cid, self.source, self.lane, self.created)
        self.apply(state)
        return state
