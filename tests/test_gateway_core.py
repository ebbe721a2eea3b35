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


def lane(url: str | list[str], model: str = "deepseek-v4-flash", **extra) -> dict:
    replicas = url if isinstance(url, list) else [url]
    base = {"engine": "vllm", "replicas": replicas, "upstream_model": model, "qualification": "not_required",
            "timeouts": {"connect": 1, "first_byte": 3, "idle": 2},
            "breaker": {"failures": 1000}}  # these tests inject faults one after another
    base.update(extra)
    return base


@pytest.fixture(scope="module")
def emu():
    with run_emulator(flavour="vllm", default_thinking=True, tokenizer="dsv41") as e:
        yield e


@pytest.fixture(scope="module")
def emu_b():
    with run_emulator(flavour="sglang", default_thinking=True, model="other-model") as e:
        yield e


@pytest.fixture(scope="module")
def gw(emu, emu_b):
    routes = {
        "gateway": {"max_request_bytes": 200_000},
        "lanes": {"a": lane(emu.url), "b": lane(emu_b.url, model="other-model", engine="sglang")},
        "models": {"public-a": "a", "public-b": "b"},
    }
    with run_gateway(routes) as g:
        yield g


@pytest.fixture()
def client(gw):
    return openai.OpenAI(base_url=gw.base_url, api_key="test", max_retries=0, timeout=20)


def chat(content: str = "Hello there", **kw) -> dict:
    return {"model": "public-a", "messages": [{"role": "user", "content": content}], **kw}


def test_non_streaming(client, emu):
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


def test_request_id_propagated(gw, emu):
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=2), headers={"X-Request-Id": "rid-123"})
    assert r.headers["x-request-id"] == "rid-123"
    assert any(req.get("request_id") == "rid-123" or "rid-123" in json.dumps(req)
               for req in emu.stats().get("recent", emu.stats().get("requests_recent", [])))


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


def test_upstream_error_is_relayed_in_openai_shape(gw, emu):
    emu.configure(fail_rate=1.0)
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat())
        err = _error(r, 502)  # the engine's 500: the gateway itself did not fail
        assert err["message"]
    finally:
        emu.configure(fail_rate=0.0)


def test_upstream_down_is_502():
    port = free_port()  # nothing listens there
    routes = {"lanes": {"a": lane(f"http://127.0.0.1:{port}")}, "models": {"m": "a"}}
    with run_gateway(routes) as g:
        r = httpx.post(g.url + "/v1/chat/completions", json={**chat(), "model": "m"})
        assert _error(r, 502)["code"] == "upstream_unavailable"


def test_failover_to_next_replica(emu):
    dead = f"http://127.0.0.1:{free_port()}"
    routes = {"lanes": {"a": lane([dead, emu.url], routing="round_robin")}, "models": {"m": "a"}}
    with run_gateway(routes) as g:
        for _ in range(4):
            r = httpx.post(g.url + "/v1/chat/completions", json={**chat(max_tokens=2), "model": "m"})
            assert r.status_code == 200


def test_stall_before_first_byte_is_504(gw, emu):
    emu.configure(stall_before_first_byte_s=6)
    try:
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True), timeout=20)
        assert _error(r, 504)["code"] == "upstream_timeout"
        assert time.monotonic() - t0 < 5.5
    finally:
        emu.configure(stall_before_first_byte_s=0)


def test_midstream_stall_ends_with_error_event(gw, emu):
    emu.configure(stall_after_chunks=2, stall_s=6)
    try:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=chat(stream=True, max_tokens=10),
                          timeout=20) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][5:])["error"]["code"] == "upstream_idle_timeout"
    finally:
        emu.configure(stall_after_chunks=None, stall_s=0)


def test_upstream_dies_midstream(gw, emu):
    emu.configure(die_after_chunks=3, decode_tps=50)  # paced, so the death comes after the first byte
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True, max_tokens=10))
        events = [line for line in r.text.splitlines() if line.startswith("data:")]
        assert events, (r.status_code, r.text)
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][5:])["error"]["code"] == "upstream_disconnected"
    finally:
        emu.configure(die_after_chunks=None, decode_tps=0)


def test_client_disconnect_cancels_upstream(gw, emu):
    emu.configure(decode_tps=20)
    try:
        before = len(emu.stats()["cancelled"])
        with socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1]))) as s:
            body = json.dumps(chat(stream=True, max_tokens=200)).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            s.recv(4096)  # headers and the first events: the stream is running
            time.sleep(0.2)
        closed_at = time.time()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and len(emu.stats()["cancelled"]) == before:
            time.sleep(0.02)
        cancelled = emu.stats()["cancelled"]
        assert len(cancelled) > before
        assert cancelled[-1]["at"] - closed_at < 0.5
    finally:
        emu.configure(decode_tps=0)


def _served_by(emu, g, model: str) -> bool:
    """Did a request for `model` reach this emulator? (The answer names the client's model either way.)"""
    rid = "probe-" + uuid.uuid4().hex
    r = httpx.post(g.url + "/v1/chat/completions", json={**chat(max_tokens=2), "model": model},
                   headers={"X-Request-Id": rid})
    assert r.status_code == 200 and r.json()["model"] == model
    return any(x["request_id"] == rid for x in emu.stats()["recent"])


def test_hot_reload_keeps_streams_and_switches_lanes(emu, emu_b):
    routes = {"lanes": {"a": lane(emu.url), "b": lane(emu_b.url, model="other-model", engine="sglang")},
              "models": {"m": "a"}}
    emu.configure(decode_tps=40)
    try:
        with run_gateway(routes) as g:
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
            g.write_routes({**routes, "models": {"m": "b"}})  # move the alias while the stream runs
            deadline = time.monotonic() + 5
            on_b = False
            while time.monotonic() < deadline and not on_b:
                on_b = _served_by(emu_b, g, "m")
                time.sleep(0.1)
            assert on_b, "new requests must reach the new lane"
            t.join(30)
            events = result["events"]
            assert events[-1] == "data: [DONE]"
            assert not any('"error"' in e for e in events)
            content = [json.loads(e[5:]) for e in events[:-1]]
            assert all(c["model"] == "m" for c in content), "the client's own model name, throughout"
            assert [r for r in emu.stats()["recent"] if r["request_id"] == result["rid"]], \
                "the stream stayed on its lane"

            # A broken edit changes nothing, and says why.
            g.write_routes("lanes: {a: {replicas: [not-a-url]}}\nmodels: {m: a}\n")
            time.sleep(1.0)
            assert _served_by(emu_b, g, "m")
            ready = httpx.get(g.url + "/readyz").json()
            assert "replicas" in (ready["config"]["last_reload_error"] or "")
    finally:
        emu.configure(decode_tps=0)


def test_sighup_reloads(emu):
    routes = {"lanes": {"a": lane(emu.url)}, "models": {"m": "a"}}
    with run_gateway(routes, env={"GATEWAY_WATCH_ROUTES": "0"}) as g:
        g.write_routes({**routes, "models": {"m": "a", "m2": "a"}})
        g.sighup()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ids = [m["id"] for m in httpx.get(g.url + "/v1/models").json()["data"]]
            if "m2" in ids:
                break
            time.sleep(0.05)
        assert "m2" in ids


def test_readyz_reports_lanes(gw):
    r = httpx.get(gw.url + "/readyz")
    assert r.status_code == 200
    lanes = r.json()["lanes"]
    assert lanes["a"]["reachable"] and lanes["b"]["reachable"]
