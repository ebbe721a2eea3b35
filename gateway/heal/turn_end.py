"""The moment a response ends on a healing lane: remember the assistant message exactly as relayed.

Also, for the content kind, the lineage anchors of the relayed message with its content trimmed: a
client that trims the newest message's content would otherwise not be recognised as the same
conversation (the anchors are digests of the exact text), and without its state no repair applies.
"""

from __future__ import annotations

import asyncio
import logging

from ..conversations.identity import anchor_keys, message_digest
from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime
from ..store import StateStore
from .base import Relayed, heal_digest
from .book import RelayedBook

log = logging.getLogger("gateway.heal")


class HealTurnEnd:
    def __init__(self, book: RelayedBook, store: StateStore, ttl_s: float) -> None:
        self.book = book
        self.store = store
        self.ttl_s = ttl_s
        self._tasks: set[asyncio.Task[None]] = set()

    def exchange_ended(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        found = ex.conversation
        if lane is None or not lane.config.heal or found is None or ex.status != 200 or ex.cancelled \
                or ex.error_code:
            return
        msg = ex.generated.as_message()
        if not (msg.get("content") or msg.get("reasoning_content") or msg.get("tool_calls")):
            return
        self.book.remember(ex.tenant, heal_digest(msg), Relayed.from_message(msg))
        content = msg.get("content")
        if "content" in lane.config.heal and isinstance(content, str) and content.strip() != content:
            n = len((ex.chat or {}).get("messages") or ())
            keys = anchor_keys(message_digest({**msg, "content": content.strip()}), n, ex.tenant)
            value = f"{found.state.id}|{found.state.turn + 1}".encode()
            task = asyncio.get_running_loop().create_task(self._anchor(keys, value))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _anchor(self, keys: list[str], value: bytes) -> None:
        try:
            for key in keys:
                await self.store.set(key, value, self.ttl_s)
        except Exception:
            log.exception("writing trimmed-content anchors failed")
