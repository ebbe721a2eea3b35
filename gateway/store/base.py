"""The state-store interface: a few byte-valued operations any backend can do cheaply."""

from __future__ import annotations

from typing import Protocol


class StateStore(Protocol):
    name: str
    # Whether a call can wait on another process (Redis): a caller that must not be held up bounds it.
    # An in-process store's calls complete without waiting.
    waits: bool

    async def get(self, key: str) -> bytes | None: ...

    async def mget(self, keys: list[str]) -> list[bytes | None]: ...

    async def mget_shared(self, keys: list[str]) -> list[bytes | None] | None:
        """What the copy every gateway process shares holds; None when it did not answer (then the
        shared copy is unknown, not merely empty). A store with one copy answers with it."""
        ...

    async def mget_fallback(self, keys: list[str]) -> list[bytes | None]:
        """What this process's own copy holds (the shared copy did not answer)."""
        ...

    async def get_fallback(self, key: str) -> bytes | None:
        """This process's own copy of `key` where the store keeps one beside the shared copy (after an
        outage it may hold a later decision); None in a store with one copy."""
        ...

    async def set(self, key: str, value: bytes, ttl_s: float) -> None: ...

    async def set_many(self, items: list[tuple[str, bytes]], ttl_s: float) -> None:
        """`set` of every (key, value), in one round trip where the store has round trips."""
        ...

    async def delete(self, key: str) -> None: ...

    async def index_add(self, index: str, member: str, score: float, cap: int) -> None:
        """Add `member` to a score-ordered index, keeping only the `cap` highest scores."""
        ...

    async def index_newest(self, index: str, limit: int) -> list[str]:
        """Members of the index, highest score first."""
        ...

    async def close(self) -> None: ...
