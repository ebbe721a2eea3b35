"""The gateway core through real servers on loopback: the openai client, bad input, faults, reload."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import httpx
import openai
import pytest

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import free_port, run_gateway
from tests.support.poll import wait_until
from tests.support.routes import UPSTREAM_MODEL, routes
from tests.support.routes import lane as base_lane


def lane(url: str | list[str], model: str = UPSTREAM_MODEL, **extra) -> dict:
    """Short timeouts; a breaker that never opens: these tests inject faults one after another."""
    return base_lane(url, **{"upstream_model": model, "timeouts": {"connect": 1, "first_byte": 3, "idle": 2},
                             "breaker": {"failures": 1000}, **extra})


@pytest.fixture(scope="module")
def emu_b():
    with run_emulator(flavour="sglang", default_thinking=True, model="other-model") as e:
        yield e


@pytest.fixture(scope="module")
def gw(agent_emulator, emu_b):
    lanes = {"a": lane(agent_emulator.url), "b": lane(emu_b.url, model="other-model", engine="sglang")}
    with run_gateway(routes(lanes, {"public-a": "a", "public-b": "b"}, max_request_bytes=200_000)) as g:
        yield g


@pytest.fixture()
def client(gw):
    return openai.OpenAI(base_url=gw.base_url, api_key="test", max_retries=0, timeout=20)


def chat(content: str = "Hello there", **kw) -> dict:
    return {"model": "public-a", "messages": [{"role": "user", "content": content}], **kw}


def test_non_streaming(client, agent_emulator):
    r = client.chat.completions.create(**chat(max_tokens=13))  # 8 reasoning + 5 content
    assert r.choices[0].message.content
    assert r.usage.prompt_tokens > 0
    assert r.usage.prompt_tokens_details is not None


def test_streaming_hides_usage_unless_asked(client):
    chunks = list(client.chat.completions.create(**chat(max_tokens=14), stream=True))  # 8 of them reasoning
    assert all(c.usage is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    with_usage = list(client.chat.completions.create(**chat(max_tokens=14), stream=True,
                                                     stream_options={"include_usage": True}))
    usage_chunks = [c for c in with_usage if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0].choices == []
    assert usage_chunks[0].usage.prompt_tokens_details.cached_tokens is not None


def test_reasoning_passes_through(client):
    chunks = list(client.chat.completions.create(**chat(max_tokens=4), stream=True))
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks if c.choices)
    assert reasoning, "the emulator thinks by default; its reasoning deltas must reach the client"


def test_tools_stream_and_not(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    r = client.chat.completions.create(**chat("Weather in Paris?"), tools=tools)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"]
    chunks = list(client.chat.completions.create(**chat("Weather in Paris?"), tools=tools, stream=True))
    names = [tc.function.name for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])
             if tc.function and tc.function.name]
    assert names == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_models_lists_public_names(client):
    assert sorted(m.id for m in client.models.list()) == ["public-a", "public-b"]


def test_request_id_propagated(gw, agent_emulator):
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=2), headers={"X-Request-Id": "rid-123"})
    assert r.headers["x-request-id"] == "rid-123"
    assert any(req.get("request_id") == "rid-123" or "rid-123" in json.dumps(req)
               for req in agent_emulator.stats().get("recent", agent_emulator.stats().get("requests_recent", [])))


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b"", None),
    (json.dumps({"model": "public-a"}).encode(), "messages"),
    (json.dumps({"model": "public-a", "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": "public-a", "messages": [{"role": "user", "content": 5}]}).encode(), "messages[0].content"),
    (json.dumps({"model": "public-a", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
     "messages[0].role"),
    (json.dumps({"model": 7, "messages": []}).encode(), "model"),
    (json.dumps({**chat(), "max_tokens": "lots"}).encode(), "max_tokens"),
    (json.dumps({**chat(), "stream": "yes"}).encode(), "stream"),
    (json.dumps({**chat(), "reasoning_effort": "turbo"}).encode(), "reasoning_effort"),
])
def test_bad_input_is_a_clear_400(gw, body, param):
    r = httpx.post(gw.url + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    err = _error(r, 400)
    if param:
        assert err["param"] == param


def test_unknown_model_is_404(gw):
    r = httpx.post(gw.url + "/v1/chat/completions", json={**chat(), "model": "nope"})
    assert _error(r, 404)["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0).chat.completions.create(**{**chat(),
                                                                                                 "model": "nope"})


def test_oversized_body_is_413(gw):
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat("x" * 300_000))
    assert _error(r, 413)["code"] == "request_too_large"


def test_upstream_error_is_relayed_in_openai_shape(gw, agent_emulator):
    agent_emulator.configure(fail_rate=1.0)
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat())
        err = _error(r, 502)  # the engine's 500: the gateway itself did not fail
        assert err["message"]
    finally:
        agent_emulator.configure(fail_rate=0.0)


def test_upstream_down_is_502():
    port = free_port()  # nothing listens there
    with run_gateway(routes({"a": lane(f"http://127.0.0.1:{port}")}, {"m": "a"})) as g:
        r = httpx.post(g.url + "/v1/chat/completions", json={**chat(), "model": "m"})
        assert _error(r, 502)["code"] == "upstream_unavailable"


def test_failover_to_next_replica(agent_emulator):
    dead = f"http://127.0.0.1:{free_port()}"
    with run_gateway(routes({"a": lane([dead, agent_emulator.url], routing="round_robin")}, {"m": "a"})) as g:
        before = agent_emulator.stats()["requests"]
        for _ in range(4):  # round robin: half of them are dealt the dead replica first
            r = httpx.post(g.url + "/v1/chat/completions", json={**chat(max_tokens=2), "model": "m"})
            assert r.status_code == 200
        assert agent_emulator.stats()["requests"] - before == 4  # every one answered by the next replica


def test_stall_before_first_byte_is_504(gw, agent_emulator):
    agent_emulator.configure(stall_before_first_byte_s=6)
    try:
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True), timeout=20)
        assert _error(r, 504)["code"] == "upstream_timeout"
        assert time.monotonic() - t0 < 5.5
    finally:
        agent_emulator.configure(stall_before_first_byte_s=0)


def test_midstream_stall_ends_with_error_event(gw, agent_emulator):
    agent_emulator.configure(stall_after_chunks=2, stall_s=6)
    try:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=chat(stream=True, max_tokens=10),
                          timeout=20) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][5:])["error"]["code"] == "upstream_idle_timeout"
    finally:
        agent_emulator.configure(stall_after_chunks=None, stall_s=0)


def test_upstream_dies_midstream(gw, agent_emulator):
    agent_emulator.configure(die_after_chunks=3, decode_tps=50)  # paced, so the death comes after the first byte
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True, max_tokens=10))
        events = [line for line in r.text.splitlines() if line.startswith("data:")]
        assert events, (r.status_code, r.text)
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][5:])["error"]["code"] == "upstream_disconnected"
    finally:
        agent_emulator.configure(die_after_chunks=None, decode_tps=0)


def test_client_disconnect_cancels_upstream(gw, agent_emulator):
    agent_emulator.configure(decode_tps=20)
    try:
        before = len(agent_emulator.stats()["cancelled"])
        with socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1]))) as s:
            body = json.dumps(chat(stream=True, max_tokens=200)).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            s.recv(4096)  # headers and the first events: the stream is running
            time.sleep(0.2)  # the scenario: the client reads a moment longer, then leaves mid-stream
        closed_at = time.time()
        cancelled = wait_until(lambda: len(agent_emulator.stats()["cancelled"]) > before
                               and agent_emulator.stats()["cancelled"],
                               what="the engine to see the cancellation", interval=0.02)
        assert cancelled[-1]["at"] - closed_at < 0.5
    finally:
        agent_emulator.configure(decode_tps=0)


def _served_by(emu, g, model: str) -> bool:
    """Did a request for `model` reach this emulator? (The answer names the client's model either way.)"""
    rid = "probe-" + uuid.uuid4().hex
    r = httpx.post(g.url + "/v1/chat/completions", json={**chat(max_tokens=2), "model": model},
                   headers={"X-Request-Id": rid})
    assert r.status_code == 200 and r.json()["model"] == model
    return any(x["request_id"] == rid for x in emu.stats()["recent"])


def test_hot_reload_keeps_streams_and_switches_lanes(agent_emulator, emu_b):
    cfg = routes({"a": lane(agent_emulator.url), "b": lane(emu_b.url, model="other-model", engine="sglang")},
                 {"m": "a"})
    agent_emulator.configure(decode_tps=40)
    try:
        with run_gateway(cfg) as g:
            result: dict = {"events": []}
            streaming = threading.Event()

            def long_stream() -> None:
                result["rid"] = "long-" + uuid.uuid4().hex
                with httpx.stream("POST", g.url + "/v1/chat/completions", headers={"X-Request-Id": result["rid"]},
                                  json={**chat(stream=True, max_tokens=60), "model": "m"}, timeout=30) as r:
                    for line in r.iter_lines():
                        if line.startswith("data:"):
                            result["events"].append(line)
                            streaming.set()

            t = threading.Thread(target=long_stream)
            t.start()
            assert streaming.wait(10), "the stream started"
            g.write_routes({**cfg, "models": {"m": "b"}})  # move the alias while the stream runs
            wait_until(lambda: _served_by(emu_b, g, "m"), what="new requests to reach the new lane", interval=0.1)
            t.join(30)
            events = result["events"]
            assert events[-1] == "data: [DONE]"
            assert not any('"error"' in e for e in events)
            content = [json.loads(e[5:]) for e in events[:-1]]
            assert all(c["model"] == "m" for c in content), "the client's own model name, throughout"
            recent = agent_emulator.stats()["recent"]
            assert [r for r in recent if r["request_id"] == result["rid"]], "the stream stayed on its lane"

            # A broken edit changes nothing, and says why.
            g.write_routes("lanes: {a: {replicas: [not-a-url]}}\nmodels: {m: a}\n")
            wait_until(lambda: "replicas" in (httpx.get(g.url + "/readyz").json()["config"]["last_reload_error"] or ""),
                       what="the broken edit's reload error in /readyz")
            assert _served_by(emu_b, g, "m")
    finally:
        agent_emulator.configure(decode_tps=0)


def test_sighup_reloads(agent_emulator):
    cfg = routes({"a": lane(agent_emulator.url)}, {"m": "a"})
    with run_gateway(cfg, env={"GATEWAY_WATCH_ROUTES": "0"}) as g:
        g.write_routes({**cfg, "models": {"m": "a", "m2": "a"}})
        g.sighup()
        wait_until(lambda: "m2" in [m["id"] for m in httpx.get(g.url + "/v1/models").json()["data"]],
                   what="the reloaded routes' new model in /v1/models")


def test_readyz_reports_lanes(gw):
    r = httpx.get(gw.url + "/readyz")
    assert r.status_code == 200
    lanes = r.json()["lanes"]
    assert lanes["a"]["reachable"] and lanes["b"]["reachable"]
