"""What a router asks the KV-event indexes: which replica actually holds the longest prefix of a new
conversation's messages, and how much room each replica's pool has.

No render happens before forwarding (it is off the hot path), so a request's messages are tied to
engine blocks through turns already analysed: for each analysed turn, at the sampled message
positions of routing/prefix_index.py (the same chained digests the router computes anyway), the
key of the last whole block inside messages[0..p] and its token count are remembered. A new request
computes its sampled digests, finds those boundaries, and asks each replica's index whether that block
is held *now* (a block held implies its chain up to the start was stored; engines evict tails first).
Bounded: the most recent `max_entries` boundaries per lane.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

from ..routing import prefix_index

MAX_ENTRIES = 200_000


class Boundaries:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.by_lane: dict[str, OrderedDict[int, tuple[int, int]]] = {}  # digest -> (block key, tokens)

    def note(self, lane: str, messages: Sequence[Any], head: int, message_ends: Sequence[int], keys: Sequence[int],
             block: int) -> None:
        """After a turn's analysis: `message_ends[i]` = tokens of the render through message i."""
        table = self.by_lane.setdefault(lane, OrderedDict())
        for p, digest in prefix_index.sampled_chain(list(messages), head):
            if p >= len(message_ends):
                break
            blocks = min(message_ends[p] // block, len(keys))
            if blocks <= 0:
                continue
            table[digest] = (keys[blocks - 1], blocks * block)
            table.move_to_end(digest)
        while len(table) > self.max_entries:
            table.popitem(last=False)

    def held(self, lane: str, messages: Sequence[Any], head: int,
             indexes: dict[str, Any]) -> dict[str, tuple[int, int]]:
        """Per replica URL: (last message position, tokens) of the longest sampled prefix its pool holds."""
        table = self.by_lane.get(lane)
        if not table:
            return {}
        out: dict[str, tuple[int, int]] = {}
        for p, digest in prefix_index.sampled_chain(list(messages), head):
            entry = table.get(digest)
            if entry is None:
                continue
            key, tokens = entry
            for url, index in indexes.items():
                if index.held_now(key):
                    out[url] = (p, tokens)
        return out
