"""Records in a local SQLite file: the default store, no server needed.

Writes go through a queue to one writer thread that inserts in batches, so the event loop never
touches the disk. Retention: rows older than `max_age_s` and beyond the newest `max_rows` are
deleted every minute. WAL mode lets readers (the admin page, `gateway stats`, other worker
processes writing the same file) run beside the writer.
"""

from __future__ import annotations

import functools
import logging
import operator
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from .record import FIELDS
from .store_sql import TRIAGE_DDL, SQLReader

log = logging.getLogger("gateway.records.sqlite")

FILENAME = "records.sqlite3"


def connect(path: Path, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0, check_same_thread=False)
    else:
        # Records hold prompts' metadata and upstream errors: readable by the owner only. SQLite gives
        # its -wal and -shm files the database file's mode.
        path.touch(mode=0o600, exist_ok=True)
        conn = sqlite3.connect(path, timeout=5.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes, fast
    conn.execute("PRAGMA busy_timeout=5000")
    conn.row_factory = sqlite3.Row
    return conn


def ensure_schema(conn: sqlite3.Connection) -> None:
    cols = ", ".join(f'"{name}" {kind}' for name, kind in FIELDS.items())
    conn.execute(f"CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})")
    have = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    for name, kind in FIELDS.items():  # a newer gateway on an older file: add the new columns
        if name not in have:
            conn.execute(f'ALTER TABLE records ADD COLUMN "{name}" {kind}')
    conn.execute("CREATE INDEX IF NOT EXISTS records_ts ON records(ts)")
    conn.execute("CREATE INDEX IF NOT EXISTS records_lane_ts ON records(lane, ts)")
    conn.execute("CREATE INDEX IF NOT EXISTS records_conversation ON records(conversation)")
    conn.execute("CREATE INDEX IF NOT EXISTS records_verdict_ts ON records(verdict, ts)")
    conn.execute(TRIAGE_DDL.format(real="REAL"))
    conn.commit()


class RecordReader(SQLReader):
    """Queries over a records file. Safe from any thread (one connection per thread)."""

    MARK = "?"

    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.path = path
        self._readonly = readonly
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.path, readonly=self._readonly)
        return conn

    def _query(self, sql: str, args: Any) -> list[dict[str, Any]]:
        if self._readonly and "triage" in sql and not self._has_triage():
            return []  # a file written by an older gateway
        return [dict(r) for r in self._conn().execute(sql, tuple(args)).fetchall()]

    def _exec(self, sql: str, args: Any) -> None:
        conn = self._conn()
        conn.execute(sql, tuple(args))
        conn.commit()

    def _table_columns(self) -> set[str]:
        return {row[1] for row in self._conn().execute("PRAGMA table_info(records)")}

    def _has_triage(self) -> bool:
        return bool(self._conn().execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'triage'").fetchone())


class SQLiteStore(RecordReader):
    """Batched writer plus reader. `put` never blocks; past `max_queue` waiting records it drops and counts.

    `put` only appends to a list: the writer thread wakes on its own every `flush_interval_s` and
    takes the whole list, so the request path never pays for waking another thread.
    """

    def __init__(self, data_dir: Path, max_age_s: float = 7 * 86400, max_rows: int = 1_000_000,
                 batch: int = 512, flush_interval_s: float = 0.2, max_queue: int = 100_000) -> None:
        super().__init__(Path(data_dir) / FILENAME)
        self.max_age_s = max_age_s
        self.max_rows = max_rows
        self.batch = batch
        self.flush_interval_s = flush_interval_s
        self.max_queue = max_queue
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self._buf: list[dict[str, Any]] = []
        self._buf_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._put_count = 0  # accepted by put()
        self._done_count = 0  # taken by the writer and settled (written or failed)
        self._cv = threading.Condition()
        self._columns = list(FIELDS)
        self._row = operator.itemgetter(*self._columns)  # a record's values in column order, in C

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = connect(self.path)
        ensure_schema(conn)
        self._prune(conn)
        conn.close()
        self._thread = threading.Thread(target=self._run, name="records-sqlite", daemon=True)
        self._thread.start()

    def put(self, record: dict[str, Any]) -> None:
        with self._buf_lock:
            if len(self._buf) >= self.max_queue:
                self.dropped += 1
                return
            self._buf.append(record)
            self._put_count += 1

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until everything put so far is committed (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._buf_lock:
            target = self._put_count
        self._wake.set()
        with self._cv:
            while self._done_count < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        conn = connect(self.path)
        last_prune = time.monotonic()
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping
            with self._buf_lock:
                items, self._buf = self._buf, []
            for i in range(0, len(items), self.batch):
                self._write(conn, items[i:i + self.batch])
            if items:
                with self._cv:
                    self._done_count += len(items)
                    self._cv.notify_all()
            if time.monotonic() - last_prune > 60.0:
                last_prune = time.monotonic()
                self._prune(conn)
            if stopping:
                break
        conn.close()

    def _write(self, conn: sqlite3.Connection, items: list[dict[str, Any]]) -> None:
        cols = self._columns
        try:
            rows = [_row(r, self._row, cols) for r in items]
            for sql, args in _inserts(cols, rows, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)):
                conn.execute(sql, args)
            conn.commit()
            self.written += len(items)
        except sqlite3.Error as exc:
            self.errors += 1
            if self.errors == 1 or self.errors % 1000 == 0:
                log.error("writing %d records to %s failed (%d failures so far): %s",
                          len(items), self.path, self.errors, exc)
            try:
                conn.rollback()
            except sqlite3.Error:
                pass

    def _prune(self, conn: sqlite3.Connection) -> None:
        try:
            if self.max_age_s > 0:
                conn.execute("DELETE FROM records WHERE ts < ?", (time.time() - self.max_age_s,))
            if self.max_rows > 0:
                row = conn.execute("SELECT id FROM records ORDER BY id DESC LIMIT 1 OFFSET ?",
                                   (self.max_rows,)).fetchone()
                if row is not None:
                    conn.execute("DELETE FROM records WHERE id <= ?", (row[0],))
            conn.commit()
        except sqlite3.Error as exc:
            log.warning("pruning %s failed: %s", self.path, exc)


# Rows per INSERT statement, largest first. sqlite3 releases the GIL for each step of a statement and
# takes it back after: one row per step made the writer thread and the event loop hand the GIL to
# each other for every record (futex calls and context switches on the request path); a statement of
# many rows is one step.
_ROWS_PER_INSERT = (64, 8, 1)


@functools.lru_cache(maxsize=8)
def _insert_sql(columns: tuple[str, ...], rows: int) -> str:
    marks = "(" + ", ".join("?" for _ in columns) + ")"
    names = ", ".join(f'"{c}"' for c in columns)
    return f"INSERT INTO records ({names}) VALUES " + ", ".join(marks for _ in range(rows))


def _inserts(columns: list[str], rows: list[tuple[Any, ...]], max_variables: int) -> Iterator[tuple[str, list[Any]]]:
    """INSERT statements that write `rows` in order, each of as many rows as fit (sizes _ROWS_PER_INSERT,
    within SQLite's limit on a statement's variables)."""
    key = tuple(columns)
    i = 0
    for size in _ROWS_PER_INSERT:
        if size > 1 and size * len(columns) > max_variables:
            continue
        sql = _insert_sql(key, size)
        while len(rows) - i >= size:
            yield sql, [v for row in rows[i:i + size] for v in row]
            i += size


def _row(record: dict[str, Any], row: Any, columns: list[str]) -> tuple[Any, ...]:
    """The record's values in column order (None for a column it lacks). build_record's records have
    every column: one itemgetter call (in C) rather than a .get per column."""
    try:
        return row(record)
    except KeyError:
        return tuple(record.get(c) for c in columns)
