"""A lane that does not say its cache's block size gets its engine's (vLLM 16, SGLang 1): a prediction in
another block size than the engine's is never exact, and every turn would read as an eviction."""

from __future__ import annotations

import copy

from gateway.core.config import Lane
from tests.support.conversations import Agent
from tests.support.gateway_proc import run_gateway
from tests.support.routes import AGENT_RENDER, lane, routes


def _lane(**extra) -> Lane:
    return Lane(**{"replicas": ["http://127.0.0.1:9"], "upstream_model": "m", **extra})


def test_the_block_size_unsaid_is_the_engines() -> None:
    assert _lane().cache.block_size == 16
    assert _lane(engine="sglang").cache.block_size == 1
    assert _lane(engine="openai").cache.block_size == 1
    assert _lane(cache={"pool_tokens": 4096}).cache.block_size == 16
    assert _lane(cache={"block_size": 32}).cache.block_size == 32
    assert _lane(engine="sglang", cache={"block_size": 64}).cache.block_size == 64


def test_a_vllm_lane_that_does_not_say_its_block_size_predicts_exactly(agent_emu) -> None:
    bare = lane(agent_emu.url, render=copy.deepcopy(AGENT_RENDER))
    assert "cache" not in bare
    with run_gateway(routes({"ds": bare})) as gw:
        caches = Agent(gw).cold_then_hits(2)  # each hit: predicted == reported cached tokens
        assert all(c["predicted_cached_tokens"] % 16 == 0 for c in caches)
