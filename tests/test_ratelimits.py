"""Per-tenant rate limits through real gateways: requests, tokens and concurrency, shared by two
gateway processes on one Redis; 429 in OpenAI's shape with Retry-After and the x-ratelimit headers;
the official openai client, with its default retries, completes all its requests.

Requests per minute and concurrent requests are exact across processes (counted first, refunded
when over). The minute is a sliding window estimated from two fixed ones: across a window boundary
the previous window's count weighs by how much of it is still within the minute, so a burst that
straddles the boundary may be admitted up to that estimate's error (never more than one limit's
worth over two minutes)."""

from __future__ import annotations

import concurrent.futures
import contextlib

import httpx
import openai

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until
from tests.support.redis_proc import run_redis
from tests.support.routes import lane
from tests.support.routes import routes as base_routes

KEYS = {"RL_KEYS": "sk-team-a-0123456789,sk-team-b-0123456789", "RL_ADMIN": "rl-admin-0123456789abcdef"}
A, B = "sk-team-a-0123456789", "sk-team-b-0123456789"
ADMIN = {"Authorization": f"Bearer {KEYS['RL_ADMIN']}"}


def routes(url: str, rules: list[dict]) -> dict:
    return base_routes({"l": lane(url, upstream_model="m")}, {"m": "l"}, client_keys={"env": "RL_KEYS"},
                       admin_key_env="RL_ADMIN", rate_limits=rules)


def ask(url: str, key: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra})


@contextlib.contextmanager
def two_gateways(rules: list[dict], **emulator):
    with run_emulator(flavour="vllm", **emulator) as emu, run_redis() as port:
        env = {**KEYS, "GATEWAY_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        with run_gateway(routes(emu.url, rules), env=env) as g1, run_gateway(routes(emu.url, rules), env=env) as g2:
            yield g1, g2


def test_requests_per_minute_hold_across_two_gateways_per_tenant() -> None:
    with two_gateways([{"tenant": "*", "requests_per_minute": 10}]) as (g1, g2):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: ask((g1, g2)[i % 2].url, A), range(30)))
        assert sum(r.status_code == 200 for r in answers) == 10
        refused = [r for r in answers if r.status_code == 429]
        assert len(refused) == 20
        err = refused[0].json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
        assert "requests_per_minute 10" in err["message"] and int(refused[0].headers["retry-after"]) >= 1
        ok = next(r for r in answers if r.status_code == 200)
        assert ok.headers["x-ratelimit-limit-requests"] == "10"
        assert int(ok.headers["x-ratelimit-remaining-requests"]) < 10 and ok.headers["x-ratelimit-reset-requests"]
        assert ask(g1.url, B).status_code == 200  # another tenant, its own budget
        usage = httpx.get(g2.url + "/admin/api/ratelimits", headers=ADMIN).json()["rules"]
        team_a = [row for row in usage if row["requests_per_minute"]["used"] >= 10]
        assert team_a, usage


def test_tokens_are_charged_from_the_engines_usage() -> None:
    rule = {"tenant": "*", "tokens_per_minute": 50, "tokens": "completion"}
    with two_gateways([rule], output_tokens=30) as (g1, g2):
        assert ask(g1.url, A, max_tokens=30).status_code == 200
        wait_until(lambda: any(row.get("tokens_per_minute", {}).get("used", 0) >= 30 for row in
                               httpx.get(g1.url + "/admin/api/ratelimits", headers=ADMIN).json()["rules"]),
                   what="the first answer charged")
        second = ask(g2.url, A, max_tokens=30)  # 30 < 50: admitted, then charged
        assert second.status_code == 200 and second.headers["x-ratelimit-limit-tokens"] == "50"
        wait_until(lambda: ask(g1.url, A, max_tokens=30).status_code == 429, what="the tenant over its tokens")
        assert ask(g1.url, B, max_tokens=30).status_code == 200


def test_concurrency_cap_with_a_bounded_wait_and_the_openai_clients_retries() -> None:
    rules = [{"tenant": "*", "concurrent": 1}]
    with two_gateways(rules, decode_tps=40, output_tokens=20) as (g1, g2):  # each answer ~0.5 s
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda g: ask(g.url, A, max_tokens=20), (g1, g2, g1)))
        assert sorted(r.status_code for r in answers)[0] == 200 and 429 in [r.status_code for r in answers]
        # The official client retries a 429 after Retry-After by itself: all its requests complete.
        client = openai.OpenAI(base_url=g1.url + "/v1", api_key=A)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            done = list(pool.map(lambda _: client.chat.completions.create(
                model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}]), range(3)))
        assert all(d.choices[0].message.content for d in done)
    with two_gateways([{"tenant": "*", "concurrent": 1, "wait_s": 10}], decode_tps=40, output_tokens=20) as (g1, g2):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda g: ask(g.url, A, max_tokens=20), (g1, g2, g1)))
        assert [r.status_code for r in answers] == [200, 200, 200]  # waited for the slot instead


def test_per_process_without_redis_and_refusals_are_recorded_and_counted() -> None:
    with run_emulator(flavour="vllm") as emu, run_gateway(routes(emu.url, [{"tenant": "*", "requests_per_minute": 2}]),
                                                          env=KEYS) as gw:
        assert [ask(gw.url, A).status_code for _ in range(3)] == [200, 200, 429]
        wait_until(lambda: "gateway_rate_limited_total" in httpx.get(gw.url + "/metrics", headers=ADMIN).text,
                   what="the refusal counted")
        def refused() -> list:
            rows = httpx.get(gw.url + "/admin/api/records", headers=ADMIN, params={"limit": 10}).json()["records"]
            return [r for r in rows if r["rate_limited"]]

        wait_until(refused, what="the refusal recorded")
        assert refused()[0]["rate_limited"] == "requests_per_minute 2" and refused()[0]["status"] == 429
