"""Records and metrics through real servers on loopback: emulator → gateway → records, /metrics, CLI.

- accuracy: at concurrency 1 the recorded time to first content byte and decode tok/s are within
  5% of what the emulator was told to do;
- agreement: the counters in /metrics equal the sums over the stored records;
- a scripted agent conversation gets the expected verdict turn by turn;
- `gateway stats` reads the same numbers from the file and from the running gateway;
- records reach a Redis stream when Redis is configured, and a dead Redis never fails a request.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import defaultdict
from typing import Any

import pytest

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import REPO, free_port, run_gateway
from tests.support.metrics import metric_samples
from tests.support.poll import wait_until
from tests.support.records import SENT, agent_turns, get_json, post, prompt_of, records, sent_since
from tests.support.redis_proc import run_redis
from tests.support.routes import emulator_lane, routes

TTFT_MS = 400.0
PREFILL_TPS = 4000.0
DECODE_TPS = 50.0


# -- accuracy -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def timed():
    knobs = dict(flavour="vllm", ttft_ms=TTFT_MS, prefill_tps=PREFILL_TPS, decode_tps=DECODE_TPS,
                 default_thinking=True, reasoning_tokens=12)
    with run_emulator(**knobs) as emu:
        with run_gateway(routes({"timed": emulator_lane(emu.url, limits={"max_top_logprobs": 5})},
                                {"timed-model": "timed"})) as gw:
            yield emu, gw


def test_ttft_and_decode_speed_within_5_percent_of_truth(timed) -> None:
    emu, gw = timed
    # Warm-up: the first analysis loads the tokenizer, which holds the GIL for a moment and would
    # delay the next stream's relay (a start-up cost, not a measuring error); let it finish first.
    assert post(gw.url, {"model": "timed-model", "messages": prompt_of(99), "max_tokens": 2})[0] == 200
    records(gw.url)
    n = 6
    mark = len(SENT[gw.url])
    for i in range(n):  # concurrency 1; every prompt new, so each pays a known prefill
        status, _ = post(gw.url, {"model": "timed-model", "messages": prompt_of(i), "stream": True,
                                  "max_tokens": 12 + 48})  # max_tokens counts the 12 reasoning tokens
        assert status == 200
    ids = sent_since(gw.url, mark)
    recs = [r for r in records(gw.url, ids) if r["request_id"] in ids]
    assert len(recs) == n
    ttft_err, decode_err = [], []
    for r in recs:
        uncached = r["prompt_tokens"] - (r["cached_tokens"] or 0)
        truth_ttft = TTFT_MS / 1000 + uncached / PREFILL_TPS
        ttft_err.append(r["ttft_s"] / truth_ttft - 1)
        decode_err.append(r["decode_tps"] / DECODE_TPS - 1)
        assert r["decode_source"] == "usage" and r["completion_tokens"] == 12 + 48
        assert r["reasoning_tokens"] == 12
        assert r["gap_p50_s"] == pytest.approx(1 / DECODE_TPS, rel=0.25)
        assert r["ttfb_s"] <= r["ttft_s"] and r["gateway_s"] < 0.05
    print(f"\nTTFT error per request: {[f'{e:+.2%}' for e in ttft_err]}"
          f"\ndecode error per request: {[f'{e:+.2%}' for e in decode_err]}")
    assert abs(statistics.median(ttft_err)) < 0.05
    assert abs(statistics.median(decode_err)) < 0.05
    # Single requests: a CPU-starved box (load 8 on 2 cores seen) delays some relays by tens of ms;
    # that delay is real (the client saw it too), so it gets a looser bound, always on the late side.
    assert all(-0.02 < e < 0.10 for e in ttft_err)
    assert all(abs(e) < 0.10 for e in decode_err)


def test_counters_in_metrics_agree_with_stored_records(timed) -> None:
    emu, gw = timed
    for i in range(4):
        post(gw.url, {"model": "timed-model", "messages": prompt_of(100 + i, 50), "stream": i % 2 == 0,
                      "max_tokens": 4})
    status, _ = post(gw.url, {"model": "timed-model", "messages": prompt_of(1, 5), "logprobs": True,
                              "top_logprobs": 10})
    assert status == 400  # the lane's top_logprobs limit
    status, _ = post(gw.url, {"model": "no-such-model", "messages": prompt_of(1, 5)})
    assert status == 404
    recs = records(gw.url)
    assert {r["request_id"] for r in recs} == set(SENT[gw.url])

    def counted() -> dict | None:
        # The metrics sink runs in the same aftermath pass as the records sink, after it.
        m = metric_samples(gw.url)
        return m if sum(m["gateway_requests_total"].values()) == len(recs) else None

    m = wait_until(counted, what="every recorded request counted in /metrics")

    def by(key: str, value_of) -> dict[tuple, float]:
        out: dict[tuple, float] = defaultdict(float)
        for r in recs:
            v = value_of(r)
            if v:
                out[key(r)] += v
        return dict(out)

    def lane_of(r: dict[str, Any]) -> str:
        return r["lane"] or "none"

    def status_class(r: dict[str, Any]) -> str:
        return "cancelled" if r["cancelled"] or r["status"] == 499 else f"{r['status'] // 100}xx"

    expected_requests = by(lambda r: (("lane", lane_of(r)), ("status_class", status_class(r))), lambda r: 1)
    # (every known label value is exported at 0 from the start: compare what was counted)
    assert {k: v for k, v in m["gateway_requests_total"].items() if v} == expected_requests
    for metric, field in (("gateway_prompt_tokens_total", "prompt_tokens"),
                          ("gateway_cached_tokens_reported_total", "cached_tokens"),
                          ("gateway_completion_tokens_total", "completion_tokens"),
                          ("gateway_cached_tokens_predicted_total", "predicted_cached_tokens")):
        expected = by(lambda r: (("lane", lane_of(r)),), lambda r, f=field: r[f])
        got = {k: v for k, v in m[metric].items() if v}
        assert got == expected, metric
    verdicts = by(lambda r: (("lane", lane_of(r)), ("verdict", r["verdict"])), lambda r: 1)
    assert {k: v for k, v in m["gateway_cache_verdicts_total"].items() if v} == verdicts
    rejections = by(lambda r: (("lane", lane_of(r)), ("limit", "max_top_logprobs")),
                    lambda r: r["status"] >= 400 and "max_top_logprobs" in (r["limits_fired"] or ""))
    assert m["gateway_limit_rejections_total"] == rejections
    streamed_ok = [r for r in recs if r["stream"] and r["status"] == 200]
    assert m["gateway_ttft_seconds_count"][(("lane", "timed"),)] == len(streamed_ok)
    assert m["gateway_ttft_seconds_sum"][(("lane", "timed"),)] == pytest.approx(sum(r["ttft_s"] for r in streamed_ok))
    decoded = [r for r in recs if r["decode_tps"] is not None]
    assert m["gateway_decode_tokens_per_second_count"][(("lane", "timed"),)] == len(decoded)
    assert m["gateway_inflight_requests"][(("lane", "timed"),)] == 0


def test_gateway_stats_cli_from_file_and_from_url(timed) -> None:
    emu, gw = timed
    post(gw.url, {"model": "timed-model", "messages": prompt_of(7, 20), "stream": True, "max_tokens": 8})
    recs = records(gw.url)
    cmd = [sys.executable, "-m", "gateway.cli", "stats", "--window", "1h", "--json"]
    from_file = json.loads(subprocess.run(cmd + ["--data-dir", str(gw.data_dir)], cwd=REPO, check=True,
                                          capture_output=True, text=True).stdout)
    from_url = json.loads(subprocess.run(cmd + ["--url", gw.url], cwd=REPO, check=True,
                                         capture_output=True, text=True).stdout)
    for stats in (from_file, from_url):
        assert stats["total"]["requests"] == len(recs)
        assert stats["lanes"]["timed"]["decode_tps_p50"] == pytest.approx(DECODE_TPS, rel=0.05)
    table = subprocess.run([sys.executable, "-m", "gateway.cli", "stats", "--data-dir", str(gw.data_dir)],
                           cwd=REPO, check=True, capture_output=True, text=True).stdout
    assert "timed" in table and "tok/s" in table and "ttft p50" in table
    print("\n" + table)


# -- a scripted agent conversation -------------------------------------------------------------

@pytest.fixture(scope="module")
def agent():
    with run_emulator(flavour="vllm", tokenizer="dsv41", default_thinking=True, reasoning_tokens=6) as emu:
        with run_gateway(routes({"agent-lane": emulator_lane(emu.url)}, {"agent": "agent-lane"})) as gw:
            yield emu, gw


def check_verdicts(recs: list[dict[str, Any]], gw_url: str) -> None:
    # The first turn is cold, or a hit on the tools another conversation of this module left on the replica.
    first = recs[0]
    assert first["verdict"] == "cold" or (first["verdict"] == "hit" and first["cause"] == "shared_prefix"), first
    assert [r["verdict"] for r in recs[1:]] == ["hit", "drift", "hit", "eviction"]
    assert len({r["conversation"] for r in recs}) == 1 and recs[0]["conversation_source"]
    drift = recs[2]
    assert drift["cause"] and drift["divergence_message_index"] == 0 and drift["tokens_lost"] > 0
    for r in (recs[1], recs[3]):
        assert r["cached_tokens"] >= r["predicted_cached_tokens"] > 0
    assert recs[4]["cached_tokens"] == 0 and recs[4]["tokens_lost"] == recs[4]["predicted_cached_tokens"] > 0


def test_scripted_conversation_verdicts_turn_by_turn(agent) -> None:
    pytest.importorskip("gateway.conversations.feature", reason="the conversations part is not in this checkout")
    emu, gw = agent
    recs = agent_turns(gw.url, emu, "agent-conv-1", settle=True)
    check_verdicts(recs, gw.url)
    assert [r["turn"] for r in recs] == [1, 2, 3, 4, 5]
    drift = recs[2]
    stats = get_json(gw.url + "/admin/api/stats?window_s=3600")["lanes"]["agent-lane"]
    assert stats["verdicts"] == {"cold": 1, "hit": 2, "drift": 1, "eviction": 1}
    assert stats["drift_tokens_lost_by_cause"] == {drift["cause"]: drift["tokens_lost"]}
    assert stats["eviction_tokens_lost"] == recs[4]["tokens_lost"]


def test_back_to_back_turns_get_the_same_verdicts(agent) -> None:
    """An agent sends its next turn the moment the answer ends, before that turn's analysis is done."""
    pytest.importorskip("gateway.conversations.feature", reason="the conversations part is not in this checkout")
    emu, gw = agent
    recs = agent_turns(gw.url, emu, "agent-conv-2", settle=False)
    check_verdicts(recs, gw.url)


