"""GET /v1/models and /v1/models/{id}: root, max_model_len, owned_by and the lane's state, as clients read them."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.core.config import ConfigError, parse_routes
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, routes


@pytest.fixture(scope="module")
def gw():
    with run_emulator(flavour="vllm", max_model_len=131072, model_root="deepseek-ai/DeepSeek-V4-Flash") as emu:
        lanes = {"engine-limit": lane(emu.url),
                 "lane-limit": lane(emu.url, limits={"max_context_tokens": 32768}),
                 "dead": lane("http://127.0.0.1:9", upstream_model="ghost", timeouts={"connect": 0.2})}
        models = {"public": {"lane": "engine-limit", "fallbacks": ["lane-limit"], "owned_by": "acme"},
                  "small": "lane-limit", "ghost": "dead"}
        with run_gateway(routes(lanes, models)) as g:
            yield g


def test_list_has_what_clients_read(gw):
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    models = {m.id: m.model_dump() for m in client.models.list()}
    assert set(models) == {"public", "small", "ghost"}
    pub = models["public"]
    assert pub["object"] == "model" and pub["owned_by"] == "acme" and isinstance(pub["created"], int)
    assert pub["root"] == "deepseek-ai/DeepSeek-V4-Flash"  # what the engine calls it
    assert pub["max_model_len"] == 131072  # the engine's own, no lane limit
    assert pub["gateway"]["lane"] == "engine-limit" and pub["gateway"]["fallbacks"] == ["lane-limit"]
    assert pub["gateway"]["qualification"]["state"]
    assert models["small"]["max_model_len"] == 32768  # the lane's limit wins
    assert models["small"]["owned_by"] == "gateway"
    ghost = models["ghost"]  # an unreachable engine: the config's own facts, no max_model_len
    assert ghost["root"] == "ghost" and "max_model_len" not in ghost


def test_retrieve_one_and_404(gw):
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    one = client.models.retrieve("small")
    assert one.id == "small" and one.model_dump()["max_model_len"] == 32768
    r = httpx.get(gw.base_url + "/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_long_form_is_validated():
    base = "lanes:\n  a: {replicas: ['http://x:1'], upstream_model: m}\n"
    with pytest.raises(ConfigError, match="models.p.fallbacks.0"):
        parse_routes(base + "models:\n  p: {lane: a, fallbacks: [a]}\n")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_routes(base + "models:\n  p: {lane: a, colour: blue}\n")
    assert parse_routes(base + "models:\n  p: {lane: a}\n").models == {"p": "a"}
