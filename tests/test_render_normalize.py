"""One message normalisation per engine (gateway/render/normalize.py), used by renderer, prints and lineage."""

from __future__ import annotations

import pytest

from gateway.conversations.identity import message_digest
from gateway.conversations.prints import message_prints
from gateway.render.normalize import canonical, reasoning_of, template_messages
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": "x"}'}}


def _body(assistant: dict) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", **assistant},
                         {"role": "tool", "tool_call_id": "c1", "content": "r"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}


@pytest.mark.parametrize("engine,expected", [
    ("vllm", "from reasoning"),  # protocol.py: `reasoning` wins a conflict
    ("sglang", "from reasoning_content"),  # ChatCompletionMessageGenericParam has reasoning_content only
    ("openai", "from reasoning_content"),
])
def test_reasoning_conflict_follows_the_engine(engine: str, expected: str) -> None:
    m = {"role": "assistant", "content": "x", "reasoning": "from reasoning",
         "reasoning_content": "from reasoning_content"}
    assert reasoning_of(m, engine) == expected


def test_vllm_reads_reasoning_and_sglang_drops_it() -> None:
    r = Renderer()
    vllm, sglang = RenderOptions(engine="vllm"), RenderOptions(engine="sglang")
    as_reasoning = _body({"reasoning": "think hard", "tool_calls": [CALL]})
    as_rc = _body({"reasoning_content": "think hard", "tool_calls": [CALL]})
    assert "think hard" in r.render_text(as_reasoning, vllm)
    assert r.render_text(as_reasoning, vllm) == r.render_text(as_rc, vllm)
    assert "think hard" not in r.render_text(as_reasoning, sglang)
    assert r.render(as_reasoning, vllm).token_ids == r.render(as_rc, vllm).token_ids


def test_vllm_coerces_bad_arguments_and_drops_empty_tool_calls() -> None:
    bad = {"role": "assistant", "content": "",
           "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{oops"}}]}
    out = template_messages("vllm", [bad, {"role": "assistant", "content": "", "tool_calls": []}])
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {}
    assert "tool_calls" not in out[1]


def test_prints_follow_the_render_not_the_json_shape() -> None:
    s = message_prints([{"role": "user", "content": "hello"}], engine="vllm")
    parts = message_prints([{"role": "user", "content": [{"type": "text", "text": "hello"}], "name": "bob"}],
                           engine="vllm")
    assert s == parts
    a = message_prints([{"role": "assistant", "content": "", "tool_calls": [CALL]}])
    swapped = {**CALL, "function": {"name": "f", "arguments": '{"a": "x", "b": 1}'}}
    b = message_prints([{"role": "assistant", "content": "", "tool_calls": [swapped]}])
    assert a.tool_calls != b.tool_calls  # the template renders arguments in the given order
    # ... while lineage still finds the conversation (compare what the arguments mean).
    assert message_digest({"role": "assistant", "tool_calls": [CALL]}) == message_digest(
        {"role": "assistant", "content": None, "tool_calls": [swapped]})


def test_canonical_vllm_joins_text_only_tool_parts_with_newline() -> None:
    m = {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert canonical(m, "vllm").content == "a\nb"
    assert canonical(m, "sglang").content == "a\n\nb"
