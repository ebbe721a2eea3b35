"""OpenTelemetry traces (gateway/tracing/): a real gateway process exporting over OTLP/HTTP to a receiver
on loopback; the client's `traceparent` continued, the engine's call given its own span as parent."""

from __future__ import annotations

import httpx
import pytest

from tests.support.conversations import Agent
from tests.support.emulator_proc import AGENT_EMULATOR, run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.otlp_receiver import otlp_receiver
from tests.support.poll import wait_until
from tests.support.routes import agent_routes, lane, routes
from tests.support.scripted_upstream import Script, http_response, scripted_upstream

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"

ANSWER = (b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
          b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,'
          b'"prompt_tokens_details":{"cached_tokens":0}}}')


def _routes(url: str) -> dict:
    """A generic OpenAI-compatible lane "up" on the scripted upstream, public name "pub"."""
    return routes({"up": lane(url, engine="openai", upstream_model="m")}, {"pub": "up"})


def _env(rx) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url, "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "gw-test"}


def test_the_clients_trace_is_continued_and_the_engine_gets_the_upstream_span_as_parent() -> None:
    with otlp_receiver() as rx, scripted_upstream() as up:
        up.script = Script([http_response(200, ANSWER, [("Content-Type", "application/json")])], keep_open=True)
        with run_gateway(_routes(up.url), env=_env(rx)) as gw:
            r = httpx.post(gw.url + "/v1/chat/completions", timeout=10,
                           headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"},
                           json={"model": "pub", "max_tokens": 7, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            wait_until(lambda: rx.named("chat pub"), what="the server span")
        server = rx.named("chat pub")[0]
        upstream = rx.named("chat m")[0]
        sent = up.requests[-1].headers["traceparent"]
    assert server.trace_id == upstream.trace_id == CLIENT_TRACE
    assert server.parent_span_id == CLIENT_PARENT and server.kind == 2  # SERVER
    assert upstream.parent_span_id == server.span_id and upstream.kind == 3  # CLIENT
    assert sent == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"
    assert server.service == "gw-test"
    attrs = server.attributes
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == "pub"
    assert attrs["gen_ai.request.max_tokens"] == 7
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (9, 1)
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 0
    assert attrs["http.response.status_code"] == 200 and attrs["gateway.lane"] == "up"
    assert attrs["gateway.tenant"] == "default" and attrs["gateway.replica"] == up.url
    assert "gateway.first_byte" in server.events
    prepare = rx.named("gateway.prepare")[0]
    assert prepare.parent_span_id == server.span_id and server.start_ns <= prepare.start_ns <= prepare.end_ns


def test_an_agents_turns_carry_the_conversation_and_the_verdict() -> None:
    with otlp_receiver() as rx, run_emulator(**AGENT_EMULATOR) as emu, \
            run_gateway(agent_routes(emu.url), env=_env(rx)) as gw:
        agent = Agent(gw)
        agent.turn()
        _, cache = agent.turn()
        wait_until(lambda: len([s for s in rx.named("chat ds") if "gateway.verdict" in s.attributes]) >= 2,
                   what="two analysed turns")
    turns = sorted((s for s in rx.named("chat ds") if s.kind == 2), key=lambda s: s.start_ns)
    first, second = turns[0].attributes, turns[1].attributes
    assert first["gateway.conversation"] == second["gateway.conversation"] == first["gen_ai.conversation.id"]
    assert (first["gateway.turn"], second["gateway.turn"]) == (1, 2)
    assert second["gateway.verdict"] == cache["verdict"] == "hit"
    assert second["gateway.predicted_cached_tokens"] == second["gen_ai.usage.cache_read.input_tokens"] > 0
    assert turns[0].trace_id != turns[1].trace_id  # no client traceparent: each request its own trace


def test_a_refused_request_is_traced_with_its_error() -> None:
    with otlp_receiver() as rx, scripted_upstream() as up:
        with run_gateway(_routes(up.url), env=_env(rx)) as gw:
            r = httpx.post(gw.url + "/v1/chat/completions", timeout=10,
                           json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 404
            wait_until(lambda: rx.named("chat"), what="the refused request's span")
    span = rx.named("chat")[0]
    assert span.attributes["http.response.status_code"] == 404
    assert span.attributes["error.type"] == "model_not_found"
    assert not rx.named("chat m")  # nothing went upstream


@pytest.mark.parametrize("env", [{}, {"OTEL_SDK_DISABLED": "true"}])
def test_off_unless_an_endpoint_is_configured(env) -> None:
    with otlp_receiver() as rx, scripted_upstream() as up:
        up.script = Script([http_response(200, ANSWER, [("Content-Type", "application/json")])], keep_open=True)
        full = dict(env, OTEL_BSP_SCHEDULE_DELAY="50")
        if env:
            full["OTEL_EXPORTER_OTLP_ENDPOINT"] = rx.url
        with run_gateway(_routes(up.url), env=full) as gw:
            r = httpx.post(gw.url + "/v1/chat/completions", timeout=10,
                           headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"},
                           json={"model": "pub", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200
            records = httpx.get(gw.url + "/admin/api/records").json()
        assert "traceparent" not in up.requests[-1].headers
    assert rx.spans == [] and records
