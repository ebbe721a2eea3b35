"""The gateway with a lane whose replica's KV events come from a real ZMQ publisher on loopback
(speaking as vLLM does): GET /admin/api/kv and metrics show the stream, its loss, and its return."""

from __future__ import annotations

import contextlib

import json
import subprocess
import sys

import httpx
import pytest

from tests.support.emulator_proc import KV_EMULATOR, run_emulator, run_kv_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.kv_publisher import Publisher, stored
from tests.support.poll import wait_until
from tests.support.routes import emulator_lane, kv_lane, routes


@pytest.fixture
def publisher():
    pub = Publisher(topic="kv")
    yield pub
    pub.terminate()


def test_stream_state_is_visible_and_loss_degrades(publisher):
    with run_emulator(flavour="vllm", tokenizer="dsv41", block_size=16) as emu:
        kv = {"endpoint": publisher.endpoint, "replay": publisher.replay_endpoint, "topic": "kv", "pool_tokens": 4096}
        with run_gateway(routes({"ds": emulator_lane(emu.url, kv_events={"replicas": {emu.url: kv}})})) as gw:
            def replica():
                return httpx.get(f"{gw.url}/admin/api/kv").json()["replicas"][0]

            wait_until(lambda: replica()["stream"]["state"] == "live", what="live")

            def applied():
                publisher.publish([stored([b"h1", b"h2"], None, list(range(32)), 16)])
                return replica()["held_tokens"] == 32

            wait_until(applied, what="events applied")
            r = replica()
            assert r["pool_tokens"] == 4096 and r["pool_source"] == "config" and r["occupancy"] == round(32 / 4096, 4)
            assert r["index"]["held_blocks"] == 2 and r["index"]["approx_bytes"] > 0
            metrics = httpx.get(f"{gw.url}/metrics").text
            assert f'gateway_kv_stream_up{{lane="ds",replica="{emu.url}"}} 1.0' in metrics
            assert f'gateway_kv_held_tokens{{lane="ds",replica="{emu.url}"}} 32.0' in metrics

            publisher.close()  # the engine goes away
            wait_until(lambda: replica()["stream"]["state"] == "lost", what="lost")
            metrics = httpx.get(f"{gw.url}/metrics").text
            assert f'gateway_kv_stream_up{{lane="ds",replica="{emu.url}"}} 0.0' in metrics
            # Requests still work, with today's count-based verdicts and a note saying why.
            out = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                             json={"model": "ds", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert out.status_code == 200

            def kv_note():
                rows = httpx.get(f"{gw.url}/admin/api/records", params={"limit": 5}).json()["records"]
                return next((row["kv"] for row in rows if row.get("kv")), None)

            note = wait_until(kv_note, what="a record with the kv note")
            assert '"stream":"lost"' in note and "counts only" in note
            stats = subprocess.run([sys.executable, "-m", "gateway.cli", "stats", "--url", gw.url],
                                   capture_output=True, text=True, timeout=60)
            assert stats.returncode == 0, stats.stderr
            assert "KV pools" in stats.stdout and "! stream lost" in stats.stdout, stats.stdout

            publisher.bind()  # back on the same ports
            wait_until(lambda: replica()["stream"]["state"] == "live", what="live again")
            assert replica()["stream"]["disconnects"] >= 1


def test_emulated_replica_publishes_events_and_verdicts_name_the_displacer():
    """The emulator publishes its prefix cache's events as vLLM does; two conversations that do not fit its
    pool together take turns: the index matches its cached-token reports and evictions name the other one."""
    with run_kv_emulator(**KV_EMULATOR, cache_blocks=160) as (emu, kv):
        with run_gateway(routes({"ds": kv_lane(emu.url, {emu.url: {**kv, "pool_tokens": 160 * 16}})})) as gw:
            wait_until(lambda: httpx.get(f"{gw.url}/admin/api/kv").json()["replicas"][0]["stream"]["state"] == "live",
                  what="live")
            history = {name: [{"role": "system", "content": f"[{name}] " + " ".join(f"w{name}{i}" for i in range(300))}]
                       for name in ("a", "b")}
            rows = []
            for rnd in range(4):
                for name, msgs in history.items():
                    words = " ".join(f"x{name}{rnd}{i}" for i in range(120))
                    msgs.append({"role": "user", "content": f"round {rnd}: " + words})
                    r = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30, headers={"X-Conversation-Id": name},
                                   json={"model": "ds", "messages": msgs, "max_tokens": 8})
                    assert r.status_code == 200, r.text
                    msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                    turn = int(r.headers["x-gateway-conversation"].split("turn=")[1].split(";")[0])
                    cid = r.headers["x-gateway-conversation"].split(";")[0]

                    def rec(cid=cid, turn=turn):
                        rows_ = httpx.get(f"{gw.url}/admin/api/records", params={"conversation": cid}).json()["records"]
                        return next((x for x in rows_ if x["turn"] == turn and x.get("kv")), None)

                    row = wait_until(rec, what=f"record of {name} turn {turn}")
                    rows.append((name, cid, row, json.loads(row["kv"])))
            names = {cid: name for name, cid, _, _ in rows}
            for name, _cid, row, kv in rows:
                assert kv["held_tokens"] == row["cached_tokens"], (name, row, kv)
            misses = [(name, row, kv) for name, _, row, kv in rows if row["verdict"] == "eviction"]
            assert misses, [(n, r["verdict"], r["cached_tokens"], r["predicted_cached_tokens"]) for n, _, r, _ in rows]
            for name, row, kv in misses:
                assert kv["cause"] == "pool_pressure" and row["cause"] == "pool_pressure", kv
                assert names[kv["displaced_by"][0]["conversation"]] != name, kv


