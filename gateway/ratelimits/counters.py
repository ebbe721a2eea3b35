"""Windowed counters: where the rate limits keep their counts.

A minute's count is a sliding window approximated by two fixed windows (the current one, and the
previous one weighted by how much of it still lies within the last minute), as Cloudflare and
Envoy count: each count is one integer per window, atomic in Redis with INCRBY, and the estimate is
off from the exact sliding count by at most the previous window's uneven spread. Admission adds
first and refunds when the estimate went over: two gateways can never both take the last slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class Window:
    """One limit's count over the last minute: the estimate and when it next drops."""

    used: float
    reset_s: float  # seconds until the current window ends (the previous one then weighs nothing)


def _bounds(now: float) -> tuple[int, float]:
    index = int(now // WINDOW_S)
    return index, (now - index * WINDOW_S) / WINDOW_S


class Counters(Protocol):
    async def add(self, key: str, amount: int, now: float) -> Window:
        """Count `amount` in the current window; the estimate after it."""
        ...

    async def peek(self, key: str, now: float) -> Window: ...

    async def gauge(self, key: str, delta: int) -> int:
        """A level (concurrent requests): add `delta`, return the new level."""
        ...


class MemoryCounters:
    """Per process (a gateway without Redis)."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, int], int] = {}
        self._gauges: dict[str, int] = {}

    def _window(self, key: str, now: float, amount: int) -> Window:
        index, elapsed = _bounds(now)
        if amount:
            self._windows[(key, index)] = self._windows.get((key, index), 0) + amount
            for old in [k for k in self._windows if k[1] < index - 1]:
                del self._windows[old]
        current = self._windows.get((key, index), 0)
        previous = self._windows.get((key, index - 1), 0)
        return Window(previous * (1 - elapsed) + current, WINDOW_S * (1 - elapsed))

    async def add(self, key: str, amount: int, now: float) -> Window:
        return self._window(key, now, amount)

    async def peek(self, key: str, now: float) -> Window:
        return self._window(key, now, 0)

    async def gauge(self, key: str, delta: int) -> int:
        level = max(0, self._gauges.get(key, 0) + delta)
        self._gauges[key] = level
        return level


class RedisCounters:
    """Shared by every gateway process on one Redis: INCRBY and EXPIRE in one round trip."""

    PREFIX = "rl:"
    GAUGE_TTL_S = 600  # a process that dies holding slots: its count expires

    def __init__(self, client: Any) -> None:
        self.client = client

    async def _window(self, key: str, now: float, amount: int) -> Window:
        index, elapsed = _bounds(now)
        cur, prev = f"{self.PREFIX}{key}:{index}", f"{self.PREFIX}{key}:{index - 1}"
        pipe = self.client.pipeline(transaction=False)
        if amount:
            pipe.incrby(cur, amount)
            pipe.expire(cur, int(2 * WINDOW_S) + 1)
        else:
            pipe.get(cur)
        pipe.get(prev)
        out = await pipe.execute()
        current = int(out[0] or 0)
        previous = int(out[-1] or 0)
        return Window(previous * (1 - elapsed) + current, WINDOW_S * (1 - elapsed))

    async def add(self, key: str, amount: int, now: float) -> Window:
        return await self._window(key, now, amount)

    async def peek(self, key: str, now: float) -> Window:
        return await self._window(key, now, 0)

    async def gauge(self, key: str, delta: int) -> int:
        name = f"{self.PREFIX}{key}:level"
        pipe = self.client.pipeline(transaction=False)
        pipe.incrby(name, delta)
        pipe.expire(name, self.GAUGE_TTL_S)
        level, _ = await pipe.execute()
        return int(level)


def clock() -> float:
    return time.time()  # wall clock: windows must agree across processes and machines
