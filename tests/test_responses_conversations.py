"""Conversation analysis for /v1/responses: the openai SDK's `responses.create`, multi-turn, through the
real gateway to the emulator (which serves /v1/responses through its chat machinery and real prefix
cache, like vLLM). Turn 2 sends turn 1's output items back with a new input: the gateway reads the
request as the chat messages the engine renders (gateway/pipeline/responses_chat.py) and judges its cache like
a chat turn; a request that continues engine-side state (previous_response_id) is recorded only."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gateway.core.exchange import GeneratedOutput
from gateway.pipeline.responses_chat import chat_view, take_output
from tests.support.conversations import SYSTEM, wait_analysed
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until
from tests.support.records import record_of
from tests.support.routes import agent_routes

TOOLS = [{"type": "function", "name": "read_file", "description": "Read a file from the workspace.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
ASK = "Find why test_split fails and fix it."


@pytest.fixture()
def gw(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as g:
        yield g


class ResponsesAgent:
    """An append-only Responses client: sends every output item back, then a tool result or a new input."""

    def __init__(self, gw, *, stream: bool, tools: bool = True, instructions: str = SYSTEM) -> None:
        self.gw = gw
        self.client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
        self.stream = stream
        self.tools = TOOLS if tools else None
        self.instructions = instructions
        self.items: list = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]}]
        self.turns = 0
        self.cid: str | None = None

    def turn(self, **kw) -> tuple[dict, openai.types.responses.Response]:
        args = {"model": "ds", "input": self.items, "instructions": self.instructions, "max_output_tokens": 20, **kw}
        if self.tools:
            args["tools"] = self.tools
        raw = self.client.responses.with_raw_response.create(stream=self.stream, **args)
        if self.stream:
            events = list(raw.parse())
            assert events[-1].type in ("response.completed", "response.incomplete"), events[-1].type
            resp = events[-1].response
        else:
            resp = raw.parse()
        calls = []
        for item in resp.output:
            self.items.append(item.model_dump(exclude_none=True))
            if item.type == "function_call":
                calls.append(item)
        for c in calls:
            self.items.append({"type": "function_call_output", "call_id": c.call_id,
                               "output": f"contents of {self.turns}.py\n" + "def f(x):\n    return x * 2\n" * 5})
        if not calls:
            self.items.append({"role": "user", "content": f"Continue with step {self.turns}."})
        self.turns += 1
        self.cid = raw.headers["x-gateway-conversation"].split(";")[0]
        return raw.headers, resp


def _cache(gw, agent: ResponsesAgent) -> dict:
    return wait_analysed(gw, agent.cid, agent.turns)["last_cache"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_turns_sending_output_items_back_hit(gw, stream):
    agent = ResponsesAgent(gw, stream=stream)
    headers, _ = agent.turn()
    assert "turn=1" in headers["x-gateway-conversation"]
    assert _cache(gw, agent)["verdict"] == "cold"
    for n in range(2, 5):
        headers, _ = agent.turn()
        assert f"turn={n}; via=lineage" in headers["x-gateway-conversation"], headers["x-gateway-conversation"]
        cache = _cache(gw, agent)
        assert cache["verdict"] == "hit", cache
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, cache
        assert cache["render"] == "exact" and cache["render_matches_engine"], cache


def test_changed_instructions_are_drift_with_the_system_prompt_as_cause(gw):
    agent = ResponsesAgent(gw, stream=True)  # tools: the template keeps earlier reasoning
    agent.turn()
    agent.turn()
    assert _cache(gw, agent)["verdict"] == "hit"
    agent.instructions = SYSTEM + " Today is Tuesday."
    agent.turn()
    cache = _cache(gw, agent)
    assert cache["verdict"] == "drift" and cache["cause"] == "system_prompt_changed", cache
    assert cache["divergence_message_index"] == 0 and cache["reported_cached_tokens"] < cache["rendered_prompt_tokens"]


def test_an_effort_change_is_pinned_in_the_responses_body(agent_emu):
    with run_gateway(agent_routes(agent_emu.url, effort_policy="pin")) as g:
        agent = ResponsesAgent(g, stream=False)
        headers, _ = agent.turn(reasoning={"effort": "high"})
        assert headers["x-gateway-effort"] == "50"
        headers, _ = agent.turn(reasoning={"effort": "low"})
        assert headers["x-gateway-effort"] == "50; requested=25; pinned", headers["x-gateway-effort"]
        sent = agent_emu.stats()["recent"][-1]["body"]
        assert sent["chat_template_kwargs"]["reasoning_effort"] == 50
        assert not (sent.get("reasoning") or {}).get("effort")
        cache = _cache(g, agent)
        assert cache["verdict"] == "hit" and cache["predicted_cached_tokens"] == cache["reported_cached_tokens"], cache


@pytest.mark.parametrize("extra, why", [
    ({"input": "And then?", "previous_response_id": "resp_0123"}, "responses: previous_response_id"),
    ({"input": [{"role": "user", "content": 5}]}, "responses: as chat messages: messages[0].content"),
], ids=["previous_response_id", "malformed-item"])
def test_unmapped_requests_are_recorded_without_analysis_and_say_why(gw, extra, why):
    rid = "resp-unmapped-" + why.split()[1].rstrip(":")
    r = httpx.post(gw.base_url + "/responses", json={"model": "ds", "max_output_tokens": 8, **extra},
                   headers={"X-Request-Id": rid})
    assert r.status_code == 200, r.text  # passed through: the engine decides
    assert "x-gateway-conversation" not in r.headers  # no conversation: nothing to pin or compare
    rec = record_of(gw, rid)
    assert rec["path"] == "/v1/responses" and rec["verdict"] in (None, "unknown")
    assert rec["analysis"].startswith(why), rec["analysis"]


# -- the mapping, read the way vLLM reads it (entrypoints/openai/responses/utils.py) -----------------


def test_output_items_sent_back_merge_into_one_assistant_message():
    view = chat_view({"model": "m", "instructions": "Be brief.", "tools": TOOLS + [{"type": "web_search"}],
                      "reasoning": {"effort": "high"}, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{\"path\": \"a\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
        {"type": "message", "role": "developer", "content": "dev"},
    ]})
    assert view.unmapped is None
    assert view.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
        {"role": "assistant", "reasoning": "think", "content": "answer", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"a\"}"}}]},
        {"role": "tool", "content": "x", "tool_call_id": "c1"},
        {"role": "developer", "content": "dev"},
    ]
    assert view.body["tools"] == [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
    assert view.body["reasoning_effort"] == "high"
    assert chat_view({"model": "m", "input": "hi", "instructions": ""}).body["messages"] == [
        {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, why", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]: item type 'item_reference'"),
    ({"input": [{"type": "reasoning", "encrypted_content": "gAAA", "summary": []}]}, "input[0]: encrypted"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0]: content part"),
    ({"input": [{"type": "message", "role": "assistant", "status": "incomplete", "content": []}]}, "input: a partial"),
    ({"input": [{"role": "user", "content": 5}]}, "as chat messages: "),
    ({"input": [{"type": "function_call", "call_id": "c", "name": 7, "arguments": "{}"}]}, "as chat messages: "),
    ({"input": []}, "input: no messages"),
    # Shapes the checks let through are recorded, never a 500 (found by schemathesis: tools 1.0).
    ({"input": "", "tools": 1.0}, "the request could not be read as chat messages"),
    ({"input": "hi", "tools": [{"type": "function", "name": 5, "parameters": 3}]}, "as chat messages: "),
])
def test_requests_that_do_not_map_say_why(body, why):
    view = chat_view({"model": "m", **body})
    assert view.body is None and view.unmapped.startswith(why), view.unmapped


def test_tools_that_are_not_an_array_of_objects_are_a_400():
    from gateway.core.errors import GatewayError
    from gateway.pipeline.passthrough import check_responses

    for tools, param in ((1.0, "tools"), ([1], "tools[0]")):
        with pytest.raises(GatewayError) as err:
            check_responses({"model": "m", "input": "hi", "tools": tools})
        assert err.value.status == 400 and err.value.param == param


def test_output_items_are_what_was_generated():
    gen = GeneratedOutput(content=["from deltas"])
    take_output(gen, [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
                      {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"}])
    assert gen.as_message() == {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [
        {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


# -- the real engine: vLLM's own /v1/responses renders what the gateway predicts ----------------------


@pytest.mark.engine
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_engine_responses_turns_are_predicted_exactly(stream):
    from tests.support.engine_proc import engine_fixture, engine_routes
    from tests.support.engine_agent import LOGIT_BIAS  # the random-weight model confined to whole words

    eng = engine_fixture()
    with run_gateway(engine_routes(eng.url)) as g:
        agent = ResponsesAgent(g, stream=stream)  # tools: the template keeps the earlier reasoning
        agent.client = openai.OpenAI(base_url=g.base_url, api_key="x", max_retries=0, timeout=120)
        knobs = {"temperature": 0, "extra_body": {"logit_bias": LOGIT_BIAS, "ignore_eos": True}}
        agent.turn(**knobs)
        first = wait_analysed(g, agent.cid, 1, timeout=60)["last_cache"]
        assert first["verdict"] == "cold" and first["render_matches_engine"], first
        for n in range(2, 4):
            agent.turn(**knobs)
            cache = wait_analysed(g, agent.cid, n, timeout=60)["last_cache"]
            print(f"responses turn {n} ({'stream' if stream else 'non-stream'}): predicted "
                  f"{cache['predicted_cached_tokens']}, engine {cache['reported_cached_tokens']}, {cache['verdict']}")
            assert cache["render_matches_engine"], cache
            assert cache["verdict"] == "hit", cache
            assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, cache


@pytest.mark.parametrize("unreadable", [
    {"previous_response_id": "resp_earlier"},
    {"input": [{"type": "reasoning", "encrypted_content": "gAAA", "summary": []},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}]},
])
def test_a_request_the_view_cannot_read_still_states_the_lanes_render_inputs(gw, agent_emu, unreadable):
    body = {"model": "ds", "input": "Continue.", "reasoning": {"effort": "high"}, "max_output_tokens": 16,
            **unreadable}
    r = httpx.post(gw.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code < 500, r.text
    sent = agent_emu.stats()["recent"][-1]["body"]
    kwargs = sent.get("chat_template_kwargs") or {}
    assert kwargs.get("thinking") is True and kwargs.get("reasoning_effort") == 50, sent
    assert isinstance(kwargs.get("drop_thinking"), bool), sent
    def recorded() -> list:
        return httpx.get(gw.url + "/admin/api/records", params={"limit": 1}).json()["records"]

    rec = wait_until(recorded, what="the request's record")[0]
    assert (rec["analysis"] or "").startswith("responses: "), rec


def test_namespace_and_custom_tools_read_as_vllm_shows_them():
    """vLLM 0.32's get_function_tools: a namespace's functions flattened to `<namespace>__<name>`, a custom
    tool as a one-string function, other types dropped; calls sent back named and encoded the same way
    (tests/test_engine_responses.py holds this to the engine's own prompt)."""
    tools = [{"type": "namespace", "name": "agents", "tools": [
                 {"type": "function", "name": "spawn", "description": "d", "parameters": {"type": "object"}}]},
             {"type": "custom", "name": "apply_patch", "description": "Patch files."},
             {"type": "web_search"}]
    body = {"model": "m", "tools": tools, "input": [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "namespace": "agents", "name": "spawn", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"}]}
    view = chat_view(body)
    assert [t["function"]["name"] for t in view.body["tools"]] == ["agents__spawn", "apply_patch"]
    assert view.body["tools"][1]["function"]["parameters"]["required"] == ["input"]
    msgs = view.body["messages"]
    assert msgs[1]["tool_calls"][0]["function"]["name"] == "agents__spawn"
    assert msgs[3]["tool_calls"][0]["function"] == {"name": "apply_patch", "arguments": '{"input": "*** Begin Patch"}'}
    assert msgs[4] == {"role": "tool", "content": "Done!", "tool_call_id": "c2"}


def test_an_item_vllm_refuses_is_restated_announced_and_recorded(gw, agent_emu):
    """The AI SDK's assistant history item (no `type`, output_text parts) goes to a vLLM lane as a typed
    message (vLLM 0.32 refuses it as sent: tests/test_engine_responses.py); the rest as sent."""
    item = {"role": "assistant", "content": [{"type": "output_text", "text": "Hi there."}]}
    body = {"model": "ds", "input": [{"role": "user", "content": "hello"}, item, {"role": "user", "content": "more"}],
            "max_output_tokens": 8}
    r = httpx.post(gw.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-healed"] == "restated_item@1"
    sent = agent_emu.stats()["recent"][-1]["body"]["input"]
    assert sent[1] == {**item, "type": "message"} and sent[0] == body["input"][0] and "type" not in sent[2]
    rid = r.headers["x-request-id"]

    assert json.loads(record_of(gw, rid)["healed"]) == {"restated_item": 1}


def test_reasoning_items_left_out_are_client_stripped_reasoning_with_the_responses_remedy(gw):
    """A Responses client that stops sending its reasoning items back: the alert tells it to send them
    back as reasoning items (not the chat advice about reasoning_content)."""
    agent = ResponsesAgent(gw, stream=False)  # tools: the template keeps earlier reasoning
    agent.turn()
    agent.turn()
    agent.items = [i for i in agent.items if i.get("type") != "reasoning"]
    agent.turn()
    cache = _cache(gw, agent)
    assert cache["verdict"] == "drift" and cache["cause"] == "client_stripped_reasoning", cache

    def alert() -> dict | None:
        got = httpx.get(gw.url + "/admin/api/alerts", params={"window_s": 3600, "show": "all"}).json()["alerts"]
        return next((a for a in got if a["conversation"] == agent.cid), None)

    found = wait_until(alert, what="the drift alert")
    assert "`reasoning` input item" in found["remedy"], found
