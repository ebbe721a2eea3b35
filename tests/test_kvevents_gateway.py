"""The gateway with a lane whose replica's KV events come from a real ZMQ publisher on loopback
(speaking as vLLM does): GET /admin/api/kv and metrics show the stream, its loss, and its return."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.kv_publisher import Publisher, stored


def until(fn, timeout: float = 15.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out: {what}")


@pytest.fixture
def publisher():
    pub = Publisher(topic="kv")
    yield pub
    pub.terminate()


def test_stream_state_is_visible_and_loss_degrades(publisher):
    with run_emulator(flavour="vllm", tokenizer="dsv41", block_size=16) as emu:
        lane = {"engine": "vllm", "replicas": [emu.url], "upstream_model": "deepseek-v4-flash",
                "qualification": "not_required", "cache": {"block_size": 16},
                "kv_events": {"replicas": {emu.url: {"endpoint": publisher.endpoint, "replay": publisher.replay_endpoint,
                                                     "topic": "kv", "pool_tokens": 4096}}}}
        with run_gateway({"lanes": {"ds": lane}, "models": {"ds": "ds"}}) as gw:
            def replica():
                return httpx.get(f"{gw.url}/admin/api/kv").json()["replicas"][0]

            until(lambda: replica()["stream"]["state"] == "live", what="live")

            def applied():
                publisher.publish([stored([b"h1", b"h2"], None, list(range(32)), 16)])
                return replica()["held_tokens"] == 32

            until(applied, what="events applied")
            r = replica()
            assert r["pool_tokens"] == 4096 and r["pool_source"] == "config" and r["occupancy"] == round(32 / 4096, 4)
            assert r["index"]["held_blocks"] == 2 and r["index"]["approx_bytes"] > 0
            metrics = httpx.get(f"{gw.url}/metrics").text
            assert f'gateway_kv_stream_up{{lane="ds",replica="{emu.url}"}} 1.0' in metrics
            assert f'gateway_kv_held_tokens{{lane="ds",replica="{emu.url}"}} 32.0' in metrics

            publisher.close()  # the engine goes away
            until(lambda: replica()["stream"]["state"] == "lost", what="lost")
            metrics = httpx.get(f"{gw.url}/metrics").text
            assert f'gateway_kv_stream_up{{lane="ds",replica="{emu.url}"}} 0.0' in metrics
            # Requests still work, with today's count-based verdicts and a note saying why.
            out = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                             json={"model": "ds", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert out.status_code == 200

            def kv_note():
                rows = httpx.get(f"{gw.url}/admin/api/records", params={"limit": 5}).json()["records"]
                return next((row["kv"] for row in rows if row.get("kv")), None)

            note = until(kv_note, what="a record with the kv note")
            assert '"stream":"lost"' in note and "counts only" in note
            stats = subprocess.run([sys.executable, "-m", "gateway.cli", "stats", "--url", gw.url],
                                   capture_output=True, text=True, timeout=60)
            assert stats.returncode == 0, stats.stderr
            assert "KV pools" in stats.stdout and "! stream lost" in stats.stdout, stats.stdout

            publisher.bind()  # back on the same ports
            until(lambda: replica()["stream"]["state"] == "live", what="live again")
            assert replica()["stream"]["disconnects"] >= 1
