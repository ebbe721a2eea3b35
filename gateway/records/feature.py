"""Install per-request records: an aftermath sink feeding SQLite (default) and a Redis stream.

Knobs (environment): GATEWAY_RECORDS_SQLITE (1), GATEWAY_RECORDS_MAX_AGE ("7d"),
GATEWAY_RECORDS_MAX_ROWS (1000000), GATEWAY_RECORDS_STREAM ("gateway:records"),
GATEWAY_RECORDS_STREAM_MAXLEN (100000), GATEWAY_CAPTURE=1 with GATEWAY_CAPTURE_MAX_BYTES (16384).
Query API for the admin page and other parts: the `Records` the composition root builds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from ..exchange import Exchange
from .record import build_record
from .stats import compute_stats, decode_histogram, lost_by_cause, parse_window, series
from .store_redis import DEFAULT_KEY, RedisRecordStream
from .store_sqlite import SQLiteStore

if TYPE_CHECKING:
    from ..runtime import LaneRuntime
    from ..settings import Settings

log = logging.getLogger("gateway.records")


class Records:
    """Where finished exchanges become records, and where they are read back."""

    def __init__(self, sqlite: SQLiteStore | None, stream: RedisRecordStream | None,
                 capture_max_bytes: int = 0) -> None:
        self.sqlite = sqlite
        self.stream = stream
        self.capture_max_bytes = capture_max_bytes
        self.built = 0
        self.failed = 0

    def sink(self, ex: Exchange, lane: "LaneRuntime | None") -> None:
        try:
            rec = build_record(ex, self.capture_max_bytes)
        except Exception:
            self.failed += 1
            log.exception("building the record of %s failed", ex.request_id)
            return
        self.built += 1
        if self.sqlite is not None:
            self.sqlite.put(rec)
        if self.stream is not None:
            self.stream.put(rec)

    # -- queries (async: disk and network work runs off the event loop) ----------------------

    async def recent(self, limit: int = 100, lane: str | None = None, since: float | None = None,
                     conversation: str | None = None) -> list[dict[str, Any]]:
        if self.sqlite is not None:
            return await asyncio.to_thread(self.sqlite.recent, limit, lane, since, conversation)
        if self.stream is not None:
            return await self.stream.recent(limit, lane, since, conversation)
        return []

    async def rows(self, window_s: float, lane: str | None = None) -> list[dict[str, Any]]:
        since = time.time() - window_s
        if self.sqlite is not None:
            return await asyncio.to_thread(self.sqlite.rows, since, lane)
        if self.stream is not None:
            rows = await self.stream.recent(50_000, lane, since)
            rows.reverse()
            return rows
        return []

    async def stats(self, window_s: float = 3600.0, lane: str | None = None) -> dict[str, Any]:
        return compute_stats(await self.rows(window_s, lane), window_s)

    async def charts(self, window_s: float = 3600.0, buckets: int = 60) -> dict[str, Any]:
        rows = await self.rows(window_s)
        now = time.time()
        return {
            "stats": compute_stats(rows, window_s, now),
            "series": series(rows, window_s, buckets, now, fit=True),
            "decode_histogram": decode_histogram(rows),
            "lost_by_cause": lost_by_cause(rows),
        }

    async def flush(self, timeout: float = 5.0) -> bool:
        ok = True
        if self.sqlite is not None:
            ok = await asyncio.to_thread(self.sqlite.flush, timeout)
        if self.stream is not None:
            await self.stream.flush()
        return ok

    def counters(self) -> dict[str, float]:
        """Store health for /metrics."""
        out: dict[str, float] = {"built": self.built, "build_failed": self.failed}
        for name, store in (("sqlite", self.sqlite), ("redis", self.stream)):
            if store is not None:
                out[f"{name}_written"] = store.written
                out[f"{name}_dropped"] = store.dropped
                out[f"{name}_errors"] = store.errors
        return out


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


class RecordsLifecycle:
    """Opens the SQLite file and the Redis stream at start; flushes and closes them at stop (after the
    aftermath queue drained, so the last records are in the stores' queues)."""

    def __init__(self, records: Records, data_dir: Any, own_client: list[Any]) -> None:
        self.records = records
        self.data_dir = data_dir
        self._own_client = own_client
        self._sqlite = records.sqlite

    async def start(self) -> None:
        sqlite = self._sqlite
        if sqlite is not None:
            try:
                await asyncio.to_thread(sqlite.open)
            except Exception:  # serving matters more than records: keep going, say why loudly
                log.exception("cannot open the records file under %s; records are not stored", self.data_dir)
                self.records.sqlite = None
        if self.records.stream is not None:
            self.records.stream.start()

    async def stop(self) -> None:
        stream = self.records.stream
        if stream is not None:
            await stream.stop()
            for client in self._own_client:
                await client.aclose()
        if self.records.sqlite is not None:
            await asyncio.to_thread(self.records.sqlite.flush, 5.0)
            await asyncio.to_thread(self.records.sqlite.close)


def build_records(settings: "Settings", shared_client: Any = None) -> tuple[Records, RecordsLifecycle]:
    """Records per the environment knobs above; `shared_client` is the state store's Redis client when it has one."""
    sqlite = None
    if _env("GATEWAY_RECORDS_SQLITE", "1") == "1":
        sqlite = SQLiteStore(
            settings.data_dir,
            max_age_s=parse_window(_env("GATEWAY_RECORDS_MAX_AGE", "7d")),
            max_rows=int(_env("GATEWAY_RECORDS_MAX_ROWS", "1000000")),
        )
    own_client: list[Any] = []

    def redis_client() -> Any:
        # The state store's client when it exists (one pool per process), else our own.
        if shared_client is not None:
            return shared_client
        if not own_client:
            import redis.asyncio as aioredis

            own_client.append(aioredis.from_url(settings.redis_url, socket_timeout=2.0,
                                                socket_connect_timeout=2.0))
        return own_client[0]

    stream = None
    if settings.redis_url:
        stream = RedisRecordStream(redis_client, key=_env("GATEWAY_RECORDS_STREAM", DEFAULT_KEY),
                                   maxlen=int(_env("GATEWAY_RECORDS_STREAM_MAXLEN", "100000")))
    capture = int(_env("GATEWAY_CAPTURE_MAX_BYTES", "16384")) if settings.capture_bodies else 0
    records = Records(sqlite, stream, capture)
    return records, RecordsLifecycle(records, settings.data_dir, own_client)
