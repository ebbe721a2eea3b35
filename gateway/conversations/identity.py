"""Which conversation a request belongs to.

An explicit key wins (`prompt_cache_key`, `user`, or a configured header). Otherwise lineage:
after each turn the gateway registers two anchors for it, both over messages normalised without
reasoning (clients strip it freely and it does not say which conversation this is):

* the hash chain over the whole message list plus the generated assistant message: a request
  that extends exactly that list is the next turn;
* the generated assistant message alone: a request whose latest assistant message is exactly
  what the gateway relayed is a continuation even if earlier history was edited (compaction,
  a timestamp in the system prompt), which is precisely when drift must be explained.

Two agents that share a system prompt and first instruction diverge at their first different
message and so never share an anchor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

SEP = b"\x1f"


def _text(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _args(value: Any) -> bytes:
    # Arguments are a JSON string that clients may re-serialise; compare what they mean.
    if isinstance(value, str):
        try:
            value = orjson.loads(value) if value.strip() else {}
        except orjson.JSONDecodeError:
            return value.encode("utf-8", "surrogatepass")
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def message_digest(msg: dict[str, Any]) -> int:
    """Identity of a message for lineage: role, content, tool calls, tool-call id (no reasoning)."""
    h = xxhash.xxh64()
    h.update(str(msg.get("role", "")).encode())
    h.update(SEP)
    h.update(_text(msg.get("content")))
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        h.update(SEP + _text(fn.get("name")) + SEP + _args(fn.get("arguments")))
    if msg.get("tool_call_id"):
        h.update(SEP + _text(msg["tool_call_id"]))
    return h.intdigest()


def chain(digests: list[int], seed: int = 0) -> list[int]:
    """Running hash over message digests: chain[i] identifies messages[0..i]."""
    out = []
    acc = seed
    for d in digests:
        acc = xxhash.xxh64_intdigest(acc.to_bytes(8, "little") + d.to_bytes(8, "little"))
        out.append(acc)
    return out


@dataclass(frozen=True)
class Lineage:
    digests: list[int]  # per request message
    chain: list[int]  # running chain over them
    last_assistant: int | None  # index of the latest assistant message, if any

    def anchor_keys(self) -> list[str]:
        """Store keys to look the conversation up by, most specific first."""
        if self.last_assistant is None:
            return []
        j = self.last_assistant
        return [f"anc:{self.chain[j]:016x}", f"gen:{self.digests[j]:016x}"]


def lineage(messages: list[dict[str, Any]]) -> Lineage:
    digests = [message_digest(m) for m in messages]
    last = None
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            last = i
            break
    return Lineage(digests, chain(digests), last)


def explicit_key(body: dict[str, Any], headers: Any, header_name: str) -> tuple[str, str] | None:
    """(key, source) when the client names its conversation itself."""
    value = headers.get(header_name) if header_name else None
    if value:
        return value, "header"
    for name in ("prompt_cache_key", "user"):
        v = body.get(name)
        if isinstance(v, str) and v:
            return v, name
    return None


def key_id(key: str) -> str:
    # Never keep the raw key (it may be a user id): a stable hash is enough to find the state.
    return "k" + xxhash.xxh64_hexdigest(key.encode("utf-8", "surrogatepass"))
