"""Install per-request records: an aftermath sink feeding SQLite (default) and a Redis stream.

With `gateway: {records: {postgres: ...}}` in routes.yaml the records of every gateway go to one
PostgreSQL table instead of the local file (read once at start-up: changing it needs a restart).
Knobs (Settings, from the environment): GATEWAY_RECORDS_SQLITE (1), GATEWAY_RECORDS_MAX_AGE ("7d"),
GATEWAY_RECORDS_MAX_ROWS (1000000), GATEWAY_RECORDS_STREAM ("gateway:records"),
GATEWAY_RECORDS_STREAM_MAXLEN (100000), GATEWAY_CAPTURE=1 with GATEWAY_CAPTURE_MAX_BYTES (16384).
Query API for the admin page and other parts: the `Records` the composition root builds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

from ..core.exchange import Exchange
from .query import Filters, matches
from .record import build_record
from .stats import STATS_COLUMNS, compute_stats, costs, decode_histogram, lost_by_cause, series
from .store_postgres import PostgresStore, redact
from .store_redis import RedisRecordStream
from .store_sql import MAX_ROWS
from .store_sqlite import SQLiteStore

if TYPE_CHECKING:
    from ..core.config import RecordsConfig
    from ..core.runtime import LaneRuntime
    from ..core.settings import Settings

log = logging.getLogger("gateway.records")


class Records:
    """Where finished exchanges become records, and where they are read back.

    `db` is the SQL store (SQLite by default, PostgreSQL when routes.yaml names one); `stream` the
    optional bounded Redis stream. Readers ask the SQL store when there is one.
    """

    def __init__(self, db: SQLiteStore | PostgresStore | None, stream: RedisRecordStream | None,
                 capture_max_bytes: int = 0, gateway_id: str | None = None) -> None:
        self.db = db
        self.stream = stream
        self.capture_max_bytes = capture_max_bytes
        self.gateway_id = gateway_id
        self.built = 0
        self.failed = 0

    @property
    def sqlite(self) -> SQLiteStore | None:  # older callers
        return self.db if isinstance(self.db, SQLiteStore) else None

    @property
    def backend(self) -> str:
        if isinstance(self.db, PostgresStore):
            return "postgres"
        if self.db is not None:
            return "sqlite"
        return "redis" if self.stream is not None else "none"

    def sink(self, ex: Exchange, lane: "LaneRuntime | None") -> None:
        try:
            rec = build_record(ex, self.capture_max_bytes)
        except Exception:
            self.failed += 1
            log.exception("building the record of %s failed", ex.request_id)
            return
        rec["gateway"] = self.gateway_id
        self.built += 1
        if self.db is not None:
            self.db.put(rec)
        if self.stream is not None:
            self.stream.put(rec)

    # -- queries (async: disk and network work runs off the event loop) ----------------------

    async def recent(self, limit: int = 100, lane: str | None = None, since: float | None = None,
                     conversation: str | None = None, filters: Filters | None = None) -> list[dict[str, Any]]:
        f = _merge(filters, lane, since, conversation)
        if self.db is not None:
            return await asyncio.to_thread(self.db.recent, limit, filters=f)
        if self.stream is not None:
            return [r for r in await self.stream.recent(50_000, f.lane, f.since) if matches(r, f)][:limit]
        return []

    async def rows(self, window_s: float, lane: str | None = None, filters: Filters | None = None,
                   columns: tuple[str, ...] = STATS_COLUMNS, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        f = _merge(filters, lane, None, None)
        if f.since is None:
            f = f.with_(since=now - window_s)
        if self.db is not None:
            return await asyncio.to_thread(self.db.rows, filters=f, columns=columns)
        if self.stream is not None:
            rows = [r for r in await self.stream.recent(50_000, f.lane, f.since) if matches(r, f)]
            rows.reverse()
            return rows
        return []

    async def stats(self, window_s: float = 3600.0, lane: str | None = None,
                    filters: Filters | None = None) -> dict[str, Any]:
        now = time.time()
        rows = await self.rows(window_s, lane, filters, now=now)
        # Summaries are pure Python over up to MAX_ROWS rows (seconds on a busy machine): in a thread,
        # so the event loop keeps relaying streams meanwhile.
        out = await asyncio.to_thread(_stats_of, rows, window_s, now)
        out["source"] = self.source()
        out["rows_capped"] = len(rows) >= MAX_ROWS  # the summary covers only the newest MAX_ROWS records
        return out

    async def charts(self, window_s: float = 3600.0, buckets: int = 60,
                     filters: Filters | None = None) -> dict[str, Any]:
        now = time.time()
        rows = await self.rows(window_s, filters=filters, now=now)
        out = await asyncio.to_thread(_charts_of, rows, window_s, buckets, now)
        out["source"] = self.source()
        out["rows_capped"] = len(rows) >= MAX_ROWS
        return out

    async def conversation(self, cid: str, limit: int = 2000) -> list[dict[str, Any]]:
        """Every record of one conversation, oldest first."""
        rows = await self.recent(limit, filters=Filters(conversation=cid))
        rows.reverse()
        return rows

    async def triage(self) -> list[dict[str, Any]]:
        if self.db is None:
            return []
        return await asyncio.to_thread(self.db.triage_list)

    async def triage_add(self, rule: dict[str, Any]) -> dict[str, Any]:
        if self.db is None:
            raise RuntimeError("acknowledge and mute need a records database (SQLite or PostgreSQL)")
        return await asyncio.to_thread(self.db.triage_add, rule)

    async def triage_delete(self, rule_id: str) -> bool:
        if self.db is None:
            return False
        return await asyncio.to_thread(self.db.triage_delete, rule_id)

    def source(self) -> dict[str, Any]:
        """Where these figures come from: this process, this machine, or the whole fleet."""
        if isinstance(self.db, PostgresStore):
            return {"backend": "postgres", "scope": "fleet", "database": redact(self.db.dsn),
                    "connected": self.db.connected, "queued": self.db.queued, "dropped": self.db.dropped,
                    "last_error": self.db.last_error}
        if self.db is not None:
            return {"backend": "sqlite", "scope": "host", "database": str(self.db.path)}
        return {"backend": self.backend, "scope": "fleet" if self.stream is not None else "none"}

    async def flush(self, timeout: float = 5.0) -> bool:
        ok = True
        if self.db is not None:
            ok = await asyncio.to_thread(self.db.flush, timeout)
        if self.stream is not None:
            await self.stream.flush()
        return ok

    def counters(self) -> dict[str, float]:
        """Store health for /metrics."""
        out: dict[str, float] = {"built": self.built, "build_failed": self.failed}
        for name, store in ((self.backend if self.db is not None else "db", self.db), ("redis", self.stream)):
            if store is not None:
                out[f"{name}_written"] = store.written
                out[f"{name}_dropped"] = store.dropped
                out[f"{name}_errors"] = store.errors
        return out


def _stats_of(rows: list[dict[str, Any]], window_s: float, now: float) -> dict[str, Any]:
    out = compute_stats(rows, window_s, now)
    out["costs"] = costs(rows, window_s, now=now)
    return out


def _charts_of(rows: list[dict[str, Any]], window_s: float, buckets: int, now: float) -> dict[str, Any]:
    return {
        "stats": compute_stats(rows, window_s, now),
        "series": series(rows, window_s, buckets, now, fit=True),
        "decode_histogram": decode_histogram(rows),
        "lost_by_cause": lost_by_cause(rows),
        "costs": costs(rows, window_s, buckets=min(buckets, 48), now=now),
    }


def _merge(filters: Filters | None, lane: str | None, since: float | None, conversation: str | None) -> Filters:
    f = filters or Filters()
    if lane:
        f = f.with_(lane=lane)
    if since is not None:
        f = f.with_(since=since)
    if conversation:
        f = f.with_(conversation=conversation)
    return f


class RecordsLifecycle:
    """Opens the records database and the Redis stream at start; flushes and closes them at stop (after
    the aftermath queue drained, so the last records are in the stores' queues)."""

    def __init__(self, records: Records, data_dir: Any, own_client: list[Any]) -> None:
        self.records = records
        self.data_dir = data_dir
        self._own_client = own_client

    async def start(self) -> None:
        db = self.records.db
        if db is not None:
            try:
                # SQLite: opens the file. PostgreSQL: starts the writer, which connects in the
                # background; a database that is down now never stops the gateway from serving.
                await asyncio.to_thread(db.open)
            except Exception:  # serving matters more than records: keep going, say why loudly
                log.exception("cannot open the records file under %s; records are not stored", self.data_dir)
                self.records.db = None
        if self.records.stream is not None:
            self.records.stream.start()

    async def stop(self) -> None:
        stream = self.records.stream
        if stream is not None:
            await stream.stop()
            for client in self._own_client:
                await client.aclose()
        db = self.records.db
        if db is not None:
            await asyncio.to_thread(db.flush, 5.0)
            await asyncio.to_thread(db.close)


def build_records(settings: "Settings", shared_client: Any = None,
                  config: "RecordsConfig | None" = None) -> tuple[Records, RecordsLifecycle]:
    """Records per routes.yaml's `gateway.records` (`config`) and `settings` (the local file, the Redis
    stream, the capture); `shared_client` is the state store's Redis client when it has one."""
    db: SQLiteStore | PostgresStore | None = None
    url = config.postgres_url() if config is not None else None
    if config is not None and config.postgres_env and not url:
        log.error("gateway.records.postgres_env names %s, which is not set: records go to the local file",
                  config.postgres_env)
    if url and config is not None:
        db = PostgresStore(url, max_age_s=config.max_age_days * 86400, max_rows=config.max_rows,
                           max_queue=config.max_queue)
    elif settings.records_sqlite:
        db = SQLiteStore(
            settings.data_dir,
            max_age_s=settings.records_max_age_s,
            max_rows=settings.records_max_rows,
        )
    own_client: list[Any] = []

    def redis_client() -> Any:
        # The state store's client when it exists (one pool per process), else our own.
        if shared_client is not None:
            return shared_client
        if not own_client:
            import redis.asyncio as aioredis

            assert settings.redis_url is not None  # the stream that asks is made only with a URL (below)
            own_client.append(aioredis.from_url(settings.redis_url, socket_timeout=2.0,
                                                socket_connect_timeout=2.0))
        return own_client[0]

    stream = None
    if settings.redis_url:
        stream = RedisRecordStream(redis_client, key=settings.records_stream, maxlen=settings.records_stream_maxlen)
    capture = settings.capture_max_bytes if settings.capture_bodies else 0
    records = Records(db, stream, capture, gateway_id=f"{socket.gethostname()}:{settings.port}")
    return records, RecordsLifecycle(records, settings.data_dir, own_client)
