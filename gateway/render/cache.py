"""SegmentCache: what earlier turns already produced, under one global byte budget.

Two kinds of entries share one LRU:

* rendered items: (template, item role, member message digests, render context) -> the item's text,
  its field spans and the text's xxhash64 digest;
* token ids: (tokenizer, text digest, text length) -> array('I') of ids.

An append-only turn finds every earlier item and its ids here, so it only renders and tokenizes its
new messages. Losing an entry (eviction, a fresh process) costs time, never correctness: every value
is a pure function of its key.
"""

from __future__ import annotations

import sys
import threading
import weakref
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_BUDGET_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RenderedItem:
    text: str
    fields: tuple[tuple[str, int, int], ...]
    digest: int
    starts_special: bool = False  # text starts with a special token (a safe tokenization boundary)
    ends_special: bool = False

    def nbytes(self) -> int:
        return sys.getsizeof(self.text) + 72 + 80 * len(self.fields)


class ItemEntry:
    """A cached rendered item, plus (once tokenized) its token ids and the last Segment built from it."""

    __slots__ = ("item", "ids", "seg")

    def __init__(self, item: RenderedItem) -> None:
        self.item = item
        self.ids: Any = None
        self.seg: Any = None


@dataclass
class CacheStats:
    render_hits: int = 0
    render_misses: int = 0
    token_hits: int = 0
    token_misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0
    budget_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class SegmentCache:
    """Thread-safe LRU of rendered items and token ids, bounded by `budget_bytes`."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = int(budget_bytes)
        self._lock = threading.Lock()
        self._data: OrderedDict[Any, list] = OrderedDict()  # key -> [value, size]
        self._bytes = 0
        self.render_hits = 0
        self.render_misses = 0
        self.token_hits = 0
        self.token_misses = 0
        self.evictions = 0
        # Token ids still in use (by a cached item, a conversation's last render) stay findable by
        # their text after their own entry is evicted: an earlier turn's segment is what a drift
        # comparison asks for, and a miss there would cost the comparison its token precision.
        self._live_ids: weakref.WeakValueDictionary[Any, array] = weakref.WeakValueDictionary()

    # -- generic -------------------------------------------------------------------------------
    def _get(self, key: Any) -> Any:
        entry = self._data.get(key)
        if entry is None:
            return None
        self._data.move_to_end(key)
        return entry[0]

    def _put(self, key: Any, value: Any, size: int) -> None:
        if size > self.budget_bytes:
            return
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        self._data[key] = [value, size]
        self._bytes += size
        self._evict()

    def _evict(self) -> None:
        while self._bytes > self.budget_bytes and self._data:
            _, (_, s) = self._data.popitem(last=False)
            self._bytes -= s
            self.evictions += 1

    # -- rendered items ------------------------------------------------------------------------
    def _get_many(self, tag: str, keys: list[Any]) -> tuple[list[Any], int]:
        data = self._data
        get = data.get
        mte = data.move_to_end
        out: list[Any] = []
        hits = 0
        for k in keys:
            kk = (tag, k)
            e = get(kk)
            if e is None:
                out.append(None)
            else:
                mte(kk)
                out.append(e[0])
                hits += 1
        return out, hits

    def get_items(self, keys: list[Any]) -> list[ItemEntry | None]:
        with self._lock:
            out, hits = self._get_many("r", keys)
            self.render_hits += hits
            self.render_misses += len(out) - hits
            return out

    def peek_item(self, key: Any) -> ItemEntry | None:
        """The cached item under `key`, if any, leaving the LRU and the counters as they are (a look
        for a sibling render to derive from: renderer.py `_reheader`)."""
        slot = self._data.get(("r", key))
        return slot[0] if slot is not None else None

    def touch_items(self, keys: list[Any]) -> bool:
        """What get_items does to the LRU and the counters when every key is cached, for items the
        caller already holds; False when one is not (the caller then looks them all up, which leaves
        the LRU as a lookup alone would)."""
        with self._lock:
            mte = self._data.move_to_end
            try:
                for k in keys:
                    mte(("r", k))
            except KeyError:
                return False
            self.render_hits += len(keys)
            return True

    def put_items(self, pairs: list[tuple[Any, ItemEntry]]) -> None:
        with self._lock:
            for k, v in pairs:
                self._put(("r", k), v, v.item.nbytes() + 200)

    def attach_tokens(self, pairs: list[tuple[Any, ItemEntry, Any]]) -> None:
        """Give cached items their token ids (counted in the budget while the item stays cached)."""
        with self._lock:
            for k, entry, ids in pairs:
                entry.ids = ids
                slot = self._data.get(("r", k))
                if slot is not None and slot[0] is entry:
                    add = 4 * len(ids) + 64
                    slot[1] += add
                    self._bytes += add
            self._evict()

    # -- token ids -----------------------------------------------------------------------------
    def get_tokens(self, keys: list[Any]) -> list[Any]:
        with self._lock:
            out, hits = self._get_many("t", keys)
            if hits < len(out):
                live = self._live_ids.get
                for i, k in enumerate(keys):
                    if out[i] is None and (ids := live(k)) is not None:
                        out[i] = ids
                        hits += 1
            self.token_hits += hits
            self.token_misses += len(out) - hits
            return out

    def put_tokens(self, pairs: list[tuple[Any, Any]]) -> None:
        with self._lock:
            for k, ids in pairs:
                self._put(("t", k), ids, 4 * len(ids) + 64 + 120)
                if type(ids) is array:
                    self._live_ids[k] = ids

    def keep_findable(self, path: Any, segments: list[Any], start: int = 0) -> None:
        """A render's segment ids (from `start` on), findable by their text while the render holds them,
        whether or not their own entries stay cached."""
        with self._lock:
            live = self._live_ids
            for seg in segments[start:]:
                ids = seg.token_ids
                if type(ids) is array:
                    key = (path, seg.digest, len(seg.text))
                    if live.get(key) is None:
                        live[key] = ids

    # -- housekeeping --------------------------------------------------------------------------
    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._live_ids.clear()
            self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.render_hits, self.render_misses, self.token_hits, self.token_misses,
                              self.evictions, self._bytes, len(self._data), self.budget_bytes)

    def reset_counters(self) -> None:
        with self._lock:
            self.render_hits = self.render_misses = self.token_hits = self.token_misses = 0
            self.evictions = 0


_default: SegmentCache | None = None
_default_lock = threading.Lock()


# Settings.render_cache_bytes (GATEWAY_RENDER_CACHE_BYTES), set as the process starts
# (process_switches.py), before the first default_cache().
BUDGET_BYTES = DEFAULT_BUDGET_BYTES


def default_cache() -> SegmentCache:
    """The process-wide cache, of BUDGET_BYTES."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = SegmentCache(BUDGET_BYTES)
    return _default
