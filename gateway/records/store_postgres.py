"""Records in PostgreSQL: one table for a whole fleet of gateways (`records: {postgres: ...}`).

Same shape as the SQLite store: `put` appends to an in-memory queue (bounded: past `max_queue`
the oldest waiting records are dropped and counted) and one writer thread sends batches with
COPY, so the event loop never waits on the network. While the database is away the writer keeps
the batch, reconnects with backoff (0.5 s doubling to 10 s) and loses only what overflows the
queue; no request ever waits for or fails because of it. COPY in one transaction, because an
autocommitted INSERT pays a commit per record; `put` is an append, on the aftermath task.

Retention runs every minute from whichever gateway takes the advisory lock first: rows older than
`max_age_s`, then all but the newest `max_rows`. Readers (admin page, `gateway stats`,
`gateway drift`) use one connection per thread and see every gateway's records.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row

from .record import FIELDS
from .store_sql import TRIAGE_DDL, SQLReader

log = logging.getLogger("gateway.records.postgres")

_TYPES = {"REAL": "DOUBLE PRECISION", "INTEGER": "BIGINT", "TEXT": "TEXT"}
_LOCK_SCHEMA = 0x6C676177  # advisory lock ids ("lgaw"): schema changes, then retention
_LOCK_PRUNE = 0x6C676178
CONNECT_TIMEOUT_S = 3


def redact(dsn: str) -> str:
    """The DSN without its password, for logs and the admin page."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "postgresql://?"
    if parts.password is None:
        return dsn
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def connect(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    # A statement that hangs (a locked table, a dying server) must not hold a reader forever.
    # (SET rather than `options=`, which would replace a search_path given in the DSN.)
    conn = psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S, row_factory=dict_row, autocommit=True,
                           application_name="lane-gateway")
    conn.execute("SET statement_timeout = 30000")
    return conn


def ensure_schema(conn: psycopg.Connection[dict[str, Any]]) -> None:
    cols = ", ".join(f'"{name}" {_TYPES[kind]}' for name, kind in FIELDS.items())
    with conn.transaction():
        # Two gateways starting together would race on CREATE TABLE (a unique violation in pg_type).
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_SCHEMA,))
        conn.execute(f"CREATE TABLE IF NOT EXISTS records (id BIGSERIAL PRIMARY KEY, {cols})")
        for name, kind in FIELDS.items():  # a newer gateway on an older table: add the new columns
            conn.execute(f'ALTER TABLE records ADD COLUMN IF NOT EXISTS "{name}" {_TYPES[kind]}')
        conn.execute("CREATE INDEX IF NOT EXISTS records_ts ON records(ts)")
        conn.execute("CREATE INDEX IF NOT EXISTS records_lane_ts ON records(lane, ts)")
        conn.execute("CREATE INDEX IF NOT EXISTS records_conversation ON records(conversation)")
        conn.execute("CREATE INDEX IF NOT EXISTS records_verdict_ts ON records(verdict, ts)")
        conn.execute(TRIAGE_DDL.format(real="DOUBLE PRECISION"))


