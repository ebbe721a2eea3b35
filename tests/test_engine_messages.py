"""The Anthropic Messages API on the real vLLM engine (vLLM CPU, shared/engine):

- a Messages agent loop on a vLLM lane (the engine's own /v1/messages) is one conversation whose turns
  after the first are hits, predicted as the engine reports them;
- the same requests on a lane whose engine is taken as not serving Messages (`engine: openai`, the path
  SGLang lanes take) go to the engine as the chat completion the gateway makes of them, and come back
  as vLLM's own Messages endpoint answers: the same blocks, stop reason, usage and stream events.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import pytest

from tests.support.engine_proc import EngineProc, engine_lane
from tests.support.gateway_proc import run_gateway
from tests.support.engine_agent import filler, wait_turn

pytestmark = pytest.mark.engine

# A tag of its own per run: an engine reused across runs (ENGINE_URL) must not hold this prefix already.
SYSTEM = [{"type": "text", "text": f"[messages-loop {secrets.token_hex(4)}] You are a coding agent.\n"
           + filler("messages", 20)}]
# With tools the template keeps earlier reasoning (without, it drops it at each user message: a drift).
TOOLS = [{"name": "Bash", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]



@pytest.fixture(scope="module")
def gw(engine: EngineProc):
    routes = {"lanes": {"native": engine_lane(engine.url), "translated": engine_lane(engine.url, engine="openai")},
              "models": {"claude-native": "native", "claude-translated": "translated"}}
    with run_gateway(routes) as g:
        yield g


def stream(gw, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The stream's events, and the message they build."""
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", gw.url + "/v1/messages", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    message = dict(events[0]["message"])
    blocks: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["type"] == "content_block_start":
            blocks[e["index"]] = dict(e["content_block"])
        elif e["type"] == "content_block_delta" and e["delta"]["type"] in ("text_delta", "thinking_delta"):
            key = "text" if e["delta"]["type"] == "text_delta" else "thinking"
            blocks[e["index"]][key] = blocks[e["index"]].get(key, "") + e["delta"][key]
        elif e["type"] == "message_delta":
            message["stop_reason"] = e["delta"]["stop_reason"]
            message["usage"] = {**message["usage"], **e["usage"]}
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return events, message


def test_a_messages_agent_loop_on_the_engine_is_predicted_exactly(gw):
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the code, then fix the bug."}]
    cid = None
    for turn in range(1, 5):
        body = {"model": "claude-native", "max_tokens": 12, "temperature": 0, "system": SYSTEM, "tools": TOOLS,
                "messages": messages}
        r = httpx.post(gw.url + "/v1/messages", json=body, timeout=120)
        assert r.status_code == 200, r.text
        cid = r.headers["x-gateway-conversation"].split(";")[0]
        cache = wait_turn(gw, cid, turn)["last_cache"]
        if turn > 1:
            assert cache["verdict"] == "hit", cache
            assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, cache
            assert r.json()["usage"]["cache_read_input_tokens"] == cache["reported_cached_tokens"]
        messages += [{"role": "assistant", "content": r.json()["content"]},  # as Claude Code sends it back
                     {"role": "user", "content": f"Step {turn}: go on."}]


def test_a_client_asking_thinking_off_or_another_effort_keeps_the_pinned_render(gw):
    """vLLM makes a top-level reasoning_effort of `thinking: disabled` (none, or low where the template
    refuses none) and of `output_config.effort`, and that overrides the pin stated in
    chat_template_kwargs: the engine would render another effort at the head of the prompt and lose the
    whole prefix. The gateway keeps the conversation's render: every turn is a hit, predicted exactly."""
    system = [{"type": "text", "text": f"[messages-pin {secrets.token_hex(4)}] You are a coding agent.\n"
               + filler("pin", 20)}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Plan the change."}]
    asks = [{}, {"thinking": {"type": "disabled"}}, {"output_config": {"effort": "max"}},
            {"thinking": {"type": "disabled"}, "output_config": {"effort": "low"}}, {}]
    for turn, ask in enumerate(asks, start=1):
        body = {"model": "claude-native", "max_tokens": 12, "temperature": 0, "system": system, "tools": TOOLS,
                "messages": messages, **ask}
        r = httpx.post(gw.url + "/v1/messages", json=body, timeout=120)
        assert r.status_code == 200, r.text
        cid = r.headers["x-gateway-conversation"].split(";")[0]
        cache = wait_turn(gw, cid, turn)["last_cache"]
        if turn > 1:
            assert cache["verdict"] == "hit", (ask, cache)
            assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, (ask, cache)
        messages += [{"role": "assistant", "content": r.json()["content"]},
                     {"role": "user", "content": f"Step {turn}: go on."}]


def _same_message(native: dict[str, Any], translated: dict[str, Any]) -> None:
    strip = lambda blocks: [{k: v for k, v in b.items() if k not in ("signature", "id")} for b in blocks]  # noqa: E731
    assert strip(translated["content"]) == strip(native["content"]), (native, translated)
    assert translated["stop_reason"] == native["stop_reason"] and translated["type"] == "message"
    assert translated["usage"]["output_tokens"] == native["usage"]["output_tokens"]
    total = lambda u: u["input_tokens"] + u.get("cache_read_input_tokens", 0)  # noqa: E731
    assert total(translated["usage"]) == total(native["usage"]), (native["usage"], translated["usage"])


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
def test_a_translated_lane_answers_as_the_engines_own_messages_endpoint(gw, streamed):
    body = {"max_tokens": 10, "temperature": 0, "system": SYSTEM,
            "messages": [{"role": "user", "content": [{"type": "text", "text": f"Hello ({streamed})."}]}]}
    if not streamed:
        got = {}
        for model in ("claude-native", "claude-translated"):
            r = httpx.post(gw.url + "/v1/messages", json={**body, "model": model}, timeout=120)
            assert r.status_code == 200, r.text
            got[model] = r.json()
        _same_message(got["claude-native"], got["claude-translated"])
        assert got["claude-translated"]["model"] == "claude-translated"
        return
    native_events, native = stream(gw, {**body, "model": "claude-native"})
    translated_events, translated = stream(gw, {**body, "model": "claude-translated"})
    _same_message(native, translated)
    kinds = lambda events: [(e["type"], e.get("delta", {}).get("type")) for e in events]  # noqa: E731
    assert kinds(translated_events) == kinds(native_events)
