"""Records without servers: the record builder, summaries, the SQLite store, the Redis stream."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from gateway.records.record import FIELDS, build_record, decode_speed, gap_percentiles, quantile
from gateway.records.stats import (compute_stats, decode_histogram, format_table, lost_by_cause, parse_window,
                                   series)
from gateway.records.store_redis import RedisRecordStream
from gateway.records.store_sqlite import FILENAME, RecordReader, SQLiteStore
from gateway.core.verdict import CacheVerdict
from tests.support.emulator_proc import free_port
from tests.support.exchanges import exchange


# -- the record -------------------------------------------------------------------------------

def test_record_timings_and_decode_speed() -> None:
    rec = build_record(exchange())
    assert set(rec) == set(FIELDS)
    assert rec["ttft_s"] == pytest.approx(0.1)
    assert rec["ttfb_s"] == pytest.approx(0.05)
    assert rec["gateway_s"] == pytest.approx(0.002)
    assert rec["total_s"] == pytest.approx(0.35)
    assert rec["decode_tps"] == pytest.approx(50.0)  # (11 - 1) / 0.2 s
    assert rec["decode_source"] == "usage"
    assert rec["gap_p50_s"] == pytest.approx(0.02) and rec["gap_p99_s"] == pytest.approx(0.02)
    assert rec["chunks"] == 11


def test_record_decode_falls_back_to_chunk_count_without_usage() -> None:
    rec = build_record(exchange(usage=None))
    assert rec["decode_source"] == "chunks" and rec["decode_tps"] == pytest.approx(50.0)
    assert rec["prompt_tokens"] is None and rec["cached_tokens"] is None


def test_decode_speed_edge_cases() -> None:
    assert decode_speed(None, None, 10, 10) == (None, None)
    assert decode_speed(1.0, 1.0, 10, 1) == (None, None)  # non-streaming: no span
    assert decode_speed(1.0, 2.0, 1, 1) == (None, None)
    assert decode_speed(1.0, 2.0, 21, 5) == (20.0, "usage")  # usage wins over the chunk count
    assert gap_percentiles([1.0]) == (None, None)
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def test_cached_tokens_reported_zero_is_not_missing() -> None:
    zero = build_record(exchange(usage={"prompt_tokens": 10, "completion_tokens": 2,
                                        "prompt_tokens_details": {"cached_tokens": 0}}))
    missing = build_record(exchange(usage={"prompt_tokens": 10, "completion_tokens": 2,
                                           "prompt_tokens_details": None}))
    assert zero["cached_tokens"] == 0
    assert missing["cached_tokens"] is None


def test_reasoning_tokens_openai_and_sglang_shapes() -> None:
    openai_shape = {"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 4}}
    sglang_shape = {"completion_tokens": 9, "reasoning_tokens": 5}
    assert build_record(exchange(usage=openai_shape))["reasoning_tokens"] == 4
    assert build_record(exchange(usage=sglang_shape))["reasoning_tokens"] == 5


def test_cache_verdict_from_exchange_or_unknown() -> None:
    assert build_record(exchange())["verdict"] == "unknown"
    ex = exchange()
    ex.cache = CacheVerdict("drift", predicted_cached_tokens=900, cause="system_prompt_edited",
                            divergence_message_index=0, divergence_field="content", tokens_lost=300,
                            seconds_lost=0.5, rendered_prompt_tokens=1000, render="exact")
    rec = build_record(ex)
    assert (rec["verdict"], rec["cause"], rec["divergence_message_index"], rec["tokens_lost"]) == \
        ("drift", "system_prompt_edited", 0, 300)
    assert rec["predicted_cached_tokens"] == 900 and rec["render"] == "exact"


def test_no_text_is_stored_by_default_but_capture_mode_keeps_a_capped_copy() -> None:
    rec = build_record(exchange(effort_requested="high", effort_applied=50, limits_fired=["max_images"]))
    flat = json.dumps(rec)
    assert "secret" not in flat and "private prompt" not in flat
    assert rec["output_chars"] == len("secret answer") and rec["output_hash"]
    assert rec["messages"] == 1 and rec["capture"] is None
    assert rec["effort_requested"] == "high" and rec["effort_applied"] == "50"
    assert json.loads(rec["limits_fired"]) == ["max_images"]
    captured = json.loads(build_record(exchange(), capture_max_bytes=60)["capture"])
    assert captured["request_truncated"] and len(captured["request"]) <= 60
    assert "secret answer" in captured["output"] and not captured["output_truncated"]


# -- summaries --------------------------------------------------------------------------------

def rows_for_stats(now: float) -> list[dict]:
    rows = []
    for i in range(10):
        rows.append({"ts": now - 50 + i, "lane": "a", "status": 200, "stream": 1, "ttft_s": 0.1 * (i + 1),
                     "decode_tps": 40.0 + i, "prompt_tokens": 1000, "cached_tokens": 500 if i < 5 else None,
                     "verdict": "hit" if i < 5 else "drift", "cause": None if i < 5 else "effort_changed",
                     "tokens_lost": 0 if i < 5 else 100, "seconds_lost": 0.0 if i < 5 else 0.1})
    rows.append({"ts": now - 10, "lane": "b", "status": 502, "stream": 1, "ttft_s": None, "decode_tps": None,
                 "prompt_tokens": None, "cached_tokens": None, "verdict": "eviction", "tokens_lost": 70})
    rows.append({"ts": now - 5, "lane": "b", "status": 499, "cancelled": 1, "stream": 1})
    return rows


def test_compute_stats_per_lane() -> None:
    now = time.time()
    s = compute_stats(rows_for_stats(now), 60, now)
    a, b = s["lanes"]["a"], s["lanes"]["b"]
    assert a["requests"] == 10 and a["errors"] == 0
    assert a["ttft_p50_s"] == pytest.approx(0.55)
    assert a["ttft_p95_s"] == pytest.approx(quantile([0.1 * (i + 1) for i in range(10)], 0.95))
    assert a["decode_tps_p50"] == pytest.approx(44.5)
    # Lane a reports cached tokens, so its nulls mean 0 (SGLang's shape): 2500 of 10000 tokens.
    assert a["cache_hit_ratio"] == pytest.approx(0.25)
    # Lane b never reported a count: no ratio rather than a made-up 0%.
    assert b["cache_hit_ratio"] is None
    assert a["drift_tokens_lost_by_cause"] == {"effort_changed": 500}
    assert b["errors"] == 1 and b["cancelled"] == 1 and b["eviction_tokens_lost"] == 70
    assert s["total"]["requests"] == 12
    table = format_table(s)
    assert "ALL" in table and "effort_changed" in table and "25.0%" in table


def test_series_histogram_and_causes() -> None:
    now = time.time()
    rows = rows_for_stats(now)
    ser = series(rows, 60, buckets=6, now=now)
    assert len(ser["t"]) == 6 and set(ser["lanes"]) == {"a", "b"}
    assert sum(ser["lanes"]["a"]["requests"]) == 10
    assert ser["lanes"]["a"]["hit_ratio"][1] == pytest.approx(0.25)  # ts now-50..now-41 fall in bucket 1
    assert ser["lanes"]["b"]["hit_ratio"] == [None] * 6
    hist = decode_histogram(rows)
    assert sum(hist["lanes"]["a"]) == 10
    assert hist["edges"][0] <= 40 and hist["edges"][-1] > 49
    causes = lost_by_cause(rows)["causes"]
    assert [c["cause"] for c in causes] == ["effort_changed", "eviction"]
    assert causes[0]["by_lane"] == {"a": 500}


def test_parse_window() -> None:
    assert parse_window("90s") == 90 and parse_window("15m") == 900
    assert parse_window("2h") == 7200 and parse_window("7d") == 7 * 86400 and parse_window("30") == 30
    with pytest.raises(ValueError):
        parse_window("soon")


# -- SQLite -----------------------------------------------------------------------------------

def test_sqlite_store_writes_in_batches_and_reads_back(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    store.open()
    try:
        for i in range(50):
            store.put(build_record(exchange(request_id=f"r{i}", lane="a" if i % 2 else "b")))
        assert store.flush(5.0)
        assert store.written == 50 and store.count() == 50
        recent = store.recent(5)
        assert [r["request_id"] for r in recent] == ["r49", "r48", "r47", "r46", "r45"]
        assert all(r["lane"] == "a" for r in store.recent(100, lane="a")) and len(store.recent(100, lane="a")) == 25
        rows = store.rows(time.time() - 60)
        assert len(rows) == 50 and rows[0]["ttft_s"] == pytest.approx(0.1)
        # Another process (gateway stats) reads the same file read-only while the writer runs.
        assert RecordReader(tmp_path / FILENAME, readonly=True).count() == 50
    finally:
        store.close()


def test_a_batch_of_any_size_is_written_whole_and_in_order(tmp_path: Path) -> None:
    # Statements of 64, 8 and 1 rows: 137 = 2 x 64 + 8 + 1; a record missing columns is written with NULLs.
    store = SQLiteStore(tmp_path, flush_interval_s=60)
    store.open()
    try:
        sent = []
        for i in range(137):
            record = build_record(exchange(request_id=f"r{i}", lane=f"l{i % 3}"))
            if i == 70:
                record = {"ts": record["ts"], "request_id": "r70"}
            sent.append(record)
            store.put(record)
        assert store.flush(5.0)
        assert store.written == 137 and store.errors == 0
        back = store.rows(0, columns=("request_id", "lane", "ts"))
        assert [r["request_id"] for r in back] == [r["request_id"] for r in sent]
        assert [r["lane"] for r in back] == [r.get("lane") for r in sent]
    finally:
        store.close()


def test_the_records_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    store.open()
    try:
        store.put(build_record(exchange(request_id="r0")))
        assert store.flush(5.0)
        for path in tmp_path.glob(FILENAME + "*"):
            assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
    finally:
        store.close()


def test_a_null_upstream_code_is_recorded_as_none() -> None:
    ex = exchange(request_id="r1")
    ex.fail(502, None, "upstream said nothing")
    assert build_record(ex)["error_code"] is None
    ex.fail(502, 1234, "numbered")
    assert build_record(ex)["error_code"] == "1234"


def test_sqlite_retention_by_age_and_rows(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path, max_age_s=3600, max_rows=10)
    store.open()
    old = build_record(exchange(request_id="old"))
    old["ts"] = time.time() - 7200
    store.put(old)
    for i in range(15):
        store.put(build_record(exchange(request_id=f"n{i}")))
    store.flush()
    store.close()
    store = SQLiteStore(tmp_path, max_age_s=3600, max_rows=10)
    store.open()  # prunes on open (and every minute after)
    try:
        ids = [r["request_id"] for r in store.recent(100)]
        assert "old" not in ids and len(ids) == 10 and ids[0] == "n14" and ids[-1] == "n5"
    finally:
        store.close()


def test_sqlite_adds_new_columns_to_an_older_file(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / FILENAME)
    conn.execute("CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, lane TEXT)")
    conn.execute("INSERT INTO records (ts, lane) VALUES (?, 'legacy')", (time.time(),))
    conn.commit()
    conn.close()
    store = SQLiteStore(tmp_path)
    store.open()
    try:
        store.put(build_record(exchange()))
        store.flush()
        lanes = [r["lane"] for r in store.recent(10)]
        assert lanes == ["lane-a", "legacy"]
    finally:
        store.close()


def test_sqlite_put_never_blocks_when_the_queue_is_full(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path, max_queue=5)  # not opened: nothing drains the queue
    t0 = time.perf_counter()
    for _ in range(20):
        store.put({"ts": time.time()})
    assert time.perf_counter() - t0 < 0.1
    assert store.dropped == 15


# -- Redis ------------------------------------------------------------------------------------

async def test_redis_stream_is_bounded_and_readable(redis_url: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url)
    stream = RedisRecordStream(lambda: client, key="test:records", maxlen=100)
    try:
        await client.delete("test:records")
        for i in range(1000):
            stream.put(build_record(exchange(request_id=f"r{i}", lane="a" if i % 2 else "b")))
        await stream.flush()
        assert stream.written == 1000 and stream.errors == 0
        length = await client.xlen("test:records")
        assert 100 <= length < 1000  # MAXLEN ~ trims in whole macro-nodes
        recent = await stream.recent(3, lane="a")
        assert [r["request_id"] for r in recent] == ["r999", "r997", "r995"]
    finally:
        await client.aclose()


async def test_redis_failures_are_counted_not_raised() -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    stream = RedisRecordStream(lambda: client, key="x")
    stream.put({"ts": 1.0})
    stream.put({"ts": 2.0})
    await stream.flush()
    assert stream.errors == 1 and stream.dropped == 2 and stream.written == 0
    await client.aclose()


# -- who is costing us prefill -------------------------------------------------------------------

def test_costs_rank_causes_clients_tenants_and_conversations() -> None:
    from gateway.records.stats import costs, format_costs

    now = 1_800_000_000.0
    def r(ts, verdict, cause, tokens, client, tenant="default", conv="c1"):
        return {"ts": now - ts, "verdict": verdict, "cause": cause, "tokens_lost": tokens,
                "seconds_lost": tokens / 4000, "client": client, "tenant": tenant, "conversation": conv, "lane": "a"}
    rows = [r(3000, "drift", "tools_changed", 40_000, "opencode", conv="c1"),
            r(2000, "drift", "tools_changed", 20_000, "opencode", conv="c2"),
            r(1000, "eviction", None, 30_000, "aider", tenant="acme", conv="c3"),
            r(500, "cold", "rehomed", 5_000, "aider", tenant="acme", conv="c3"),
            r(100, "hit", None, 0, "aider"), r(50, "drift", "history_edited", 0, "x")]
    c = costs(rows, 3600, buckets=6, now=now)
    assert c["total"] == {"tokens": 95_000, "seconds": 23.75, "turns": 4}
    assert [(x["cause"], x["tokens"]) for x in c["by_cause"]] == [("tools_changed", 60_000), ("eviction", 30_000),
                                                                 ("rehomed", 5_000)]
    assert [(x["client"], x["tokens"], x["conversations"], x["top_cause"]) for x in c["by_client"]] == [
        ("opencode", 60_000, 2, "tools_changed"), ("aider", 35_000, 1, "eviction")]
    assert c["by_tenant"][0]["tenant"] == "default" and c["by_tenant"][1]["tenant"] == "acme"
    top = c["top_conversations"][0]
    assert top["conversation"] == "c1" and top["client"] == "opencode" and top["lane"] == "a"
    assert sum(c["by_cause"][0]["series"]) == 60_000 and len(c["t"]) == c["buckets"]
    text = format_costs(c)
    assert "95.0K tokens" in text and "top clients" in text and "opencode" in text and "mostly tools_changed" in text
    assert format_costs(costs([], 3600, now=now)) == "no prefill lost in this window"


def test_a_newer_reader_on_an_older_file_reads_missing_columns_as_null(tmp_path: Path) -> None:
    """`gateway stats` upgraded before the gateway: the file lacks tenant/client; nothing fails."""
    conn = sqlite3.connect(tmp_path / FILENAME)
    conn.execute("CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, lane TEXT, verdict TEXT)")
    conn.execute("INSERT INTO records (ts, lane, verdict) VALUES (?, 'legacy', 'hit')", (time.time(),))
    conn.commit()
    conn.close()
    from gateway.records.query import Filters

    reader = RecordReader(tmp_path / FILENAME, readonly=True)
    rows = reader.rows(time.time() - 60)
    assert len(rows) == 1 and rows[0]["lane"] == "legacy" and rows[0]["client"] is None
    assert reader.rows(filters=Filters(client="opencode", since=time.time() - 60)) == []
    assert compute_stats(rows, 60)["lanes"]["legacy"]["requests"] == 1
