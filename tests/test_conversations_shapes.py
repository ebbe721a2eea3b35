"""Clients that send back exactly what the gateway relayed, on each engine's shape,
and template-less lanes analysed at message level (item 6). Real gateway, real emulator, openai client."""

from __future__ import annotations

import httpx
import pytest

from tests.support.conversations import Agent
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import agent_routes


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_agent_echoing_what_was_relayed_hits_every_turn(flavour: str) -> None:
    # vLLM streams reasoning as `reasoning`, SGLang as `reasoning_content`; the agent sends each back
    # under the name it arrived with, and the engine renders it the way the gateway predicts.
    with run_emulator(flavour=flavour, tokenizer="dsv41", default_thinking=True, block_size=16) as emu, \
            run_gateway(agent_routes(emu.url, engine=flavour)) as gw:
        agent = Agent(gw, echo_field=None)
        caches = agent.cold_then_hits(5)
        field = "reasoning" if flavour == "vllm" else "reasoning_content"
        assert any(field in m for m in agent.messages if m["role"] == "assistant")
        assert all(cache["render_matches_engine"] for cache in caches[1:]), caches


def test_reasoning_field_sent_to_sglang_is_lost_and_named() -> None:
    # SGLang's protocol has no `reasoning` field: an agent that renames its reasoning loses it from the
    # prompt, and the gateway says so instead of predicting a hit.
    with run_emulator(flavour="sglang", tokenizer="dsv41", default_thinking=True, block_size=16) as emu, \
            run_gateway(agent_routes(emu.url, engine="sglang")) as gw:
        agent = Agent(gw, echo_field="reasoning")
        agent.turn()
        _, cache = agent.turn()
        assert cache["verdict"] == "drift" and cache["cause"] == "client_stripped_reasoning", cache
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]


def test_template_less_lane_is_analysed_at_message_level() -> None:
    with run_emulator(flavour="vllm", block_size=16) as emu, \
            run_gateway(agent_routes(emu.url, render={"template": None})) as gw:
        agent = Agent(gw)
        h, first = agent.turn()
        assert "x-gateway-effort" not in h  # nothing is known about how this engine renders effort
        assert first["render"] == "estimated"
        agent.turn()
        agent.messages[1]["content"] += " (edited)"
        _, cache = agent.turn()
        assert cache["verdict"] == "drift" and cache["render"] == "estimated", cache
        assert (cache["cause"], cache["divergence_message_index"]) == ("history_edited", 1), cache
        alerts = httpx.get(gw.url + "/admin/drift", params={"cause": "history_edited"}).json()["alerts"]
        assert alerts and "(edited)" in alerts[0]["snippet_after"] and alerts[0]["snippet_before"]
        assert alerts[0]["fixable_by"] == "client"
