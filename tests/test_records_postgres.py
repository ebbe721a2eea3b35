"""Records in PostgreSQL without a gateway: the store against the machine's server (a fresh database
per test) and against a private server that is stopped and started again under it."""

from __future__ import annotations

import time

import pytest

from gateway.records.query import Filters
from gateway.records.record import build_record
from gateway.records.store_postgres import PostgresReader, PostgresStore, redact
from tests.support.poll import wait_until
from tests.support.postgres_proc import fresh_database, run_private_postgres
from tests.support.exchanges import exchange


@pytest.fixture
def pg_url():
    with fresh_database() as url:
        yield url


def test_postgres_store_writes_batches_and_reads_back_with_filters(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.open()
    try:
        for i in range(60):
            ex = exchange(request_id=f"r{i}", lane="a" if i % 2 else "b",
                          request_headers={"user-agent": "opencode/0.5.1 ai-sdk/4" if i % 3 else "OpenAI/Python 1.2"})
            store.put(build_record(ex))
        assert store.flush(10.0)
        assert store.written == 60 and store.count() == 60 and store.errors == 0
        assert [r["request_id"] for r in store.recent(3)] == ["r59", "r58", "r57"]
        assert len(store.recent(100, lane="a")) == 30
        assert {r["client"] for r in store.recent(100, filters=Filters(client="opencode"))} == {"opencode"}
        assert len(store.recent(100, filters=Filters(user_agent="Python 1.2"))) == 20
        assert len(store.recent(100, filters=Filters(user_agent="100%_"))) == 0  # LIKE wildcards are literal
        rows = store.rows(time.time() - 60)
        assert len(rows) == 60 and rows[0]["ttft_s"] == pytest.approx(0.1) and rows[0]["tenant"] == "default"
        # Another gateway (or `gateway stats`) reads the same table.
        assert PostgresReader(pg_url).count() == 60
    finally:
        store.close()


def test_postgres_retention_by_age_and_rows(pg_url: str) -> None:
    store = PostgresStore(pg_url, max_age_s=3600, max_rows=10)
    store.open()
    try:
        old = build_record(exchange(request_id="old"))
        old["ts"] = time.time() - 7200
        store.put(old)
        for i in range(15):
            store.put(build_record(exchange(request_id=f"n{i}")))
        assert store.flush(10.0)
        store.prune()
        ids = [r["request_id"] for r in store.recent(100)]
        assert "old" not in ids and len(ids) == 10 and ids[0] == "n14" and ids[-1] == "n5"
    finally:
        store.close()


def test_triage_rules_live_in_the_database(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.open()
    try:
        wait_until(lambda: store.connected, what="the writer to create the schema")
        rule = store.triage_add({"kind": "mute", "lane": "a", "cause": "tools_changed", "client": "opencode",
                                 "until": time.time() + 60, "note": "known, fixed in 0.6"})
        expired = store.triage_add({"kind": "ack", "lane": "a", "cause": "x", "client": "*", "until": time.time() - 1})
        other = PostgresReader(pg_url)  # a second gateway sees the same triage
        assert [r["id"] for r in other.triage_list()] == [rule["id"]]
        assert store.triage_delete(rule["id"]) and not store.triage_delete(expired["id"] + "x")
        assert other.triage_list() == []
    finally:
        store.close()


def test_redact_hides_the_password() -> None:
    assert redact("postgresql://u:secret@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert redact("postgresql://u@db/x") == "postgresql://u@db/x"


def test_database_down_queues_bounded_then_catches_up() -> None:
    with run_private_postgres() as pg:
        store = PostgresStore(pg.url, max_queue=50, flush_interval_s=0.05)
        store.open()
        try:
            store.put(build_record(exchange(request_id="before")))
            assert store.flush(10.0) and store.written == 1
            pg.stop()
            for i in range(80):  # more than the queue holds
                store.put(build_record(exchange(request_id=f"down{i}")))
            wait_until(lambda: store.errors >= 1 and not store.connected, what="the writer to notice")
            assert store.dropped == 30 and store.queued == 50  # the oldest 30 went, counted
            assert not store.flush(0.3)  # nothing can be written while it is down
            pg.start()
            assert store.flush(30.0), store.last_error
            ids = {r["request_id"] for r in store.recent(200)}
            assert "before" in ids and "down79" in ids and "down29" not in ids and len(ids) == 51
            assert store.written == 51 and store.connected
        finally:
            store.close()


def test_a_reader_of_a_fresh_database_sees_no_records_not_an_error(pg_url: str) -> None:
    """`/admin/api/stats` at a gateway's start, before its writer made the table: nothing yet (it was a 503)."""
    reader = PostgresReader(pg_url)
    try:
        assert reader.recent(10) == [] and reader.count() == 0 and reader.rows(time.time() - 60) == []
        assert reader.triage_list() == []
    finally:
        reader.close_reader()
