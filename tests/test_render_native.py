"""The packaged template's `render_item` in Python (render/native.py) renders every item it takes exactly
as the macro does (text and field spans), leaves every other item to the macro (with the macro's errors),
and is used only for a template whose macros are the ones it was written from."""

from __future__ import annotations

import json
import random

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.render import Renderer, RenderError, RenderOptions, SegmentCache
from gateway.render import native
from gateway.render.renderer import _parse_marked
from gateway.render.template import ChatTemplate, load_template, template_source
from tests.support.random_requests import random_request


class Both(Renderer):
    """Renders each item with the macro and, where it takes it, natively: they must agree."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.native = 0
        self.macro = 0

    def _call_macro(self, template, role, idx, members, c):
        plain = native.render_item(role, idx, members, c)
        self.native += plain is not None
        self.macro += plain is None
        try:
            out = template.macro("render_item")(role, idx, members, c)
        except jinja2.TemplateError:
            assert plain is None, (role, members, c)  # what the macro refuses is never rendered natively
            return super()._call_macro(template, role, idx, members, c)  # its RenderError
        assert plain is None or plain == _parse_marked(str(out))[1:], (role, members, c)
        return super()._call_macro(template, role, idx, members, c)


def test_the_packaged_template_renders_natively() -> None:
    assert load_template("deepseek_v4.1").native is native.render_item


def test_an_edited_template_renders_with_its_macro() -> None:
    source = template_source("deepseek_v4.1")
    assert native.for_source(source) is native.render_item
    edited = source.replace("'<tool_result>'", "'<tool_output>'", 1)
    assert edited != source and native.for_source(edited) is None
    assert ChatTemplate("edited", edited).native is None
    assert native.for_source(source.replace("{%- macro render_item(", "{%- macro other(", 1)) is None


def test_it_can_be_turned_off(monkeypatch) -> None:
    monkeypatch.setattr(native, "ENABLED", False)  # GATEWAY_RENDER_NATIVE=0 (process_switches.py)
    assert native.for_source(template_source("deepseek_v4.1")) is None


@pytest.mark.parametrize("seed", range(400))
def test_random_requests_render_the_same_items(seed: int) -> None:
    body, opts = random_request(random.Random(seed))
    r = Both(opts, cache=SegmentCache())
    try:
        rendered = r.render(body, opts)
    except RenderError:
        return
    assert rendered.prompt == r.render_template(body, opts)
    r.render_generated(body, {"role": "assistant", "content": "ok", "reasoning_content": "hm",
                              "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": '{"a": 1, "b": "x"}'}}]}, opts)


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20) | st.sampled_from(
    ["", "<｜deepseek_image｜>", "<think>", "a\n\nb", "<tool_result>", "｜DSML｜", "\"quoted\""])
VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6)


@st.composite
def messages(draw) -> list[dict]:
    out: list[dict] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(TEXT | st.none())})
    for _ in range(draw(st.integers(1, 8))):
        role = draw(st.sampled_from(["user", "assistant", "tool", "tool", "developer", "system"]))
        if role == "assistant":
            m: dict = {"role": "assistant", "content": draw(TEXT | st.none())}
            if draw(st.booleans()):
                m["reasoning_content"] = draw(TEXT | st.none())
            if draw(st.booleans()):
                m["tool_calls"] = [{"id": draw(st.sampled_from(["c1", "c2", "", "c3"])), "type": "function",
                                    "function": {"name": draw(TEXT),
                                                 "arguments": json.dumps(draw(st.dictionaries(TEXT, VALUE,
                                                                                              max_size=3)))}}
                                   for _ in range(draw(st.integers(0, 3)))]
            out.append(m)
        elif role == "tool":
            m = {"role": "tool", "content": draw(TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                                                        "text": TEXT}), max_size=2))}
            if draw(st.booleans()):
                m["tool_call_id"] = draw(st.sampled_from(["c1", "c2", "c3", "x"]))
            out.append(m)
        else:
            out.append({"role": role, "content": draw(TEXT)})
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.booleans(), st.sampled_from([None, "low", "max", 1, 77]), st.booleans(),
       st.sampled_from([None, [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]]),
       st.sampled_from([None, {"type": "json_object"}]))
def test_generated_messages_render_the_same_items(msgs, thinking, effort, drop, tools, rf) -> None:
    opts = RenderOptions(thinking=thinking, reasoning_effort=effort, drop_thinking=drop)
    body: dict = {"messages": msgs}
    if tools:
        body["tools"] = tools
    if rf:
        body["response_format"] = rf
    r = Both(opts, cache=SegmentCache())
    try:
        rendered = r.render(body, opts)
    except RenderError as exc:  # the same error as the full template's
        with pytest.raises(RenderError) as full:
            r.render_template(body, opts)
        assert str(full.value) == str(exc)
        return
    assert rendered.prompt == r.render_template(body, opts)


def test_an_agent_conversation_renders_natively() -> None:
    """The plain shapes of an agent's conversation never reach the macro."""
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    msgs: list[dict] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]
    for k in range(5):
        msgs.append({"role": "assistant", "content": "", "reasoning_content": f"Look {k}.",
                     "tool_calls": [{"id": f"c{k}", "type": "function",
                                     "function": {"name": "read_file", "arguments": json.dumps({"path": f"a{k}.py",
                                                                                                "n": k})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"line {k}\n"})
    for opts in (RenderOptions(engine="vllm"), RenderOptions(thinking=False)):
        r = Both(opts, cache=SegmentCache())
        r.render({"messages": msgs, "tools": tools}, opts)
        assert r.macro == 0 and r.native > 0


def test_an_image_placeholder_in_text_is_the_macros_error() -> None:
    opts = RenderOptions()
    r = Renderer(opts, cache=SegmentCache())
    body = {"messages": [{"role": "user", "content": "see <｜deepseek_image｜> here"}]}
    with pytest.raises(RenderError) as got:
        r.render(body, opts)
    assert got.value.param == "messages[0].content"
