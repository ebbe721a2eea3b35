"""The in-process store holds what its byte bound counts: values are kept at their own length."""

from __future__ import annotations

import asyncio
import tracemalloc

import orjson

from gateway.conversations.state import Head
from gateway.store.memory import MemoryStore


def _heads(n: int) -> list[bytes]:
    return [Head(i, 50, True, "http://127.0.0.1:18000", 1, "new", "mock", 1.5).to_bytes() for i in range(n)]


def test_held_memory_is_what_the_bound_counts() -> None:
    # orjson's bytes keep the buffer they were written into (>= 4 KB for a 57-byte head): stored as
    # they came, 2,000 heads held ~8 MB against the ~0.4 MB the store counted.
    store = MemoryStore()

    async def fill() -> None:
        for i, value in enumerate(_heads(2000)):
            await store.set(f"head:c{i:016x}", value, 60)

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(fill())
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 * store.size_bytes(), (held, store.size_bytes())


def test_a_large_value_is_held_at_its_length() -> None:
    store = MemoryStore()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        value = orjson.dumps("x" * 100_000)  # its buffer: ~1 MB
        asyncio.run(store.set("conv:c1", value, 60))
        del value
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 * store.size_bytes(), (held, store.size_bytes())
    assert asyncio.run(store.get("conv:c1")) == orjson.dumps("x" * 100_000)


def test_the_byte_bound_evicts_the_oldest() -> None:
    store = MemoryStore(max_bytes=10_000)
    for i in range(100):
        asyncio.run(store.set(f"k{i}", b"v" * 500, 60))
    assert store.size_bytes() <= 10_000
    assert asyncio.run(store.get("k99")) == b"v" * 500
    assert asyncio.run(store.get("k0")) is None
    assert store.evictions > 0


def test_a_conversation_state_is_held_at_its_length() -> None:
    # The analysis memo keeps each turn's state bytes as they came from to_bytes.
    from gateway.conversations.state import ConversationState

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [ConversationState(f"c{i:016x}", "new", "mock").to_bytes() for i in range(500)]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 2 * sum(len(b) + 40 for b in held), grown