def test_back_to_back_turns_are_numbered(agent) -> None:
    pytest.importorskip("gateway.conversations.feature", reason="the conversations part is not in this checkout")
    emu, gw = agent
    recs = agent_turns(gw.url, emu, "agent-conv-3", settle=False)
    assert [r["turn"] for r in recs] == [1, 2, 3, 4, 5]


# -- Redis --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_port():
    with run_redis() as port:
        yield port


def test_records_reach_a_bounded_redis_stream(redis_port: int) -> None:
    import redis

    client = redis.Redis(port=redis_port)
    client.delete("gateway:records")
    env = {"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "GATEWAY_RECORDS_STREAM_MAXLEN": "1000"}
    with run_emulator(flavour="sglang") as emu:
        with run_gateway(routes({"r": emulator_lane(emu.url, engine="sglang")}, {"m": "r"}), env=env) as gw:
            mark = len(SENT[gw.url])
            for i in range(5):
                assert post(gw.url, {"model": "m", "messages": prompt_of(i, 10), "max_tokens": 3})[0] == 200
            recs = records(gw.url, sent_since(gw.url, mark))
            wait_until(lambda: client.xlen("gateway:records") >= 5, what="the records in the Redis stream")
            entries = client.xrange("gateway:records")
    assert len(entries) == 5
    stream_ids = [json.loads(fields[b"r"])["request_id"] for _, fields in entries]
    assert stream_ids == [r["request_id"] for r in recs]


def test_a_dead_redis_never_fails_a_request() -> None:
    dead = free_port()  # nothing listens here
    env = {"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{dead}/0"}
    with run_emulator(flavour="vllm") as emu:
        with run_gateway(routes({"r": emulator_lane(emu.url)}, {"m": "r"}), env=env) as gw:
            mark = len(SENT[gw.url])
            for i in range(3):
                assert post(gw.url, {"model": "m", "messages": prompt_of(i, 10), "max_tokens": 3})[0] == 200
            assert len(records(gw.url, sent_since(gw.url, mark))) == 3  # SQLite still has them
            errors = wait_until(lambda: metric_samples(gw.url)["gateway_records_total"].get(
                (("outcome", "errors"), ("store", "redis")), 0), what="the Redis write errors counted")
            assert errors >= 1
            assert gw.log().count("records to Redis stream") == 1  # logged once, not per batch


# -- several worker processes ---------------------------------------------------------------------

def test_two_workers_share_the_records_file_and_sum_their_counters(tmp_path) -> None:
    """--workers 2: both processes write one SQLite file; with PROMETHEUS_MULTIPROC_DIR set, /metrics
    sums the counters of both, whichever worker answers the scrape."""
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(prom_dir)}
    with run_emulator(flavour="vllm", decode_tps=2000) as emu:
        with run_gateway(routes({"w": emulator_lane(emu.url)}, {"m": "w"}), env=env, workers=2) as gw:
            n = 24
            for i in range(n):
                assert post(gw.url, {"model": "m", "messages": prompt_of(i, 10), "stream": True,
                                     "max_tokens": 5})[0] == 200
            recs = records(gw.url)
            assert len(recs) == n
            scraped: list = []

            def summed_by_every_scrape() -> bool:
                scraped[:] = [metric_samples(gw.url) for _ in range(4)]
                return all(m["gateway_requests_total"].get((("lane", "w"), ("status_class", "2xx")), 0) == n
                           for m in scraped)

            wait_until(summed_by_every_scrape, what=f"{n} requests in every worker's /metrics")
            assert scraped[0]["gateway_ttft_seconds_count"][(("lane", "w"),)] == n
