"""A prefix (KV) cache that behaves like an engine's: chained block hashes in an LRU pool.

vLLM keys each full block of `block_size` tokens by hash(parent block hash, block tokens) and evicts
least-recently-used free blocks, tail blocks of a sequence first. SGLang's radix cache matches per
token (block_size 1). Hashing a long prompt token by token is too slow in Python, so the pool
always hashes pages of at least 16 tokens; when block_size is smaller than a page, each node also keeps
its tokens and the first missing page is matched token by token against the parent's children (what a
radix tree does when it splits an edge), and a sequence's partial last page is stored as its own node.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Callable

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest
_MIN_PAGE = 16


def token_bytes(tokens: list[int]) -> bytes:
    """Token ids as fixed-width bytes: what the block hashes are computed over."""
    return array("I", tokens).tobytes()


def salt_seed(salt: str | None) -> int:
    """Requests with different cache salts (vLLM `cache_salt`) never share blocks."""
    return _xxh3(salt.encode()) if salt else 0


class _Node:
    __slots__ = ("parent", "data", "nblocks")

    def __init__(self, parent: int, data: bytes | None, nblocks: int) -> None:
        self.parent = parent
        self.data = data  # token bytes, kept only when matching finer than a page
        self.nblocks = nblocks


class PrefixCache:
    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.page = block_size if block_size >= _MIN_PAGE else block_size * -(-_MIN_PAGE // block_size)
        self._fine = self.page != block_size
        self.capacity = capacity_blocks
        self._nodes: OrderedDict[int, _Node] = OrderedDict()  # first = least recently used
        self._children: dict[int, dict[int, None]] = {}
        self.used_blocks = 0
        self.evictions = 0  # blocks evicted since the last reset
        # KV-cache events (kvevents.py): given the events of each operation, in order. Only when pages
        # are the engine's blocks; a finer cache has no block-level events to give.
        self.listener: Callable[[list[dict]], None] | None = None
        self._events: list[dict] | None = None

    # -- hashing -----------------------------------------------------------------------------------
    def hashes(self, data: bytes, seed: int = 0, known: list[int] | None = None) -> list[int]:
        """Chained hashes of every full page in `data`; `known` is a hash list of a prefix to extend."""
        step = self.page * 4
        out = list(known) if known else []
        h = out[-1] if out else seed
        mv = memoryview(data)
        for i in range(len(out) * step, len(data) - step + 1, step):
            h = _xxh3(mv[i : i + step], h)
            out.append(h)
        return out

    # -- lookup ------------------------------------------------------------------------------------
    def match(self, data: bytes, hashes: list[int], seed: int = 0) -> int:
        """Longest cached prefix of `data` in tokens, whole blocks only (before the engine's cap)."""
        nodes = self._nodes
        k = 0
        for h in hashes:
            if h not in nodes:
                break
            k += 1
        matched = k * self.page
        if self._fine:
            kids = self._children.get(hashes[k - 1] if k else seed)
            if kids:
                rest = data[matched * 4 : (matched + self.page) * 4]
                best = 0
                for child in kids:
                    best = max(best, _common_tokens(rest, nodes[child].data or b""))
                matched += best
        return matched // self.block_size * self.block_size

    def cached_tokens(self, matched: int, prompt_tokens: int) -> int:
        """vLLM's cap: the last prompt token is always recomputed, so a full hit reports prompt-1, block-aligned."""
        bs = self.block_size
        return max(0, min(matched, prompt_tokens - 1)) // bs * bs

    # -- insert / evict ----------------------------------------------------------------------------
    def insert(self, data: bytes, hashes: list[int], seed: int = 0) -> None:
        """Cache every whole block of `data` (prompt, or prompt + generated). `hashes` = self.hashes(data)."""
        if self.capacity <= 0:
            return
        page, bs = self.page, self.block_size
        ntok = len(data) // 4
        entries: list[tuple[int, int, int, int]] = []  # (hash, parent, start token, length)
        parent = seed
        for i, h in enumerate(hashes):
            entries.append((h, parent, i * page, page))
            parent = h
        tail = (ntok - len(hashes) * page) // bs * bs
        if self._fine and tail:
            start = len(hashes) * page
            th = _xxh3(data[start * 4 : (start + tail) * 4], parent)
            entries.append((th, parent, start, tail))
        nodes = self._nodes
        events = self._begin()
        new_blocks: list[tuple[int, int, int, int]] = []
        # Touch in reverse so the head of the sequence ends most recently used: under pressure the
        # pool loses a conversation's tail first, like vLLM's free-block queue.
        for h, par, start, length in reversed(entries):
            node = nodes.get(h)
            if node is not None:
                nodes.move_to_end(h)
                continue
            chunk = data[start * 4 : (start + length) * 4] if self._fine else None
            if chunk is not None and length < page:
                longer = self._extending_sibling(par, chunk)
                if longer is not None:  # a cached sibling already holds these tokens
                    nodes.move_to_end(longer)
                    continue
            nodes[h] = _Node(par, chunk, length // bs)
            self.used_blocks += length // bs
            if events is not None:
                new_blocks.append((h, par, start, length))
            if self._fine:
                self._add_child(par, h, chunk or b"")
        if events is not None:
            from .kvevents import stored

            for h, par, start, length in reversed(new_blocks):  # parents first, as the engine stores them
                tokens = array("I", data[start * 4:(start + length) * 4]).tolist()
                events.append(stored(h, None if par == seed else par, tokens, bs))
        self._evict()
        self._end()

    def resize(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._begin()
        self._evict()
        self._end()

    def _begin(self) -> list[dict] | None:
        if self.listener is None or self._fine:
            return None
        self._events = []
        return self._events

    def _end(self) -> None:
        events, self._events = self._events, None
        if events and self.listener is not None:
            self.listener(events)

    def clear(self) -> None:
        if self.listener is not None and not self._fine and self._nodes:
            from .kvevents import cleared

            self.listener([cleared()])
        self._nodes.clear()
        self._children.clear()
        self.used_blocks = 0
        self.evictions = 0

    def _extending_sibling(self, parent: int, chunk: bytes) -> int | None:
        for c in self._children.get(parent, ()):
            od = self._nodes[c].data or b""
            if len(od) >= len(chunk) and od.startswith(chunk):
                return c
        return None

    def _add_child(self, parent: int, h: int, chunk: bytes) -> None:
        kids = self._children.setdefault(parent, {})
        # A shorter sibling that this node extends holds nothing new (a radix tree would have grown
        # that edge): drop it so the pool is not charged twice for the same tokens.
        for other in [c for c in kids if c != h]:
            od = self._nodes[other].data or b""
            if len(od) < len(chunk) and chunk.startswith(od):
                self._drop(other)
        self._children.setdefault(parent, {})[h] = None  # _drop may have removed an emptied dict

    def _evict(self) -> None:
        nodes = self._nodes
        while self.used_blocks > self.capacity and nodes:
            h = next(iter(nodes))
            self.evictions += nodes[h].nblocks
            self._drop(h)

    def _drop(self, h: int) -> None:
        node = self._nodes.pop(h)
        if self._events is not None:
            from .kvevents import removed

            self._events.append(removed([h]))
        self.used_blocks -= node.nblocks
        if self._fine:
            kids = self._children.get(node.parent)
            if kids is not None:
                kids.pop(h, None)
                if not kids:
                    del self._children[node.parent]


def _common_tokens(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b)) // 4
    i = 0
    while i < n and a[i * 4 : i * 4 + 4] == b[i * 4 : i * 4 + 4]:
        i += 1
    return i
