"""In-process state: an LRU with a TTL per key and a bounded number of keys."""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict


class MemoryStore:
    name = "memory"

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._indexes: dict[str, dict[str, float]] = {}
        self.evictions = 0

    def _live(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires < time.monotonic():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return value

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        return [self._live(k) for k in keys]

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        self._data[key] = (time.monotonic() + ttl_s, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_keys:
            self._data.popitem(last=False)
            self.evictions += 1

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)

    async def index_add(self, index: str, member: str, score: float, cap: int) -> None:
        idx = self._indexes.setdefault(index, {})
        idx[member] = score
        if len(idx) > cap * 1.2:  # trim in batches, not on every add
            for m, _ in heapq.nsmallest(len(idx) - cap, idx.items(), key=lambda kv: kv[1]):
                del idx[m]

    async def index_newest(self, index: str, limit: int) -> list[str]:
        idx = self._indexes.get(index, {})
        return [m for m, _ in heapq.nlargest(limit, idx.items(), key=lambda kv: kv[1])]

    async def close(self) -> None:
        pass

    def size_bytes(self) -> int:
        return sum(len(k) + len(v) for k, (_, v) in self._data.items())
