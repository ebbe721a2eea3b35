"""A /v1/responses request renders, through the gateway's reading of it, exactly the prompt a real vLLM
engine builds (vLLM CPU, shared/engine; `enable_response_messages` returns the engine's prompt and its
token ids): Codex's request shape, with a namespace tool (flattened to `<namespace>__<name>`), a custom
(freeform) tool (a one-string function), a tool type never shown to the model (web_search), and the
items Codex sends back: reasoning, namespaced and custom tool calls, their outputs, text parts."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest

from gateway.pipeline.responses_chat import chat_view
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions
from tests.support.engine_proc import MODEL, engine_lane, http_json
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until

pytestmark = pytest.mark.engine



def function(name: str, description: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": description, "strict": False,
            "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in props.items()},
                           "required": list(props), "additionalProperties": False}}


TOOLS = [
    function("exec_command", "Runs a command in a PTY.", cmd="string", yield_time_ms="number"),
    {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for spawning sub-agents.",
     "tools": [function("spawn_agent", "Spawn a sub-agent.", message="string"),
               function("close_agent", "Close an agent.", target="string")]},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files.",
     "format": {"type": "text"}},  # vLLM 0.32 refuses a grammar format (400)
    {"type": "web_search", "external_web_access": True},
]

INPUT = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"},
                                                    {"type": "input_text", "text": "List the files."}]},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "look first"}]},
    {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\": \"ls\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "a.py\nb.py\n"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "ask a helper"}]},
    {"type": "function_call", "call_id": "call_2", "namespace": "multi_agent_v1", "name": "spawn_agent",
     "arguments": "{\"message\": \"read a.py\"}"},
    {"type": "function_call_output", "call_id": "call_2", "output": "agent 7 started"},
    {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch",
     "input": "*** Begin Patch\n*** Add File: c.py\n+print('ok')\n*** End Patch"},
    {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done!"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Patched."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Now run it."}]},
]


@pytest.mark.parametrize("effort", ["high", None])
def test_codex_shaped_responses_request_renders_as_the_engine_prompts(engine, effort):
    body: dict[str, Any] = {"model": MODEL, "input": INPUT, "tools": TOOLS, "tool_choice": "auto",
                            "parallel_tool_calls": True, "store": False, "stream": False,
                            "max_output_tokens": 1, "enable_response_messages": True,
                            "chat_template_kwargs": {"thinking": True, "drop_thinking": True, "reasoning_effort": 50}}
    if effort:
        body["reasoning"] = {"effort": effort}
    view = chat_view(copy.deepcopy(body))
    assert view.body is not None, view.unmapped
    kwargs = body["chat_template_kwargs"]
    ours = Renderer().render(view.body, RenderOptions(thinking=True, reasoning_effort=kwargs["reasoning_effort"],
                                                      drop_thinking=True, engine="vllm"))
    status, out = http_json("POST", engine.url + "/v1/responses", body)
    assert status == 200, out
    prompt = out["input_messages"][0]
    assert out["usage"]["input_tokens"] == len(ours.token_ids)
    if prompt["tokens"] != ours.token_ids:
        k = next(i for i, (a, b) in enumerate(zip(prompt["message"], ours.prompt)) if a != b)
        raise AssertionError(f"engine {prompt['message'][k - 80:k + 120]!r}\ngateway {ours.prompt[k - 80:k + 120]!r}")
    assert "multi_agent_v1__spawn_agent" in ours.prompt and "apply_patch" in ours.prompt
    assert "web_search" not in ours.prompt


def test_an_untyped_assistant_item_vllm_refuses_is_restated_and_served(engine):
    """The AI SDK's assistant history item (role + output_text parts, no `type`): vLLM 0.32 answers 400
    to it directly; through the gateway it is restated with `type: message`, announced, and served."""
    item = {"role": "assistant", "content": [{"type": "output_text", "text": "Hi there."}]}
    body = {"model": MODEL, "max_output_tokens": 1, "store": False,
            "input": [{"role": "user", "content": "hello"}, item, {"role": "user", "content": "more"}]}
    status, out = http_json("POST", engine.url + "/v1/responses", body)
    assert status == 400, out
    with run_gateway({"lanes": {"e": engine_lane(engine.url)}, "models": {"ds": "e"}}) as gw:
        r = httpx.post(gw.url + "/v1/responses", json={**body, "model": "ds"}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-healed"] == "restated_item@1"
        rid = r.headers["x-request-id"]

        def record() -> dict[str, Any] | None:
            rows = httpx.get(gw.url + "/admin/api/records", params={"limit": 20}).json()["records"]
            return next((x for x in rows if x["request_id"] == rid), None)

        wait_until(lambda: record() is not None, what="the request's record")
        assert json.loads(record()["healed"]) == {"restated_item": 1} and not record()["healed_tokens"]
