"""Queries shared by the SQL stores (SQLite and PostgreSQL): the same SQL, their own placeholder.

A subclass gives `_query(sql, args) -> list[dict]`, `_exec(sql, args)` and `MARK`. Besides the
records table, each database holds `triage`: the reviewers' acknowledgements and mutes, so every
gateway writing to the same database shows the same triage.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .query import Filters, where
from .record import FIELDS
from .stats import STATS_COLUMNS

MAX_ROWS = 200_000  # a summary never reads more rows than this (newest kept): ~100 MB of dicts at most

TRIAGE_COLUMNS = ("id", "kind", "lane", "cause", "client", "until", "created", "author", "note")


class SQLReader:
    MARK = "?"
    source: dict[str, Any]  # where the rows come from, as `gateway records` reports it (records/cli.py)
    _have_cache: set[str] | None = None  # the table's columns, once it has them all

    def _query(self, sql: str, args: list[Any] | tuple[Any, ...]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _exec(self, sql: str, args: list[Any] | tuple[Any, ...]) -> None:
        raise NotImplementedError

    def _table_columns(self) -> set[str]:
        """The records table's columns as the database has them now."""
        raise NotImplementedError

    def _have(self) -> set[str]:
        # A reader may be newer than the gateway that last wrote the table (`gateway stats` on a
        # host running an older gateway): columns it does not have yet read as NULL. Kept once the
        # table has every column (one catalogue query per call until then).
        if self._have_cache is not None:
            return self._have_cache
        have = self._table_columns()
        if have >= FIELDS.keys():
            self._have_cache = have
        return have

    def _missing_filter(self, f: Filters) -> bool:
        have = self._have()
        return any(name not in have for name in f.as_dict() if name not in ("since", "until", "verdicts"))

    def recent(self, limit: int = 100, lane: str | None = None, since: float | None = None,
               conversation: str | None = None, filters: Filters | None = None) -> list[dict[str, Any]]:
        """Newest first, every column."""
        f = _merge(filters, lane, since, conversation)
        if self._missing_filter(f):
            return []  # filtering on a column this table does not have yet: nothing matches
        clause, args = where(f, self.MARK)
        sql = f"SELECT * FROM records{clause} ORDER BY ts DESC, id DESC LIMIT {self.MARK}"
        return self._query(sql, [*args, max(1, min(int(limit), 10_000))])

    def rows(self, since: float | None = None, lane: str | None = None, filters: Filters | None = None,
             columns: tuple[str, ...] = STATS_COLUMNS, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
        """The given columns of every record matching, oldest first (at most the newest `limit`)."""
        f = _merge(filters, lane, since, None)
        if self._missing_filter(f):
            return []
        clause, args = where(f, self.MARK)
        have = self._have()
        cols = ", ".join(f'"{c}"' if c in have else f'NULL AS "{c}"' for c in columns)
        sql = (f"SELECT * FROM (SELECT {cols}, id AS id_ FROM records{clause} ORDER BY ts DESC, id DESC "
               f"LIMIT {self.MARK}) AS newest ORDER BY ts, id_")
        out = self._query(sql, [*args, int(limit)])
        for r in out:
            r.pop("id_", None)
        return out

    def count(self) -> int:
        return int(self._query("SELECT COUNT(*) AS n FROM records", [])[0]["n"])

    # -- triage: acknowledge / mute ------------------------------------------------------------

    def triage_list(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        cols = ", ".join(f'"{c}"' for c in TRIAGE_COLUMNS)
        return self._query(f'SELECT {cols} FROM triage WHERE "until" > {self.MARK} ORDER BY created DESC',
                           [now])

    def triage_add(self, rule: dict[str, Any]) -> dict[str, Any]:
        rule = {**rule, "id": rule.get("id") or uuid.uuid4().hex[:12], "created": rule.get("created") or time.time()}
        cols = ", ".join(f'"{c}"' for c in TRIAGE_COLUMNS)
        marks = ", ".join(self.MARK for _ in TRIAGE_COLUMNS)
        self._exec(f"INSERT INTO triage ({cols}) VALUES ({marks})", [rule.get(c) for c in TRIAGE_COLUMNS])
        return {c: rule.get(c) for c in TRIAGE_COLUMNS}

    def triage_delete(self, rule_id: str) -> bool:
        before = len(self._query(f"SELECT id FROM triage WHERE id = {self.MARK}", [rule_id]))
        self._exec(f"DELETE FROM triage WHERE id = {self.MARK}", [rule_id])
        return before > 0


TRIAGE_DDL = ('CREATE TABLE IF NOT EXISTS triage (id TEXT PRIMARY KEY, kind TEXT NOT NULL, lane TEXT, cause TEXT, '
              'client TEXT, "until" {real} NOT NULL, created {real} NOT NULL, author TEXT, note TEXT)')


def _merge(filters: Filters | None, lane: str | None, since: float | None, conversation: str | None) -> Filters:
    f = filters or Filters()
    if lane:
        f = f.with_(lane=lane)
    if since is not None:
        f = f.with_(since=since)
    if conversation:
        f = f.with_(conversation=conversation)
    return f
