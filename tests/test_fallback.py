"""Fallback lanes: used when a model's lane is refused (qualification) or has no healthy replica."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until
from tests.support.records import record_of
from tests.support.routes import lane, routes

DS = {"template": "deepseek_v4.1"}


def _lane(url: str, **extra) -> dict:
    return lane(url, **{"render": DS, **extra})


@pytest.fixture(scope="module")
def gw():
    with run_emulator(flavour="vllm", tokenizer="dsv41") as emu:
        lanes = {
            "unqualified": _lane(emu.url, qualification="required"),
            "dead": _lane("http://127.0.0.1:9", breaker={"failures": 1, "cool_down_s": 60, "probe_interval_s": 0.1},
                          timeouts={"connect": 0.2}),
            "same": _lane(emu.url),
            "other": _lane(emu.url, render={"template": None}, effort_policy="off"),
        }
        models = {
            "refused": {"lane": "unqualified", "fallbacks": ["same"]},
            "down": {"lane": "dead", "fallbacks": ["other"]},
            "nowhere": {"lane": "dead", "fallbacks": ["unqualified"]},
            "plain": "unqualified",
        }
        with run_gateway(routes(lanes, models)) as g:
            wait_until(lambda: httpx.get(g.url + "/admin/api/health").json()["lanes"]["dead"][0]["state"] == "open",
                       what="the active probe to open the dead lane's breaker")
            yield g


def _ask(gw, model: str):
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4)


def test_refused_lane_falls_back_and_says_so(gw):
    raw = _ask(gw, "refused")
    assert raw.http_response.status_code == 200
    assert raw.headers["x-gateway-fallback"] == "same; from=unqualified; reason=refused"  # same template: cache kept
    assert raw.parse().model == "refused"


def test_lane_without_healthy_replica_falls_back_cache_lost(gw):
    raw = _ask(gw, "down")
    assert raw.http_response.status_code == 200
    assert raw.headers["x-gateway-fallback"] == "other; from=dead; reason=no_healthy_replica; cache=lost"


def test_without_fallbacks_a_refusal_stays_a_503(gw):
    with pytest.raises(openai.APIStatusError) as err:
        _ask(gw, "plain")
    assert err.value.status_code == 503 and err.value.body["code"] == "lane_not_qualified"


def test_when_no_lane_can_serve_the_primary_answers(gw):
    with pytest.raises(openai.APIStatusError) as err:
        _ask(gw, "nowhere")
    assert err.value.status_code == 503 and err.value.body["code"] == "no_healthy_replica"


def test_fallback_is_recorded(gw):
    raw = _ask(gw, "refused")
    rec = record_of(gw, raw.headers["x-request-id"])
    assert rec["fallback_from"] == "unqualified" and rec["lane"] == "same", rec