class PostgresReader(SQLReader):
    """Queries; safe from any thread (one connection per thread, reopened after a failure)."""

    MARK = "%s"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._local = threading.local()

    def _conn(self) -> psycopg.Connection[dict[str, Any]]:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self._local.conn = connect(self.dsn)
        return conn

    def _run(self, sql: str, args: Any, fetch: bool) -> list[dict[str, Any]]:
        for attempt in (0, 1):
            try:
                cur = self._conn().execute(sql, list(args))
                return cur.fetchall() if fetch else []
            except psycopg.errors.UndefinedTable:
                # A fresh database before the writer's first connection made the tables: an admin
                # asking for stats then is told "no records yet", not a 503. (Idempotent, locked.)
                if attempt:
                    raise
                ensure_schema(self._conn())
            except psycopg.OperationalError:
                # A connection the server dropped (restart, failover): one fresh try, then give up.
                old = getattr(self._local, "conn", None)
                self._local.conn = None
                if old is not None:
                    old.close()
                if attempt:
                    raise
        return []

    def _query(self, sql: str, args: Any) -> list[dict[str, Any]]:
        return self._run(sql, args, True)

    def _table_columns(self) -> set[str]:
        rows = self._run("SELECT column_name FROM information_schema.columns WHERE table_name = 'records' "
                         "AND table_schema = ANY(current_schemas(false))", [], True)
        return {r["column_name"] for r in rows}

    def _exec(self, sql: str, args: Any) -> None:
        self._run(sql, args, False)

    def close_reader(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class PostgresStore(PostgresReader):
    def __init__(self, dsn: str, max_age_s: float = 30 * 86400, max_rows: int = 10_000_000,
                 batch: int = 1000, flush_interval_s: float = 0.2, max_queue: int = 100_000) -> None:
        super().__init__(dsn)
        self.max_age_s = max_age_s
        self.max_rows = max_rows
        self.batch = batch
        self.flush_interval_s = flush_interval_s
        self.max_queue = max_queue
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self.connected = False
        self.last_error: str | None = None
        self._buf: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._put_count = 0
        self._done_count = 0  # written or dropped
        self._cv = threading.Condition()
        self._columns = list(FIELDS)
        self._copy_sql = "COPY records (" + ", ".join(f'"{c}"' for c in self._columns) + ") FROM STDIN"
        self._last_log = 0.0

    @property
    def queued(self) -> int:
        return len(self._buf)

    def open(self) -> None:
        """Start the writer. Never raises: a database that is down now is retried in the background."""
        self._thread = threading.Thread(target=self._loop, name="records-postgres", daemon=True)
        self._thread.start()

    def put(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._put_count += 1
            self._buf.append(record)
            over = len(self._buf) - self.max_queue
            for _ in range(max(0, over)):
                self._buf.popleft()  # the oldest waiting record goes: the newest tell the present
            if over > 0:
                self.dropped += over
                self._settled(over)

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until everything put so far is written or dropped (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._put_count
        self._wake.set()
        with self._cv:
            while self._done_count < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))
                self._wake.set()
        return True

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout)
            self._thread = None
        self.close_reader()

    def _settled(self, n: int) -> None:
        with self._cv:
            self._done_count += n
            self._cv.notify_all()

    def _loop(self) -> None:
        conn: psycopg.Connection[dict[str, Any]] | None = None
        backoff = 0.5
        retry_at = 0.0
        last_prune = 0.0
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping
            if conn is None and time.monotonic() >= retry_at:
                try:
                    conn = connect(self.dsn)
                    ensure_schema(conn)
                    self.connected, backoff = True, 0.5
                    if self.errors:
                        log.warning("records database %s is back; %d records waiting", redact(self.dsn), len(self._buf))
                except Exception as exc:  # noqa: BLE001 - any failure: keep the queue, try later
                    self._failed(conn, exc, "connecting to")
                    conn = None
                    retry_at = time.monotonic() + backoff
                    backoff = min(backoff * 2, 10.0)
            while conn is not None and self._buf:
                with self._lock:
                    items = [self._buf.popleft() for _ in range(min(self.batch, len(self._buf)))]
                try:
                    self._write(conn, items)
                    self.written += len(items)
                    self._settled(len(items))
                except Exception as exc:  # noqa: BLE001
                    with self._lock:  # back at the front, in order; put() trims the overflow
                        self._buf.extendleft(reversed(items))
                        over = len(self._buf) - self.max_queue
                        for _ in range(max(0, over)):
                            self._buf.popleft()
                        if over > 0:
                            self.dropped += over
                            self._settled(over)
                    self._failed(conn, exc, "writing records to")
                    conn = None
                    retry_at = time.monotonic() + backoff
                    backoff = min(backoff * 2, 10.0)
            if conn is not None and time.monotonic() - last_prune > 60.0:
                last_prune = time.monotonic()
                try:
                    self.prune(conn)
                except Exception as exc:  # noqa: BLE001
                    self._failed(conn, exc, "pruning records in")
                    conn = None
            if stopping:
                break
        if conn is not None:
            conn.close()

    def _write(self, conn: psycopg.Connection[dict[str, Any]], items: list[dict[str, Any]]) -> None:
        cols = self._columns
        with conn.transaction(), conn.cursor() as cur, cur.copy(self._copy_sql) as copy:
            for r in items:
                copy.write_row([_clean(r.get(c)) for c in cols])

    def prune(self, conn: psycopg.Connection[dict[str, Any]] | None = None) -> None:
        own = conn is None
        conn = conn or connect(self.dsn)
        try:
            with conn.transaction():
                got = conn.execute("SELECT pg_try_advisory_xact_lock(%s) AS ok", (_LOCK_PRUNE,)).fetchone()
                if not got or not got["ok"]:
                    return  # another gateway is pruning right now
                if self.max_age_s > 0:
                    conn.execute("DELETE FROM records WHERE ts < %s", (time.time() - self.max_age_s,))
                if self.max_rows > 0:
                    conn.execute("DELETE FROM records WHERE id <= (SELECT id FROM records ORDER BY id DESC "
                                 "OFFSET %s LIMIT 1)", (self.max_rows,))
                conn.execute('DELETE FROM triage WHERE "until" < %s', (time.time() - 86400,))
        finally:
            if own:
                conn.close()

    def _failed(self, conn: psycopg.Connection[dict[str, Any]] | None, exc: Exception, doing: str) -> None:
        self.errors += 1
        self.connected = False
        self.last_error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        now = time.monotonic()
        if self.errors == 1 or now - self._last_log > 60:
            self._last_log = now
            log.warning("%s %s failed (%d failures so far; %d records queued, %d dropped): %s", doing,
                        redact(self.dsn), self.errors, len(self._buf), self.dropped, self.last_error)
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
        return None


def _clean(v: Any) -> Any:
    # PostgreSQL text cannot hold NUL; a record must never fail a whole batch for one character.
    if isinstance(v, str) and "\x00" in v:
        return v.replace("\x00", "\ufffd")
    return v
