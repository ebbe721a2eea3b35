"""Redis state, shared by every gateway process; falls back to local memory while Redis is away.

Every write goes to the local store too, so a process keeps deciding the same way during an
outage; once Redis answers again, reads and writes flow there again (state written locally
meanwhile reaches Redis the next time that key is written).
"""

from __future__ import annotations

import logging
import time
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from .memory import MemoryStore

log = logging.getLogger("gateway.store")

PREFIX = "gw:"


class RedisStore:
    name = "redis"
    waits = True

    def __init__(self, url: str, local: MemoryStore | None = None, retry_after_s: float = 1.0) -> None:
        # One immediate retry on a broken connection: after Redis restarts, every pooled connection is
        # dead, and without it each one's first command would fail and send the process to its local
        # copy again. Timeouts are not retried (Redis is slow: do not wait twice).
        self.client = aioredis.Redis.from_url(
            url, socket_timeout=0.25, socket_connect_timeout=0.25, health_check_interval=0, retry_on_timeout=False,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self.local = local or MemoryStore()
        self.retry_after_s = retry_after_s
        self.failures = 0
        self._down_until = 0.0
        self._logged_down = False

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self._down_until = time.monotonic() + self.retry_after_s
        if not self._logged_down:
            log.warning("redis unavailable, using local state until it returns: %s", exc)
            self._logged_down = True

    def _ok(self) -> None:
        if self._logged_down:
            log.warning("redis is back; shared state resumes")
            self._logged_down = False

    async def get(self, key: str) -> bytes | None:
        if self.available:
            try:
                value = cast("bytes | None", await self.client.get(PREFIX + key))  # bytes: decode_responses off
                self._ok()
                return value if value is not None else await self.local.get(key)
            except (RedisError, OSError) as exc:
                self._failed(exc)
        return await self.local.get(key)

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        values = await self.mget_shared(keys)
        return values if values is not None else await self.local.mget(keys)

    async def mget_fallback(self, keys: list[str]) -> list[bytes | None]:
        return await self.local.mget(keys)

    async def get_fallback(self, key: str) -> bytes | None:
        return await self.local.get(key)

    async def mget_shared(self, keys: list[str]) -> list[bytes | None] | None:
        """What Redis holds, or None when Redis did not answer (the caller then knows the shared copy
        is unknown, not merely empty)."""
        if self.available and keys:
            try:
                values = await self.client.mget([PREFIX + k for k in keys])
                self._ok()
                return cast("list[bytes | None]", list(values))  # bytes: decode_responses off
            except (RedisError, OSError) as exc:
                self._failed(exc)
        return None

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        await self.local.set(key, value, ttl_s)
        if self.available:
            try:
                await self.client.set(PREFIX + key, value, px=max(1, int(ttl_s * 1000)))
                self._ok()
            except (RedisError, OSError) as exc:
                self._failed(exc)

    async def set_many(self, items: list[tuple[str, bytes]], ttl_s: float) -> None:
        await self.local.set_many(items, ttl_s)
        if self.available:
            try:
                pipe = self.client.pipeline(transaction=False)
                px = max(1, int(ttl_s * 1000))
                for key, value in items:
                    pipe.set(PREFIX + key, value, px=px)
                await pipe.execute()
                self._ok()
            except (RedisError, OSError) as exc:
                self._failed(exc)

    async def delete(self, key: str) -> None:
        await self.local.delete(key)
        if self.available:
            try:
                await self.client.delete(PREFIX + key)
            except (RedisError, OSError) as exc:
                self._failed(exc)

    async def index_add(self, index: str, member: str, score: float, cap: int) -> None:
        await self.local.index_add(index, member, score, cap)
        if self.available:
            try:
                pipe = self.client.pipeline(transaction=False)
                pipe.zadd(PREFIX + index, {member: score})
                pipe.zremrangebyrank(PREFIX + index, 0, -cap - 1)
                await pipe.execute()
                self._ok()
            except (RedisError, OSError) as exc:
                self._failed(exc)

    async def index_newest(self, index: str, limit: int) -> list[str]:
        if self.available:
            try:
                members = cast("list[bytes | str]", await self.client.zrevrange(PREFIX + index, 0, limit - 1))
                self._ok()
                return [m.decode() if isinstance(m, bytes) else m for m in members]
            except (RedisError, OSError) as exc:
                self._failed(exc)
        return await self.local.index_newest(index, limit)

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except (RedisError, OSError):
            pass
