"""The Anthropic Messages API through the gateway: a Claude-Code-like tool session is one conversation
whose turns are predicted exactly, on a vLLM lane (the emulator serves /v1/messages as vLLM does) and on
an SGLang lane (the gateway sends the engine the chat completion vLLM would make of the request and
converts the answer back); streams and whole answers; count_tokens; errors in Anthropic's shape."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.conversations import wait_analysed
from tests.support.emulator_proc import AGENT_EMULATOR, run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import agent_lane, routes

BASH = {"name": "Bash", "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
SYSTEM = [{"type": "text", "text": "You are Claude Code, an agent. " + "Work carefully. " * 40}]


@pytest.fixture(scope="module")
def gw():
    with run_emulator(**AGENT_EMULATOR, agent_tool_turns=1, answer_tokens=20) as emu, \
            run_emulator(**{**AGENT_EMULATOR, "flavour": "sglang"}, agent_tool_turns=1, answer_tokens=20) as other:
        with run_gateway(routes({"ds": agent_lane(emu.url), "sg": agent_lane(other.url, engine="sglang")},
                                {"claude-ds": "ds", "claude-sg": "sg"})) as g:
            yield g


def _stream(gw, body: dict) -> tuple[dict, list[dict], httpx.Headers]:
    """The message a stream builds, and its events."""
    events, blocks, message = [], {}, {}
    with httpx.stream("POST", gw.url + "/v1/messages", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            e = json.loads(line[5:])
            events.append(e)
            if e["type"] == "message_start":
                message = e["message"]
            elif e["type"] == "content_block_start":
                blocks[e["index"]] = dict(e["content_block"], partial="")
            elif e["type"] == "content_block_delta":
                d, b = e["delta"], blocks[e["index"]]
                field = {"text_delta": "text", "thinking_delta": "thinking"}.get(d["type"], "partial")
                b[field] = b.get(field, "") + d.get("text", d.get("thinking", d.get("partial_json", "")))
            elif e["type"] == "message_delta":
                message["stop_reason"] = e["delta"]["stop_reason"]
                message["usage"].update(e["usage"])  # cumulative: vLLM sends the input counts here
        headers = r.headers
    content = []
    for _, b in sorted(blocks.items()):
        partial = b.pop("partial")
        if b["type"] == "tool_use":
            b["input"] = json.loads(partial or "{}")
        content.append(b)
    message["content"] = content
    return message, events, headers


@pytest.mark.parametrize("model", ["claude-ds", "claude-sg"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_session_is_one_conversation_predicted_exactly(gw, stream, model):
    messages = [{"role": "user", "content": [{"type": "text", "text": f"List the files ({stream}, {model})."}]}]
    cids, caches = set(), []
    for turn in range(1, 4):
        body = {"model": model, "max_tokens": 200, "system": SYSTEM, "tools": [BASH], "messages": messages}
        if stream:
            message, events, headers = _stream(gw, body)
            assert events[-1]["type"] == "message_stop"
        else:
            r = httpx.post(gw.url + "/v1/messages", json=body, timeout=30)
            assert r.status_code == 200, r.text
            message, headers = r.json(), r.headers
        assert message["model"] == model and message["type"] == "message" and message["role"] == "assistant"
        cid = headers["x-gateway-conversation"].split(";")[0]
        cids.add(cid)
        caches.append(wait_analysed(gw, cid, turn)["last_cache"])
        # Claude Code sends the answer back as its content blocks, then the tool's result.
        messages.append({"role": "assistant", "content": message["content"]})
        uses = [b for b in message["content"] if b["type"] == "tool_use"]
        if uses:
            assert message["stop_reason"] == "tool_use" and uses[0]["input"] == {"command": "echo ok"}
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"],
                                                          "content": "ok"}]})
        else:
            assert message["stop_reason"] == "end_turn"
            messages.append({"role": "user", "content": "Next step."})
        usage = message["usage"]
        # SGLang reports no cache details when nothing was cached; vLLM always does.
        assert usage.get("cache_read_input_tokens", 0) == (caches[-1]["reported_cached_tokens"] or 0)
    assert len(cids) == 1
    for cache in caches[1:]:
        assert cache["verdict"] == "hit" and cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, \
            cache


def test_count_tokens(gw):
    body = {"model": "claude-ds", "system": SYSTEM, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(gw.url + "/v1/messages/count_tokens", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["input_tokens"] > 40
    # An SGLang engine cannot count a Messages request: the gateway renders it with the lane's template.
    sg = httpx.post(gw.url + "/v1/messages/count_tokens", json={**body, "model": "claude-sg"}, timeout=30)
    assert sg.status_code == 200 and sg.json() == r.json(), (sg.text, r.text)
    # A count is one JSON answer: a stream asked for is refused, in Anthropic's shape.
    streamed = httpx.post(gw.url + "/v1/messages/count_tokens", json={**body, "stream": True}, timeout=30)
    assert streamed.status_code == 400 and streamed.json()["error"]["type"] == "invalid_request_error", streamed.text
    assert "stream" in streamed.json()["error"]["message"]


@pytest.mark.parametrize("body, status, kind", [
    ({"model": "claude-ds", "messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error"),
    ({"model": "claude-ds", "max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}, 400,
     "invalid_request_error"),
    ({"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, 404, "not_found_error"),
    ({"model": "claude-sg", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     400, "invalid_request_error"),
])
def test_errors_have_anthropics_shape(gw, body, status, kind):
    r = httpx.post(gw.url + "/v1/messages", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind and r.json()["error"]["message"]


def test_a_refused_key_has_anthropics_shape_on_the_messages_routes(agent_emulator):
    """The key check runs before the pipeline: on the Messages routes its 401 is Anthropic's too (the
    key read from `x-api-key`, as Anthropic's clients send it), on the OpenAI routes OpenAI's."""
    cfg = routes({"ds": agent_lane(agent_emulator.url)}, {"claude-ds": "ds"}, client_keys={"env": "ANTH_KEYS"})
    turn = {"model": "claude-ds", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with run_gateway(cfg, env={"ANTH_KEYS": "sk-anthropic-test-key-1"}) as g:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            for headers in ({}, {"x-api-key": "sk-wrong"}):
                r = httpx.post(g.url + path, json=turn, headers=headers, timeout=30)
                assert r.status_code == 401, r.text
                assert r.json() == {"type": "error", "error": {"type": "authentication_error",
                                                               "message": r.json()["error"]["message"]}}, r.text
                assert r.json()["error"]["message"]
        good = httpx.post(g.url + "/v1/messages", json=turn, headers={"x-api-key": "sk-anthropic-test-key-1"},
                          timeout=30)
        assert good.status_code == 200 and good.json()["type"] == "message", good.text
        chat = httpx.post(g.url + "/v1/chat/completions", json=turn, timeout=30)
        assert chat.status_code == 401 and chat.json()["error"]["code"] == "missing_api_key", chat.text


def test_thinking_off_and_an_effort_are_read_as_vllm_reads_them_and_give_way_to_the_pin() -> None:
    """vLLM turns `output_config.effort` and `thinking: disabled` (which wins) into a top-level
    reasoning_effort; once the pin states the effort in chat_template_kwargs, the Messages body the engine
    gets no longer carries them (they would override it). The real engine: tests/test_engine_messages.py."""
    from gateway.conversations.effort import requested_effort, requested_thinking
    from gateway.pipeline.messages_chat import chat_body, tell_back

    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "disabled"},
            "output_config": {"effort": "max", "format": {"type": "json_schema", "json_schema": {"type": "object"}}}}
    chat = chat_body(body)
    assert chat["reasoning_effort"] == "none" and requested_thinking(chat, True) is False
    assert requested_effort(chat) is None
    assert chat_body({**body, "thinking": None})["reasoning_effort"] == "max"
    chat.pop("reasoning_effort")
    chat["chat_template_kwargs"] = {"thinking": True, "reasoning_effort": 50}
    tell_back(body, chat)
    assert "thinking" not in body and body["output_config"] == {"format": {"type": "json_schema",
                                                                           "json_schema": {"type": "object"}}}
    assert body["chat_template_kwargs"] == {"thinking": True, "reasoning_effort": 50}
    # Not stated by the gateway (the view keeps its effort): the body goes as the client sent it.
    kept = {"max_tokens": 8, "messages": [], "thinking": {"type": "disabled"}}
    tell_back(kept, {"reasoning_effort": "none"})
    assert kept["thinking"] == {"type": "disabled"}
