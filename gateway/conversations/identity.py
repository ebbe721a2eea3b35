"""Which conversation a request belongs to.

An explicit key wins (`prompt_cache_key`, `user`, or a configured header). Otherwise lineage:
after each turn the gateway registers what the model generated (normalised without reasoning,
which clients strip freely) as an anchor of that conversation, once at its position in the message
list and once alone. A request whose latest assistant message is exactly what the gateway relayed
for a conversation continues it; the anchor at its position is preferred, and the bare output still
finds the conversation when earlier history was edited (compaction, a timestamp in the system
prompt), which is precisely when drift must be explained. Model outputs are close to unique, so two
agents that share a system prompt and first instruction part at their first turn; if a model says
exactly the same thing to both, they are the same conversation until they differ, and the second
continuation becomes a fork with a common ancestor. Finding the anchor costs O(1) on the hot path,
however long the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from ..render.normalize import args_meaning, canonical

SEP = b"\x1f"
DEFAULT_TENANT = "default"  # requests of a gateway without client keys


def text_bytes(value: Any) -> bytes:
    """Canonical bytes of a message field: strings as UTF-8, anything else as sorted JSON."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def message_digest(msg: dict[str, Any], engine: str = "sglang") -> int:
    """Identity of a message for lineage: role, content, tool calls, tool-call id (no reasoning), read
    the way the lane's engine reads it (render/normalize.py). Content compares as it renders (a string
    or the same text as one part); tool-call arguments compare by meaning (clients re-serialise them):
    lineage must still find the conversation when they do, so that the drift they cause is explained."""
    c = canonical(msg, engine)
    h = xxhash.xxh64()
    h.update(c.role.encode())
    h.update(SEP)
    h.update(c.content.encode("utf-8", "surrogatepass"))
    for _, name, args in c.tool_calls:
        h.update(SEP + name.encode("utf-8", "surrogatepass") + SEP + args_meaning(args))
    if c.tool_call_id:
        h.update(SEP + c.tool_call_id.encode("utf-8", "surrogatepass"))
    if c.role == "assistant" and not c.content and not c.tool_calls and c.reasoning:
        # An answer that is reasoning only: without it every such answer would look alike, and two
        # conversations would join at the same position.
        h.update(SEP + b"reasoning" + SEP + c.reasoning.encode("utf-8", "surrogatepass"))
    return h.intdigest()


@dataclass(frozen=True)
class Lineage:
    """The O(1) identity of a request: its latest assistant message (what the gateway relayed)."""

    last_assistant: int | None  # index of the latest assistant message, if any
    digest: int  # normalised digest of that message
    position: int  # how many messages precede it

    def anchor_keys(self, tenant: str = DEFAULT_TENANT) -> list[str]:
        """Store keys to look the conversation up by, most specific first, within the tenant."""
        if self.last_assistant is None:
            return []
        return anchor_keys(self.digest, self.position, tenant)


def anchor_keys(digest: int, position: int, tenant: str = DEFAULT_TENANT) -> list[str]:
    """The anchors of an output: at its position and alone. A tenant's anchors live apart from
    every other tenant's, so two tenants whose models said the same thing never join."""
    scope = "" if tenant == DEFAULT_TENANT else f"{tenant}:"
    return [f"anc:{scope}{anchor(digest, position):016x}", f"gen:{scope}{digest:016x}"]


def anchor(digest: int, position: int) -> int:
    """The output `digest` at message `position`: a turn of one conversation, even among agents
    whose model said the same thing at another point."""
    return xxhash.xxh64_intdigest(digest.to_bytes(8, "little") + position.to_bytes(4, "little"))


def lineage(messages: list[dict[str, Any]], engine: str = "sglang") -> Lineage:
    # Scan back from the end: an agent's latest assistant message is a few messages away, so the
    # hot path costs the same for a 2-message chat and a 1,600-message agent session.
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "assistant":
            return Lineage(i, message_digest(m, engine), i)
    return Lineage(None, 0, 0)


REJOIN_LOOKBACK = 8  # earlier assistant messages looked up when the latest one is not known


def earlier_lineages(messages: list[dict[str, Any]], engine: str = "sglang",
                     limit: int = REJOIN_LOOKBACK) -> list[Lineage]:
    """The assistant messages before the latest one, newest first: when the client edited or dropped
    the answer the gateway relayed last (a retried turn), an earlier one it relayed still names the
    conversation. Only assistant outputs count, never a system prompt or a first instruction, so two
    sessions that share only those never join."""
    out: list[Lineage] = []
    seen_latest = False
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if not (isinstance(m, dict) and m.get("role") == "assistant"):
            continue
        if not seen_latest:
            seen_latest = True
            continue
        out.append(Lineage(i, message_digest(m, engine), i))
        if len(out) >= limit:
            break
    return out


def request_tail(messages: list[dict[str, Any]], engine: str = "sglang") -> int:
    """Identity of a whole request for retry detection: its length and its last message (O(1))."""
    last = message_digest(messages[-1], engine) if messages else 0
    return xxhash.xxh64_intdigest(last.to_bytes(8, "little") + len(messages).to_bytes(4, "little"))


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


def key_id(key: str, tenant: str = DEFAULT_TENANT) -> str:
    """The conversation id of a client's own key, within its tenant: two tenants sending the same
    `user` never share a conversation. Never keeps the raw key (it may be a user id)."""
    raw = key.encode("utf-8", "surrogatepass")
    if tenant != DEFAULT_TENANT:
        raw = tenant.encode() + SEP + raw
    return "k" + xxhash.xxh64_hexdigest(raw)
