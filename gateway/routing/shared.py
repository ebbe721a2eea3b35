"""What the routers of one gateway process share: the state store, the load board, background writes.

One instance per process (installed by routing/feature.py), kept across routes.yaml reloads, so a
reload rebuilds the routers without forgetting homes, placements or the other processes' load.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine

from .load import LoadBoard

log = logging.getLogger("gateway.routing")

HOME_PREFIX = "route:home:"
HOME_TTL_S = 6 * 3600.0


class RoutingShared:
    def __init__(self, store: Any = None, board: LoadBoard | None = None, home_ttl_s: float = HOME_TTL_S) -> None:
        self.store = store
        self.board = board or LoadBoard(store)
        self.home_ttl_s = home_ttl_s
        self.writes = 0
        self.write_failures = 0
        self.lookups = 0
        self.lookup_failures = 0
        self.decisions: dict[str, dict[str, int]] = {}  # lane -> reason -> count (this process)
        self.kv: Any = None  # gateway.kvevents.service.KVEventsService (prefix_source: kv_events)
        self._tasks: set[asyncio.Task[Any]] = set()

    def count(self, lane: str, reason: str) -> None:
        per = self.decisions.setdefault(lane, {})
        per[reason] = per.get(reason, 0) + 1

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a store write beside the request (never on its path); keep a reference until it ends."""
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a unit test calling served() directly)
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.write_failures += 1
            log.debug("routing write failed", exc_info=task.exception())

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def set_many(self, items: list[tuple[str, bytes, float]]) -> None:
        for key, value, ttl in items:
            await self.store.set(key, value, ttl)
            self.writes += 1

    async def mget(self, keys: list[str]) -> tuple[list[bytes | None], bool]:
        """The values, and whether they are the shared copy's (False: a process-local fallback answered)."""
        self.lookups += 1
        try:
            values = await self.store.mget_shared(keys)
            if values is not None:
                return values, True
            self.lookup_failures += 1
            return await self.store.mget_fallback(keys), False
        except Exception:  # noqa: BLE001 - a routing hint is never worth failing a request for
            self.lookup_failures += 1
            log.debug("routing lookup failed", exc_info=True)
            return [None] * len(keys), False

    def describe(self) -> dict[str, Any]:
        return {"store": self.store.name if self.store is not None else None, "writes": self.writes,
                "write_failures": self.write_failures, "lookups": self.lookups,
                "lookup_failures": self.lookup_failures, "decisions": self.decisions, "board": self.board.describe()}
