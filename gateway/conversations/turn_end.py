"""The moment a response ends: the conversation's head and anchors written, before its analysis."""

from __future__ import annotations

import asyncio
import logging

from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime
from ..store import StateStore
from .analysis import anchors
from .found import Found
from .state import Head

log = logging.getLogger("gateway.drift")

# At most this long for the write before an answer's end, on a store that can wait (Redis); then the
# answer goes on (the analyzer writes the state later).
WRITE_BOUND_S = 0.5


class TurnEnd:
    """The moment a response ends: anchors and head, so the client's next turn finds its
    conversation, turn number and pins even before this turn's analysis is done."""

    def __init__(self, store: StateStore, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._tasks: set[asyncio.Task[None]] = set()

    def arm(self, ex: Exchange, lane: LaneRuntime) -> None:
        """Write the turn's end before the answer's last bytes (the relay awaits it): a client that sends
        its next turn to another gateway the moment the answer is complete is joined there."""
        async def write() -> None:
            found: Found | None = ex.conversation
            if found is None or ex.error_code or ex.cancelled:
                return
            ex.turn_written = True
            await self._write(ex, found, lane.name, lane.config.engine)

        ex.answered.append(write)

    def exchange_ended(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        found: Found | None = ex.conversation
        if found is None or lane is None or ex.status != 200 or ex.cancelled or ex.error_code or ex.turn_written:
            return
        task = asyncio.get_running_loop().create_task(self._write(ex, found, lane.name, lane.config.engine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, ex: Exchange, found: Found, lane: str, lane_engine: str) -> None:
        state = found.state
        n = len((ex.chat or {}).get("messages") or ())
        head = Head(state.turn + 1, ex.effort_applied, ex.thinking_applied, ex.replica, n, state.source, lane,
                    state.created)
        value = f"{state.id}|{state.turn + 1}".encode()
        items = [("head:" + state.id, head.to_bytes())]
        items += ((key, value) for key in anchors(ex.tenant, ex.generated.as_message(), n, lane_engine))
        try:
            if self.store.waits:
                async with asyncio.timeout(WRITE_BOUND_S):
                    await self.store.set_many(items, self.ttl_s)
            else:
                await self.store.set_many(items, self.ttl_s)
        except Exception:  # never let bookkeeping hurt anyone; the analyzer writes state later
            log.exception("writing the head of %s failed", state.id)
