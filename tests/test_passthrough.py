"""/v1/responses, /v1/embeddings, /tokenize, /detokenize through the gateway, with the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.gateway_proc import run_gateway
from tests.support.records import record_of
from tests.support.routes import lane, routes

KEY = "client-key-passthrough"
ADMIN = "admin-key-passthrough-0123456789"


@pytest.fixture(scope="module")
def gw(agent_emulator):
    keyed = routes({"ds": lane(agent_emulator.url, reasoning_field="reasoning_content")}, {"public-ds": "ds"},
                   client_keys={"env": "PT_KEYS"}, admin_key_env="PT_ADMIN")
    with run_gateway(keyed, env={"PT_KEYS": KEY, "PT_ADMIN": ADMIN}) as g:
        yield g


@pytest.fixture()
def client(gw):
    return openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, timeout=30)


def test_responses_create(agent_emulator, client):
    r = client.responses.create(model="public-ds", input="Say hello.", instructions="Be brief.",
                                max_output_tokens=16, reasoning={"effort": "medium"})
    assert r.model == "public-ds" and r.status in ("completed", "incomplete")
    assert r.output_text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    seen = agent_emulator.stats()["recent"][-1]
    assert seen["path"] == "/v1/responses" and seen["body"]["model"] == "deepseek-v4-flash"


def test_responses_stream(client):
    events = list(client.responses.create(model="public-ds", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Count."}]}], max_output_tokens=24, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds
    final = events[-1].response
    assert final.model == "public-ds" and final.usage.output_tokens >= 1


def test_responses_records_and_access(gw, client):
    raw = client.responses.with_raw_response.create(model="public-ds", input="hi", max_output_tokens=4,
                                                    extra_headers={"X-Request-Id": "resp-rec-1"})
    assert raw.http_response.status_code == 200
    rec = record_of(gw, "resp-rec-1", headers={"X-Admin-Key": ADMIN})
    assert rec["path"] == "/v1/responses" and rec["lane"] == "ds" and rec["prompt_tokens"] > 0


def test_embeddings(client):
    out = client.embeddings.create(model="public-ds", input=["one", "two"])
    assert out.model == "public-ds" and len(out.data) == 2 and len(out.data[0].embedding) > 0
    again = client.embeddings.create(model="public-ds", input="one", encoding_format="float")
    assert again.data[0].embedding == pytest.approx(out.data[0].embedding, abs=1e-5)


def test_tokenize_detokenize(gw):
    h = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(gw.url + "/tokenize", headers=h, json={"model": "public-ds", "prompt": "Hello world"})
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 0
    r2 = httpx.post(gw.url + "/detokenize", headers=h, json={"model": "public-ds", "tokens": r.json()["tokens"]})
    assert r2.status_code == 200 and r2.json()["prompt"] == "Hello world"  # the engine's vocabulary spells them
    bad = httpx.post(gw.url + "/detokenize", headers=h, json={"model": "public-ds", "tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["message"], bad.text


@pytest.mark.parametrize("path, body, param", [
    ("/v1/responses", {"model": "public-ds"}, "input"),
    ("/v1/responses", {"model": "public-ds", "input": 3}, "input"),
    ("/v1/embeddings", {"model": "public-ds", "input": [1.5]}, "input"),
    ("/tokenize", {"model": "public-ds"}, "prompt"),
    ("/detokenize", {"model": "public-ds", "tokens": ["a"]}, "tokens"),
    ("/detokenize", {"model": "nope", "tokens": [1]}, "model"),
    ("/v1/embeddings", {"model": "public-ds", "input": "x", "stream": True}, "stream"),
    ("/tokenize", {"model": "public-ds", "prompt": "x", "stream": True}, "stream"),
    ("/detokenize", {"model": "public-ds", "tokens": [1], "stream": True}, "stream"),
])
def test_bad_input_is_a_clear_4xx(gw, path, body, param):
    r = httpx.post(gw.url + path, headers={"Authorization": f"Bearer {KEY}"}, json=body)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/embeddings", "/tokenize", "/detokenize"])
def test_client_key_required(gw, path):
    r = httpx.post(gw.url + path, json={"model": "public-ds", "input": "x", "prompt": "x", "tokens": [1]})
    assert r.status_code == 401


@pytest.mark.parametrize("effort", ["minimal", "medium", "xhigh", "none"])
def test_responses_effort_words(client, effort):
    r = client.responses.create(model="public-ds", input="hi", max_output_tokens=4, reasoning={"effort": effort})
    assert r.status in ("completed", "incomplete")


def test_responses_invalid_effort_lists_accepted(gw):
    r = httpx.post(gw.base_url + "/responses", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "public-ds", "input": "x", "reasoning": {"effort": "turbo"}})
    assert r.status_code == 400 and "medium" in r.json()["error"]["message"]


@pytest.mark.engine
def test_responses_against_the_real_engine():
    from tests.support.engine_proc import engine_fixture, engine_routes

    eng = engine_fixture()
    with run_gateway(engine_routes(eng.url)) as g:
        client = openai.OpenAI(base_url=g.base_url, api_key="x", max_retries=0, timeout=120)
        r = client.responses.create(model="ds", input="Say hello.", max_output_tokens=8)
        assert r.model == "ds" and r.usage.input_tokens > 0
        events = list(client.responses.create(model="ds", input="Say hello.", max_output_tokens=8, stream=True))
        assert events[-1].type in ("response.completed", "response.incomplete")
        assert events[-1].response.model == "ds"
        emb = httpx.post(g.url + "/tokenize", json={"model": "ds", "prompt": "Hello"})
        assert emb.status_code == 200 and emb.json()["count"] > 0


def test_responses_obey_the_lane_output_limit(agent_emulator):
    with run_gateway(routes({"l": lane(agent_emulator.url, upstream_model="m", limits={"max_output_tokens": 64})},
                            {"m": "l"})) as g:
        r = httpx.post(g.base_url + "/responses", json={"model": "m", "input": "x", "max_output_tokens": 10**9})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"
        r = httpx.post(g.base_url + "/responses", json={"model": "m", "input": "x", "max_output_tokens": 8})
        assert r.status_code == 200
