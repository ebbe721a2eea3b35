"""The access log: one structured line per request, after the response, in json or text, sampled, or off."""

from __future__ import annotations

import json
import random

import httpx
import openai
import pytest

from gateway.observe.access_log import AccessLog, AccessLogSettings, _text, access_fields
from gateway.core.exchange import Exchange
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until
from tests.support.routes import lane, routes

FIELDS = {"request_id", "tenant", "model", "lane", "replica", "status", "bytes_in", "bytes_out", "latency_ms",
          "ttft_ms", "cached_tokens", "predicted_cached_tokens", "verdict"}


def _routes(url: str) -> dict:
    return routes({"ds": lane(url, render={"template": "deepseek_v4.1"})})


def _lines(gw, n: int = 1, ids: frozenset[str] = frozenset()) -> list[dict]:
    """The access log's lines once there are `n` (written after each response), the lines of the
    request ids `ids` among them."""
    def written() -> list[dict] | None:
        found = [json.loads(line) for line in gw.log().splitlines() if line.startswith('{"ts"')]
        return found if len(found) >= n and ids <= {x["request_id"] for x in found} else None

    return wait_until(written, what=f"{n} access lines", detail=lambda: gw.log()[-2000:])


def test_one_json_line_per_request(agent_emulator):
    with run_gateway(_routes(agent_emulator.url)) as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key="secret-key-1", max_retries=0)
        list(client.chat.completions.create(model="ds", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=8, stream=True))
        client.chat.completions.create(model="ds", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                       extra_headers={"X-Request-Id": "rid-2"})
        httpx.post(gw.base_url + "/chat/completions", json={"model": "nope", "messages": []})
        lines = _lines(gw, 3)
        assert "secret-key-1" not in gw.log()
        stream = next(x for x in lines if x["stream"])
        whole = next(x for x in lines if x["request_id"] == "rid-2")
        bad = next(x for x in lines if x["model"] == "nope")
        for line in lines:
            assert FIELDS <= set(line)
        assert stream["status"] == 200 and stream["stream"] is True and stream["lane"] == "ds"
        assert stream["replica"] == agent_emulator.url and stream["bytes_out"] > 0 and stream["ttft_ms"] is not None
        assert stream["tenant"] and stream["tenant"] == whole["tenant"]  # "default" without client keys
        assert stream["verdict"] in ("cold", "hit", "drift", "eviction", "unknown")
        assert bad["status"] in (400, 404) and bad["bytes_out"] > 0
        httpx.get(gw.base_url + "/models", headers={"X-Request-Id": "list-1"})
        httpx.get(gw.url + "/healthz")
        listing = next(x for x in _lines(gw, 4) if x["request_id"] == "list-1")
        assert listing["method"] == "GET" and listing["path"] == "/v1/models" and listing["status"] == 200
        assert listing["bytes_out"] > 0 and not any(x["path"] == "/healthz" for x in _lines(gw, 4))


def test_one_line_per_messages_request(agent_emulator):
    """The Anthropic routes are the pipeline's too: one line each, from the aftermath, none from the
    router in front of the other routes."""
    with run_gateway(_routes(agent_emulator.url)) as gw:
        turn = {"model": "ds", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(gw.url + "/v1/messages", json=turn, headers={"X-Request-Id": "msg-1"},
                          timeout=30).status_code == 200
        count = {"model": "ds", "messages": turn["messages"]}
        assert httpx.post(gw.url + "/v1/messages/count_tokens", json=count, headers={"X-Request-Id": "count-1"},
                          timeout=30).status_code == 200
        assert httpx.post(gw.url + "/v1/messages", json={**turn, "model": "nope"},
                          headers={"X-Request-Id": "msg-404"}, timeout=30).status_code == 404
        httpx.post(gw.base_url + "/chat/completions", json={**turn, "max_tokens": 4},
                   headers={"X-Request-Id": "last"}, timeout=30)
        # A second line of a request was written when its answer ended, before the pipeline's.
        lines = _lines(gw, ids=frozenset({"msg-1", "count-1", "msg-404", "last"}))
        on_messages = [x for x in lines if x["path"].startswith("/v1/messages")]
        assert sorted(x["request_id"] for x in on_messages) == ["count-1", "msg-1", "msg-404"], on_messages
        assert {x["request_id"]: x["status"] for x in on_messages} == {"count-1": 200, "msg-1": 200, "msg-404": 404}
        assert all(x["lane"] == "ds" for x in on_messages if x["status"] == 200)


def test_text_format_and_off(agent_emulator):
    with run_gateway(_routes(agent_emulator.url), env={"GATEWAY_ACCESS_LOG_FORMAT": "text"}) as gw:
        httpx.post(gw.base_url + "/chat/completions", json={"model": "ds", "max_tokens": 2,
                                                            "messages": [{"role": "user", "content": "x"}]})
        wait_until(lambda: "request_id=" in gw.log(), what="the access line")
        line = next(x for x in gw.log().splitlines() if "request_id=" in x)
        assert "status=200" in line and "lane=ds" in line and "model=ds" in line
    with run_gateway(_routes(agent_emulator.url), env={"GATEWAY_ACCESS_LOG": "0"}) as gw:
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "ds", "max_tokens": 2,
                                                                "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200
        r = httpx.get(gw.url + "/metrics")  # something after the request: its aftermath has run by then
        assert "request_id" not in gw.log()


def test_sampling_keeps_every_error():
    sink = AccessLog(AccessLogSettings(sample=0.0), rng=random.Random(1))
    ok, bad = Exchange("a"), Exchange("b")
    ok.status, bad.status = 200, 503
    sink(ok, None)
    sink(bad, None)
    assert sink.written == 1 and sink.sampled_out == 1


def test_text_quotes_odd_values():
    ex = Exchange("r 1")
    ex.status, ex.public_model = 200, 'we"ird model'
    text = _text(access_fields(ex))
    assert 'request_id="r 1"' in text and 'model="we\\"ird model"' in text and "replica=-" in text


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        AccessLogSettings.from_env({"GATEWAY_ACCESS_LOG_FORMAT": "xml"})
    with pytest.raises(ValueError):
        AccessLogSettings.from_env({"GATEWAY_ACCESS_LOG_SAMPLE": "2"})
