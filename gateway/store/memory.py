"""In-process state: an LRU with a TTL per key, bounded in keys and in bytes."""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict

# Conversation states are up to ~100 KB each: a key count alone would not bound the memory.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # Settings.state_max_bytes (GATEWAY_STATE_MAX_BYTES)
_KEY_OVERHEAD = 120  # what a small entry costs beyond its key and value (tuple, dict slot, floats)


class MemoryStore:
    name = "memory"
    waits = False

    def __init__(self, max_keys: int = 100_000, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.bytes = 0
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
            self.bytes -= _size(key, value)
            return None
        self._data.move_to_end(key)
        return value

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        return [self._live(k) for k in keys]

    async def mget_shared(self, keys: list[str]) -> list[bytes | None] | None:
        return await self.mget(keys)  # one copy: this one

    async def mget_fallback(self, keys: list[str]) -> list[bytes | None]:
        return await self.mget(keys)

    async def get_fallback(self, key: str) -> bytes | None:
        return None  # no copy beside this one

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        # A copy of exactly its length: orjson (3.13) hands back bytes whose buffer keeps the capacity it
        # wrote into, at least a page, so without it the byte bound below would count a small part of
        # what is held, and every new conversation would grow the heap by that capacity (the figures:
        # docs/cli.md, memory bounds). The copy is cheap for a small value.
        value = bytes(memoryview(value))
        old = self._data.get(key)
        if old is not None:
            self.bytes -= _size(key, old[1])
        self._data[key] = (time.monotonic() + ttl_s, value)
        self._data.move_to_end(key)
        self.bytes += _size(key, value)
        while len(self._data) > self.max_keys or (self.bytes > self.max_bytes and len(self._data) > 1):
            k, (_, v) = self._data.popitem(last=False)
            self.bytes -= _size(k, v)
            self.evictions += 1

    async def set_many(self, items: list[tuple[str, bytes]], ttl_s: float) -> None:
        for key, value in items:
            await self.set(key, value, ttl_s)

    async def delete(self, key: str) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= _size(key, old[1])

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
        return self.bytes


def _size(key: str, value: bytes) -> int:
    return len(key) + len(value) + _KEY_OVERHEAD
