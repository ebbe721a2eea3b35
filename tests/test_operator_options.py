"""Options operators expect: `failover_on` per lane, and keep-alive timeouts that
do not race the clients' pools (no connection closed under a client that was about to reuse it)."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import httpx
import pytest

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, routes
from tests.support.scripted_upstream import Script, http_response, scripted_upstream

OK = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                              "finish_reason": "stop"}]}).encode()
PAUSE_LO, PAUSE_HI = 4.9, 5.1  # around uvicorn's default 5 s keep-alive: where the race was
BODY = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 4}


def _lane(replicas: list[str], **extra) -> dict:
    """Round robin; a breaker that never keeps a replica out: each request sees the replica it is dealt."""
    return lane(replicas, **{"upstream_model": "m", "routing": "round_robin",
                             "timeouts": {"connect": 1, "first_byte": 5, "idle": 2},
                             "breaker": {"failures": 1000000, "cool_down_s": 0.01}, **extra})


def test_failover_on_500_is_per_lane_and_before_the_first_byte_only() -> None:
    with scripted_upstream() as broken, scripted_upstream() as good:
        broken.script = Script([http_response(500, b'{"error": {"message": "boom"}}')])
        good.script = Script([http_response(200, OK, [("Content-Type", "application/json")])])
        cfg = routes({"fo": _lane([broken.url, good.url], failover_on=["connect", 500, 502, 503]),
                      "plain": _lane([broken.url, good.url])})
        with run_gateway(cfg) as gw, httpx.Client(base_url=gw.url, timeout=10) as client:
            fo = [client.post("/v1/chat/completions", json={**BODY, "model": "fo"}).status_code for _ in range(6)]
            plain = [client.post("/v1/chat/completions", json={**BODY, "model": "plain"}).status_code
                     for _ in range(6)]
            assert fo == [200] * 6
            assert sorted(set(plain)) == [200, 502]  # round robin: the broken replica answers half (500 -> 502)
            # After the first byte nothing fails over: a stream cut by the replica ends with an error event.
            good.script = Script([http_response(200, b'data: {"choices": []}\n\n',
                                                [("Content-Type", "text/event-stream")], "close")])
            broken.script = good.script
            resp = client.post("/v1/chat/completions", json={**BODY, "model": "fo", "stream": True})
            assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
            assert '"upstream_disconnected"' in resp.text


def test_failover_on_rejects_a_4xx() -> None:
    from gateway.core.config import ConfigError, parse_routes

    text = "lanes: {a: {replicas: ['http://h:1'], upstream_model: m, failover_on: [connect, 404]}}\nmodels: {m: a}"
    with pytest.raises(ConfigError, match=r"lanes\.a\.failover_on"):
        parse_routes(text)


async def _run_pool(url: str, seconds: float, concurrency: int) -> tuple[int, list[str]]:
    """Workers of a pooled client (aiohttp keeps idle connections 15 s) that pause 4-7 s between
    bursts: exactly where a 5 s server keep-alive closes a connection the client is reusing."""
    done = 0
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)

    async def worker(n: int) -> None:
        nonlocal done
        rng = random.Random(n)
        await asyncio.sleep(rng.uniform(0, 2))  # the scenario: clients start at different times
        while time.monotonic() < deadline:
            for _ in range(rng.randint(1, 3)):
                stream = rng.random() < 0.5
                try:
                    async with session.post(url, json={**BODY, "model": "m", "stream": stream}) as resp:
                        await resp.read()
                        if resp.status != 200:
                            errors.append(f"HTTP {resp.status}")
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                done += 1
            await asyncio.sleep(rng.uniform(PAUSE_LO, PAUSE_HI))  # the scenario: an idle pause near the keep-alive

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(worker(n) for n in range(concurrency)))
    return done, errors


async def _reuse_after_idle(host: str, port: int, idle_s: float) -> list[bytes]:
    """One kept-alive connection: a request, `idle_s` of silence, a second request on it."""
    reader, writer = await asyncio.open_connection(host, port)
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    lines = []
    try:
        for i in range(2):
            if i:
                await asyncio.sleep(idle_s)  # the point of the check: the connection sits idle
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            lines.append(head.split(b"\r\n")[0])
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        lines.append(repr(exc).encode())
    finally:
        writer.close()
    return lines


def test_no_connection_errors_at_c64_with_idle_pauses() -> None:
    """Also: a connection idle for longer than uvicorn's default keep-alive (5 s) and httpx's pool
    expiry (5 s) is still open: the client's pool, not the gateway, decides when it closes."""
    with run_emulator(decode_tps=2000) as emu:
        with run_gateway(routes({"l": _lane([emu.url])}, {"m": "l"})) as gw:
            host, port = gw.url.removeprefix("http://").split(":")

            async def both():
                return await asyncio.gather(_run_pool(gw.url + "/v1/chat/completions", 20.0, 64),
                                            _reuse_after_idle(host, int(port), 7.0))

            (done, errors), reused = asyncio.run(both())
            assert done > 200
            assert errors == [], f"{len(errors)} of {done} failed: {errors[:5]}"
            assert reused == [b"HTTP/1.1 200 OK"] * 2, reused
            assert "Traceback" not in gw.log()
