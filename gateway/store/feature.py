"""Install the state store: Redis when GATEWAY_REDIS_URL is set, memory otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .memory import MemoryStore

if TYPE_CHECKING:
    from ..app import Gateway


def install(gw: "Gateway") -> None:
    if gw.settings.redis_url:
        from .redis_store import RedisStore

        store = RedisStore(gw.settings.redis_url)
        gw.services["redis"] = store.client
    else:
        store = MemoryStore()
    gw.services["store"] = store
    gw.shutdown.append(store.close)
