"""The assistant messages the gateway relayed, kept so a later request's drifted copy can be repaired.

Written the moment a response ends (before the client can send its next turn), read on the hot path.
Keyed by `heal_digest` within the tenant (a tenant's relayed text never repairs another tenant's
request), for the conversation TTL. This process keeps the newest in memory (bounded by bytes: the
hot path of a gateway that relayed them never waits for the store); the store serves the rest
(another gateway process, a restart) in one multi-get per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from ..conversations.identity import DEFAULT_TENANT
from ..store import StateStore
from .base import Relayed

log = logging.getLogger("gateway.heal")


def relayed_key(tenant: str, digest: int) -> str:
    scope = "" if tenant == DEFAULT_TENANT else f"{tenant}:"
    return f"rel:{scope}{digest:016x}"


class RelayedBook:
    def __init__(self, store: StateStore, ttl_s: float, max_bytes: int = 64 << 20) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._recent: OrderedDict[str, Relayed] = OrderedDict()
        self._bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def remember(self, tenant: str, digest: int, relayed: Relayed) -> None:
        key = relayed_key(tenant, digest)
        self._keep(key, relayed)
        task = asyncio.get_running_loop().create_task(self._write(key, relayed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _keep(self, key: str, relayed: Relayed) -> None:
        old = self._recent.pop(key, None)
        if old is not None:
            self._bytes -= old.size()
        self._recent[key] = relayed
        self._bytes += relayed.size()
        while self._bytes > self.max_bytes and self._recent:
            _, dropped = self._recent.popitem(last=False)
            self._bytes -= dropped.size()

    async def _write(self, key: str, relayed: Relayed) -> None:
        try:
            await self.store.set(key, relayed.to_bytes(), self.ttl_s)
        except Exception:  # the in-memory copy still serves this process
            log.exception("storing a relayed message failed")

    async def lookup(self, tenant: str, digests: list[int]) -> dict[int, Relayed]:
        """The relayed messages of `digests` that are known: memory first, then one multi-get."""
        found: dict[int, Relayed] = {}
        missing: list[tuple[int, str]] = []
        for d in digests:
            key = relayed_key(tenant, d)
            rel = self._recent.get(key)
            if rel is not None:
                found[d] = rel
            else:
                missing.append((d, key))
        if missing:
            values = await self.store.mget([k for _, k in missing])
            for (d, key), raw in zip(missing, values):
                if raw is None:
                    continue
                try:
                    rel = Relayed.from_bytes(raw)
                except Exception:  # a value of another version: as if unknown
                    continue
                self._keep(key, rel)
                found[d] = rel
        return found
