"""Records in a bounded Redis stream (XADD MAXLEN ~), for gateways that share a Redis.

The sink only appends to an in-memory buffer; a background task sends batches in one pipeline.
Redis trouble never reaches a request: failures are counted, logged once (then rarely), and the
batch is dropped so memory stays bounded.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable

import orjson

log = logging.getLogger("gateway.records.redis")

DEFAULT_KEY = "gateway:records"


class RedisRecordStream:
    def __init__(self, client: Callable[[], Any], key: str = DEFAULT_KEY, maxlen: int = 100_000,
                 flush_interval_s: float = 0.2, buffer: int = 10_000) -> None:
        self._client = client  # returns a redis.asyncio.Redis (or None when unavailable)
        self.key = key
        self.maxlen = maxlen
        self.flush_interval_s = flush_interval_s
        self._buf: collections.deque[bytes] = collections.deque(maxlen=buffer)
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self._last_log = 0.0

    def put(self, record: dict[str, Any]) -> None:
        if len(self._buf) == self._buf.maxlen:
            self.dropped += 1  # the deque drops the oldest entry to make room
        self._buf.append(orjson.dumps(record))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        while self._buf:
            batch = [self._buf.popleft() for _ in range(min(len(self._buf), 500))]
            try:
                client = self._client()
                if client is None:
                    raise ConnectionError("no Redis client")
                pipe = client.pipeline(transaction=False)
                for item in batch:
                    pipe.xadd(self.key, {"r": item}, maxlen=self.maxlen, approximate=True)
                await asyncio.wait_for(pipe.execute(), 2.0)
                self.written += len(batch)
            except Exception as exc:  # noqa: BLE001 - any Redis failure is counted, never raised
                self.errors += 1
                self.dropped += len(batch)
                now = time.monotonic()
                if self.errors == 1 or now - self._last_log > 300:
                    self._last_log = now
                    log.warning("records to Redis stream %s failed (%d failures so far, batch dropped): %s",
                                self.key, self.errors, exc)
                return

    async def recent(self, limit: int = 100, lane: str | None = None, since: float | None = None,
                     conversation: str | None = None) -> list[dict[str, Any]]:
        """Newest first, read back from the stream (used when the SQLite store is turned off)."""
        client = self._client()
        if client is None:
            return []
        out: list[dict[str, Any]] = []
        end = "+"
        while len(out) < limit:
            entries = await client.xrevrange(self.key, max=end, min="-", count=500)
            if not entries:
                break
            for _entry_id, fields in entries:
                raw = fields.get(b"r") or fields.get("r")
                if raw is None:
                    continue
                rec = orjson.loads(raw)
                if since is not None and (rec.get("ts") or 0) < since:
                    return out
                if (lane and rec.get("lane") != lane) or (conversation and rec.get("conversation") != conversation):
                    continue
                out.append(rec)
                if len(out) >= limit:
                    break
            last = entries[-1][0]
            last = last.decode() if isinstance(last, bytes) else last
            end = "(" + last
        return out