@contextlib.contextmanager
def _two_pools(gateway: dict | None = None, env: dict[str, str] | None = None):
    """Two emulated vLLM replicas publishing KV events, behind one gateway routing by what the pools hold."""
    with contextlib.ExitStack() as stack:
        emus, kv = [], {}
        for _ in range(2):
            emu, published = stack.enter_context(run_kv_emulator(**KV_EMULATOR))
            emus.append(emu)
            kv[emu.url] = {**published, "pool_tokens": 1 << 20}
        lane = kv_lane([e.url for e in emus], kv, routing="conversation_affinity",
                       affinity={"prefix_source": "kv_events"})
        with run_gateway(routes({"ds": lane}, **(gateway or {})), env=env) as gw:
            admin = {"Authorization": f"Bearer {env['KV_ADMIN']}"} if env else {}
            wait_until(lambda: all(r["stream"]["state"] == "live"
                              for r in httpx.get(f"{gw.url}/admin/api/kv", headers=admin).json()["replicas"]),
                  what="live")
            yield gw, emus, admin


SHARED = [{"role": "system", "content": "You are a careful agent. " + " ".join(f"s{i}" for i in range(6000))},
          {"role": "user", "content": "Read the repository and summarise it. " + " ".join(f"u{i}" for i in range(200))}]


def test_routing_reveals_nothing_across_tenants():
    """Tenant B sending tenant A's long prompt is placed as any newcomer and told so (`least_loaded`);
    tenant A's own next conversation with that prompt follows it (`prefix`)."""
    keys = {"KV_CLIENT_KEYS": "sk-tenant-a-0123456789,sk-tenant-b-0123456789", "KV_ADMIN": "kv-admin-0123456789abcdef"}
    with _two_pools({"client_keys": {"env": "KV_CLIENT_KEYS"}, "admin_key_env": "KV_ADMIN"}, keys) as (gw, _, admin):
        def ask(key: str, cid: str, messages: list) -> tuple[str, str]:
            r = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                           headers={"X-Conversation-Id": cid, "Authorization": f"Bearer {key}"},
                           json={"model": "ds", "messages": messages, "max_tokens": 8})
            assert r.status_code == 200, r.text
            return r.headers["x-gateway-route"].split(";")[0], r.headers["x-gateway-conversation"].split(";")[0]

        def analysed(conversation: str) -> bool:
            rows = httpx.get(f"{gw.url}/admin/api/records", headers=admin,
                             params={"conversation": conversation}).json()["records"]
            return any(x.get("kv") for x in rows)

        a, b = "sk-tenant-a-0123456789", "sk-tenant-b-0123456789"
        _, first = ask(a, "a-1", SHARED)
        wait_until(lambda: analysed(first), what="tenant A's turn analysed")
        reason, other = ask(b, "b-1", SHARED)
        assert reason == "least_loaded"
        wait_until(lambda: analysed(other), what="tenant B's turn analysed")
        reason, _ = ask(a, "a-2", SHARED + [{"role": "assistant", "content": "Done."},
                                          {"role": "user", "content": "And the tests?"}])
        assert reason == "prefix"


def test_routing_follows_what_the_pools_actually_hold():
    """prefix_source: kv_events: a new conversation sharing another's prefix goes to the replica whose pool
    holds it; once that pool lets it go (a reset), a newcomer is placed by load, not by a stale record.
    (The prefix is long: a replica already home to more than its share takes only a long one.)"""
    with _two_pools() as (gw, emus, _):
        shared = SHARED

        def ask(cid: str, messages: list) -> tuple[str, int, dict]:
            r = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30, headers={"X-Conversation-Id": cid},
                           json={"model": "ds", "messages": messages, "max_tokens": 8})
            assert r.status_code == 200, r.text
            reason, replica = r.headers["x-gateway-route"].split(";")[:2]
            ids[cid] = r.headers["x-gateway-conversation"].split(";")[0]
            return reason, int(replica.split("=")[1]), r.json()["choices"][0]["message"]

        ids: dict[str, str] = {}

        def analysed(cid: str) -> bool:
            rows = httpx.get(f"{gw.url}/admin/api/records", params={"conversation": ids[cid]}).json()["records"]
            return any(x.get("kv") for x in rows)

        _, home, answer = ask("first", shared)
        wait_until(lambda: analysed("first"), what="first turn analysed")
        follow = shared + [answer, {"role": "user", "content": "Now a different question."}]
        reason, replica, _ = ask("second", follow)
        assert (reason, replica) == ("prefix", home)
        wait_until(lambda: analysed("second"), what="second analysed")

        httpx.post(f"{emus[home].url}/emulator/reset", timeout=10)  # that pool lets everything go
        wait_until(lambda: next(r for r in httpx.get(f"{gw.url}/admin/api/kv").json()["replicas"]
                           if r["replica"] == emus[home].url)["held_tokens"] == 0, what="cleared")
        reason, _, _ = ask("third", shared + [answer, {"role": "user", "content": "Yet another question."}])
        assert reason == "least_loaded"
