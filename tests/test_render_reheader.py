"""An item under another generation header is derived from its cached render (renderer.py
`_reheader`), never rendered again: the result is byte for byte, field for field and token for token
what the template renders, and a template of another shape is never derived from."""

from __future__ import annotations

import random

import pytest

from gateway.render import Renderer, RenderOptions, SegmentCache
from gateway.render.template import header_is_suffix, load_template, template_source
from tests.support.random_requests import random_request


def _segments(r) -> list[tuple]:
    return [(s.text, list(s.token_ids), s.fields, s.digest, s.message_indices) for s in r.segments]


class Counting(Renderer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.macro_calls = 0

    def _call_macro(self, *args, **kwargs):
        self.macro_calls += 1
        return super()._call_macro(*args, **kwargs)


def test_the_packaged_template_header_is_a_suffix() -> None:
    source = template_source("deepseek_v4.1")
    assert load_template("deepseek_v4.1").header_is_suffix and header_is_suffix(source)
    # Any other use of the header in render_item, or a trailer of another shape: not derived.
    assert not header_is_suffix(source.replace("c.think", "c.header", 1))
    assert not header_is_suffix(source.replace("c.think", "c['think']", 1))
    assert not header_is_suffix(source.replace("{%- if c.header -%}", "{%- if c.header -%}x", 1))
    assert not header_is_suffix(source.replace("'<｜Assistant｜>' ~ c.header", "'<｜Assistant｜>\\n' ~ c.header", 1))


@pytest.mark.parametrize("seed", range(0, 300, 2))
def test_turn_by_turn_renders_equal_fresh_renders(seed: int) -> None:
    """Each prefix of a random conversation, rendered on one cache (earlier turns' items under other
    headers are there to derive from), equals its render on a fresh cache and the template's."""
    body, opts = random_request(random.Random(seed))
    shared = Renderer(opts, cache=SegmentCache())
    for k in range(1, len(body["messages"]) + 1):
        sub = {**body, "messages": body["messages"][:k]}
        got = shared.render(sub, opts)
        fresh = Renderer(opts, cache=SegmentCache()).render(sub, opts)
        assert _segments(got) == _segments(fresh)
        assert got.prompt == shared.render_template(sub, opts)


def test_an_agent_turn_renders_its_previous_user_message_without_the_template() -> None:
    """Thinking mode, reasoning dropped: the previous user message's header turns from <think> to
    </think>; it is derived, so a turn calls the template for its two new messages only."""
    opts = RenderOptions(engine="vllm")
    r = Counting(opts, cache=SegmentCache())
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Step 1."}]
    previous = None
    for turn in range(2, 6):
        r.macro_calls = 0
        said = {"role": "assistant", "content": f"Done with step {turn - 1}.", "reasoning_content": "Hm."}
        got, _ = r.render_turn({"messages": msgs}, said, opts, previous, len(msgs) - 2 if previous else 0)
        previous = got.previous
        if turn > 2:
            assert r.macro_calls == 3, "the new assistant and user messages and the generated answer"
        assert got.token_ids == Renderer(opts, cache=SegmentCache()).render({"messages": msgs}, opts).token_ids
        # Sent back edited: not the answer generated (that one is derived too: the next test).
        msgs = [*msgs, {"role": "assistant", "content": said["content"] + " (edited)"},
                {"role": "user", "content": f"Step {turn}."}]


def test_the_previous_answer_sent_back_is_not_rendered_again() -> None:
    """The answer the model gave, sent back as history without its reasoning (which the template
    drops anyway), is derived from the render of the generated answer: a turn calls the template for
    its new user message and its own answer only, and renders exactly as a fresh renderer does."""
    opts = RenderOptions(engine="vllm")
    r = Counting(opts, cache=SegmentCache())
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Step 1."}]
    previous = None
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": "x"}'}}]
    for turn in range(2, 8):
        r.macro_calls = 0
        said = {"role": "assistant", "content": f"Done with step {turn - 1}.", "reasoning_content": "Hm </think>?"
                if turn == 4 else "Hm."}
        if turn % 2:
            said["tool_calls"] = calls
        got, gen = r.render_turn({"messages": msgs}, said, opts, previous, len(msgs) - 2 if previous else 0)
        previous = got.previous
        if turn > 2:
            assert r.macro_calls == 2, "the new user message and the generated answer"
        fresh = Renderer(opts, cache=SegmentCache()).render({"messages": msgs}, opts)
        assert _segments(got) == _segments(fresh)
        back = {"role": "assistant", "content": said["content"]}
        if "tool_calls" in said:
            back["tool_calls"] = calls
        msgs = [*msgs, back, {"role": "user", "content": f"Step {turn}."}]


@pytest.mark.parametrize("changed", ["content", "arguments order", "tool call id"])
def test_an_answer_sent_back_changed_is_rendered_by_the_template(changed: str) -> None:
    opts = RenderOptions(engine="vllm")
    r = Counting(opts, cache=SegmentCache())
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": "x"}'}}]
    msgs = [{"role": "user", "content": "Go."}]
    said = {"role": "assistant", "content": "On it.", "reasoning_content": "Hm.", "tool_calls": calls}
    got, _ = r.render_turn({"messages": msgs}, said, opts)
    back = {"role": "assistant", "content": "On it.", "tool_calls": calls}
    if changed == "content":
        back["content"] = "On it!"
    elif changed == "arguments order":
        back["tool_calls"] = [{**calls[0], "function": {"name": "f", "arguments": '{"a": "x", "b": 1}'}}]
    else:
        back["tool_calls"] = [{**calls[0], "id": "call_2"}]
    nxt = [*msgs, back, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    r.macro_calls = 0
    again, _ = r.render_turn({"messages": nxt}, said, opts, got.previous, 1)
    assert r.macro_calls == 3
    assert _segments(again) == _segments(Renderer(opts, cache=SegmentCache()).render({"messages": nxt}, opts))


def test_the_packaged_template_reasoning_is_a_prefix() -> None:
    from gateway.render.template import reasoning_is_prefix

    source = template_source("deepseek_v4.1")
    assert load_template("deepseek_v4.1").reasoning_is_prefix and reasoning_is_prefix(source)
    head = "{{- F.content -}}{{- _text(m['content'], where ~ '.content') -}}{{- F.e -}}"
    assert head in source
    assert not reasoning_is_prefix(source.replace(head, head + "{{- m['name'] -}}", 1))
    assert not reasoning_is_prefix(source.replace(head, head + "{{- c.think -}}", 1))
    assert not reasoning_is_prefix(source.replace(head, head + "{{- members[0]['reasoning_content'] -}}", 1))
    assert not reasoning_is_prefix(source.replace("F.think_end ~ '</think>'", "F.think_end ~ '</think>\\n'", 1))
