"""Which replicas hold which conversation prefixes, shared by every gateway process through the store.

After a replica serves a request, the gateway notes that the replica holds the request's prefix at a
few sampled message positions (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, ... up to the last message). A
position's key chains the digests of the sampled messages up to it with a seed made of what the
engine renders ahead of the messages (lane, thinking, effort, tool schemas), so two requests share
a key only when their renders agree at every sampled message up to there.

Sampling keeps the cost O(log n) messages per request whatever the conversation's length (hashing
every message of a long agent history would cost milliseconds per request). The price
is that two histories equal at every sampled message but different in between would look alike;
the consequence is a routing hint that misses, which costs what no hint costs: one cold prefill.

A new conversation asks for every (position, replica) key in one store round trip and takes the
replica with the longest known prefix, measured by the share of the request's message characters it
covers. Entries expire (the engine's pool forgets too); any write refreshes them.
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson
import xxhash

from ..conversations.identity import text_bytes

KEY_PREFIX = "route:px:"
TTL_S = 3600.0


def _positions(limit: int = 1 << 20) -> tuple[int, ...]:
    out = {0, 1, 2, 3}
    k = 4
    while k < limit:
        out.add(k)
        out.add(k + k // 2)
        k *= 2
    return tuple(sorted(p for p in out if p < limit))


POSITIONS = _positions()


def positions(n_messages: int) -> list[int]:
    """Sampled positions of a request with `n_messages` messages, ascending; always ends at the last one."""
    if n_messages <= 0:
        return []
    out = [p for p in POSITIONS if p < n_messages - 1]
    out.append(n_messages - 1)
    return out


def seed(lane: str, tenant: str, thinking: Any, effort: Any, tools: Any) -> int:
    """What the engine renders before the first message; the lane, so lanes never share keys; and the
    tenant, so that where a request is sent, and what its response says about it, comes only from its
    own tenant's requests (another tenant's prompts must not be detectable through routing)."""
    head = orjson.dumps([lane, tenant, thinking, effort, tools], option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh64_intdigest(head)


def message_digest(msg: Any) -> int:
    """Raw digest of what a message renders from (role, content, reasoning, tool calls, tool-call id)."""
    if not isinstance(msg, dict):
        return xxhash.xxh64_intdigest(text_bytes(msg))
    h = xxhash.xxh64()
    h.update(str(msg.get("role", "")).encode())
    h.update(b"\x1f")
    h.update(text_bytes(msg.get("content")))
    h.update(b"\x1f")
    h.update(text_bytes(msg.get("reasoning_content") or msg.get("reasoning")))
    if msg.get("tool_calls"):
        h.update(b"\x1f")
        h.update(text_bytes(msg.get("tool_calls")))
    if msg.get("tool_call_id"):
        h.update(b"\x1f")
        h.update(text_bytes(msg.get("tool_call_id")))
    return h.intdigest()


def sampled_chain(messages: list[Any], head: int) -> list[tuple[int, int]]:
    """(position, chained digest) at each sampled position of `messages`."""
    out = []
    acc = head
    for p in positions(len(messages)):
        acc = xxhash.xxh64_intdigest(acc.to_bytes(8, "little") + message_digest(messages[p]).to_bytes(8, "little"))
        out.append((p, acc))
    return out


def replica_tag(url: str) -> str:
    return xxhash.xxh32_hexdigest(url.encode())


def key(digest: int, url: str) -> str:
    return f"{KEY_PREFIX}{digest:016x}:{replica_tag(url)}"


def message_chars(msg: Any) -> int:
    """A cheap size of a message (characters of its content, reasoning and tool-call arguments)."""
    if not isinstance(msg, dict):
        return 0
    n = 0
    content = msg.get("content")
    if isinstance(content, str):
        n += len(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                n += len(text) if isinstance(text, str) else 256  # an image or other part: a rough weight
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if isinstance(reasoning, str):
        n += len(reasoning)
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            n += len(args) if isinstance(args, str) else 16
            n += len(str(fn.get("name") or ""))
    return n + 8  # the role header


def share(messages: list[Any], upto: int) -> float:
    """Share of the request's characters in messages[0..upto]."""
    sizes = [message_chars(m) for m in messages]
    total = sum(sizes)
    return sum(sizes[: upto + 1]) / total if total else 1.0


class Lookup:
    """The keys to ask for one request, and what the answers mean."""

    def __init__(self, messages: list[Any], head: int, urls: Iterable[str]) -> None:
        self.messages = messages
        self.urls = list(urls)
        self.chain = sampled_chain(messages, head)
        self.keys = [key(d, u) for _, d in self.chain for u in self.urls]

    def best(self, values: list[bytes | None]) -> dict[str, tuple[float, int]]:
        """Per replica URL: (share of the request's characters, characters) of the longest prefix it holds."""
        n = len(self.urls)
        longest: dict[str, int] = {}
        for i, (p, _) in enumerate(self.chain):
            for j, url in enumerate(self.urls):
                if values[i * n + j] is not None:
                    longest[url] = p
        if not longest:
            return {}
        sizes = [message_chars(m) for m in self.messages]
        total = sum(sizes) or 1
        cumulative = []
        acc = 0
        for s in sizes:
            acc += s
            cumulative.append(acc)
        return {url: (cumulative[p] / total, cumulative[p]) for url, p in longest.items()}


_SAMPLED = frozenset(POSITIONS)


def entries(messages: list[Any], head: int, url: str, since: int = 0) -> list[str]:
    """Keys to write once `url` served `messages`: the sampled positions from `since` on (earlier ones
    are known). The request's own last position is looked up, never written unless it is a sampled
    one: a later request extending this one shares only the sampled positions with it."""
    return [key(d, url) for p, d in sampled_chain(messages, head) if p >= since and p in _SAMPLED]
