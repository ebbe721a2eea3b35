"""The state store: Redis when GATEWAY_REDIS_URL is set, memory otherwise (GATEWAY_STATE_MAX_BYTES)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import StateStore
from .memory import MemoryStore

if TYPE_CHECKING:
    from ..core.settings import Settings


def build_store(settings: "Settings") -> tuple[StateStore, Any]:
    """The store, and its Redis client when there is one (shared with the records stream: one pool)."""
    if settings.redis_url:
        from .redis_store import RedisStore

        store = RedisStore(settings.redis_url, local=MemoryStore(max_bytes=settings.state_max_bytes))
        return store, store.client
    return MemoryStore(max_bytes=settings.state_max_bytes), None
