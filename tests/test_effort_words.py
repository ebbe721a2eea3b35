"""Effort words: OpenAI's vocabulary (and `max`) and integers, mapped per lane to the rendered number."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.core.config import DEFAULT_EFFORT_MAP, ConfigError, Lane, parse_routes
from gateway.conversations import effort
from gateway.core.errors import GatewayError
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, lane_config, routes


def _lane(**render) -> Lane:
    return lane_config(render=render)


def test_default_map_has_every_openai_word():
    lane = _lane()
    assert lane.render.effort_map == DEFAULT_EFFORT_MAP
    for word in ("minimal", "low", "medium", "high", "xhigh", "max"):
        assert word in lane.render.effort_map
    # the engines' own table for the words they know (SGLang/vLLM encoding_dsv41: 25/50/75/100)
    assert [lane.render.effort_map[w] for w in ("low", "high", "xhigh", "max")] == [25, 50, 75, 100]


def test_partial_map_is_completed_from_its_neighbours():
    emap = _lane(effort_map={"low": 50, "high": 75, "max": 100}).render.effort_map  # the release table
    assert emap == {"low": 50, "high": 75, "max": 100, "minimal": 50, "medium": 75, "xhigh": 75}


@pytest.mark.parametrize("bad, where", [
    ({"none": 10}, "effort_map.none"), ({"high": 0}, "effort_map.high"), ({"high": "50"}, "effort_map"),
])
def test_bad_maps_are_refused_with_their_key(bad, where):
    text = (f"lanes:\n  a:\n    replicas: ['http://127.0.0.1:1']\n    upstream_model: m\n"
            f"    render: {{effort_map: {bad}}}\nmodels: {{m: a}}\n")
    with pytest.raises(ConfigError, match=where):
        parse_routes(text)


def test_default_effort_must_be_known():
    with pytest.raises(ValueError, match="default_effort"):
        _lane(default_effort="medium-rare")


@pytest.mark.parametrize("word, number", [("minimal", 25), ("low", 25), ("medium", 50), ("high", 50),
                                           ("xhigh", 75), ("max", 100), (7, 7)])
def test_every_word_resolves_to_its_number(word, number):
    choice = effort.resolve({"reasoning_effort": word}, _lane())
    assert choice.thinking and choice.effort == number


def test_none_turns_thinking_off():
    assert effort.resolve({"reasoning_effort": "none"}, _lane()).thinking is False


@pytest.mark.parametrize("bad", ["ultra", "MEDIUM", 0, 101])
def test_invalid_effort_lists_the_accepted_ones(bad):
    with pytest.raises(GatewayError) as err:
        effort.resolve({"reasoning_effort": bad}, _lane())
    assert err.value.status == 400
    msg = err.value.message
    for word in ("none", "minimal", "low", "medium", "high", "xhigh", "max", "1-100"):
        assert word in msg


def test_no_template_lane_passes_known_words_and_refuses_unknown():
    lane = _lane(template=None)
    assert effort.resolve({"reasoning_effort": "medium"}, lane).effort == "medium"
    with pytest.raises(GatewayError):
        effort.resolve({"reasoning_effort": "ultra"}, lane)


def test_forwarded_as_the_number_to_vllm_and_an_engine_word_or_the_number_to_sglang():
    # vLLM merges a top-level word over chat_template_kwargs (render/told.py): the number alone goes.
    vllm = _lane()
    for start, number in (({}, 75), ({"reasoning_effort": "medium"}, 50), ({"reasoning_effort": "minimal"}, 25),
                          ({}, 33)):
        body = dict(start)
        effort.apply_to_body(body, vllm, True, number)
        assert "reasoning_effort" not in body and body["chat_template_kwargs"]["reasoning_effort"] == number
    # SGLang reads the top-level value: the engine's own word when one names the number, else the number.
    sglang = lane_config(engine="sglang")
    for number, sent in ((75, "xhigh"), (50, "high"), (25, "low"), (33, 33)):
        body = {"reasoning_effort": "medium"}
        effort.apply_to_body(body, sglang, True, number)
        assert body["reasoning_effort"] == sent


def _routes(url: str, **extra) -> dict:
    return routes({"ds": lane(url, render={"template": "deepseek_v4.1"}, **extra)})


@pytest.fixture(scope="module")
def gw(agent_emulator):
    with run_gateway(_routes(agent_emulator.url)) as g:
        yield g


@pytest.mark.parametrize("word", ["none", "minimal", "low", "medium", "high", "xhigh", "max"])
def test_openai_sdk_words_are_accepted(gw, word):
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model="ds", messages=[{"role": "user", "content": f"hello {word}"}], max_tokens=4, reasoning_effort=word)
    assert raw.http_response.status_code == 200
    expected = "off" if word == "none" else str(DEFAULT_EFFORT_MAP[word])
    assert raw.headers["x-gateway-effort"].split(";")[0] == expected


def test_invalid_word_is_a_400_listing_the_accepted_ones(gw):
    r = httpx.post(gw.base_url + "/chat/completions", json={
        "model": "ds", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "turbo"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "reasoning_effort" and "medium" in err["message"] and "1-100" in err["message"]


def test_policy_off_still_translates_words_the_engine_refuses(agent_emulator):
    with run_gateway(_routes(agent_emulator.url, effort_policy="off")) as g:
        for word in ("medium", "minimal", "high"):
            r = httpx.post(g.base_url + "/chat/completions", json={
                "model": "ds", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                "reasoning_effort": word})
            assert r.status_code == 200, (word, r.text)
        sent = agent_emulator.stats()["recent"][-3]["body"]  # medium went as the number vLLM's template renders
        assert "reasoning_effort" not in sent and sent["chat_template_kwargs"]["reasoning_effort"] == 50
