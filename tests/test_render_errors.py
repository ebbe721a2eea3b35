"""Bad input becomes a RenderError naming the field; extra cases the golden set leaves out."""

from __future__ import annotations

import json
import threading

import pytest

from gateway.render import Renderer, RenderError, RenderOptions, SegmentCache, effective_effort
from gateway.render.tokenizer import load_tokenizer

PH = "<｜deepseek_image｜>"
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def r() -> Renderer:
    return Renderer(RenderOptions(), cache=SegmentCache())


def _err(r: Renderer, body: dict, opts: RenderOptions | None = None) -> RenderError:
    with pytest.raises(RenderError) as ei:
        r.render(body, opts or RenderOptions())
    return ei.value


def _asst(args) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": args}}]}


# -- errors ---------------------------------------------------------------------------------------


def test_unknown_role(r):
    e = _err(r, {"messages": [{"role": "user", "content": "a"}, {"role": "function", "content": "x"}]})
    assert e.param == "messages[1].role"


@pytest.mark.parametrize("args", ["[1, 2]", "3", '"s"', "null", "{", "", [1], 5])
def test_non_object_arguments(r, args):
    e = _err(r, {"messages": [{"role": "user", "content": "a"}, _asst(args)]})
    assert e.param == "messages[1].tool_calls[1].function.arguments"


@pytest.mark.parametrize("effort", ["turbo", "HIGH", 0, 101, True, 50.0, -1, "", [50]])
@pytest.mark.parametrize("thinking", [True, False])
def test_invalid_effort(r, effort, thinking):
    opts = RenderOptions(thinking=thinking, reasoning_effort=effort)
    e = _err(r, {"messages": [{"role": "user", "content": "a"}]}, opts)
    assert e.param == "reasoning_effort"
    with pytest.raises(RenderError):
        effective_effort(opts)
    if isinstance(effort, (str, int, float)):  # the template itself refuses it too (engine path)
        with pytest.raises(RenderError) as ei:
            r.render_template({"messages": [{"role": "user", "content": "a"}]}, opts)
        assert ei.value.param == "reasoning_effort"


@pytest.mark.parametrize(
    "messages,param",
    [
        ([{"role": "user", "content": f"look {PH} here"}], "messages[0].content"),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                          {"type": "text", "text": PH}]}],
         "messages[1].content[1].text"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": PH}],
         "messages[1].reasoning_content"),
        ([{"role": "user", "content": "a"}, _asst("{}"), {"role": "tool", "tool_call_id": "c1",
                                                          "content": [{"type": "text", "text": "x" + PH}]}],
         "messages[2].content[0].text"),
        # also in a developer message that the thinking pass deletes (the reference validates it too)
        ([{"role": "developer", "content": PH}, {"role": "user", "content": "a"}], "messages[0].content"),
    ],
)
def test_image_placeholder_in_text(r, messages, param):
    e = _err(r, {"messages": messages})
    assert e.param == param
    with pytest.raises(RenderError) as ei:
        r.render_template({"messages": messages}, RenderOptions())
    assert ei.value.param == param


@pytest.mark.parametrize(
    "messages,param",
    [
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": {"type": "text", "text": "a"}}], "messages[0].content"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": ["a"]}], "messages[0].content[0]"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0].image_url"),
        ([{"role": "user", "content": "a"}, {"role": "tool", "content": None}], "messages[1].content"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": 3}],
         "messages[1].reasoning_content"),
        ([{"role": "user", "content": "a"}, {"role": "developer", "content": ""}], "messages[1].content"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}],
         "messages[1].tool_calls[0]"),
        (["hello"], "messages[0]"),
    ],
)
def test_wrong_content(r, messages, param):
    assert _err(r, {"messages": messages}, RenderOptions(thinking=False)).param == param


def test_bad_envelope(r):
    assert _err(r, {"messages": []}).param == "messages"
    assert _err(r, {}).param == "messages"
    assert _err(r, {"messages": [{"role": "user", "content": "a"}],
                    "tools": [{"type": "function"}]}).param == "tools[0]"


def test_error_maps_to_openai_400(r):
    e = _err(r, {"messages": [{"role": "user", "content": PH}]})
    ge = e.to_gateway_error()
    assert ge.status == 400
    body = ge.body()["error"]
    assert body["param"] == "messages[0].content" and body["type"] == "invalid_request_error"
    assert "messages[0].content" in body["message"]


# -- extra cases ----------------------------------------------------------------------------------


def test_empty_tool_list_is_no_tools(r):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
            {"role": "user", "content": "more"}]
    a = r.render({"messages": msgs, "tools": []})
    b = r.render({"messages": msgs})
    assert a.prompt == b.prompt
    assert "## Tools" not in a.prompt and a.segments[0].message_index == 0
    # without tools the thinking pass drops the earlier reasoning
    assert "r</think>" not in a.prompt and "<｜Assistant｜></think>a" in a.prompt


def test_image_parts_in_tool_results(r):
    body = {"messages": [
        {"role": "user", "content": "screenshot please"},
        _asst('{"path": "a.png"}'),
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "here"},
                                                           {"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "first"},
    ], "tools": TOOLS}
    p = r.render(body).prompt
    assert p.endswith(f"<｜User｜><tool_result>first</tool_result>\n\n<tool_result>here\n\n{PH}</tool_result>"
                      "<｜Assistant｜><think>")
    ids = r.render(body).token_ids
    assert ids.count(load_tokenizer().token_to_id(PH)) == 1


def test_arguments_as_dict_equal_string(r):
    args = {"path": "x.py", "n": 3, "deep": {"a": [1, "ü"]}, "flag": False}
    s = r.render({"messages": [{"role": "user", "content": "a"}, _asst(json.dumps(args))], "tools": TOOLS})
    d = r.render({"messages": [{"role": "user", "content": "a"}, _asst(args)], "tools": TOOLS})
    assert s.prompt == d.prompt
    assert '<｜DSML｜ parameter name="path" string="true">x.py</｜DSML｜ parameter>' in s.prompt
    assert '<｜DSML｜ parameter name="deep" string="false">{"a": [1, "ü"]}</｜DSML｜ parameter>' in s.prompt
    assert '<｜DSML｜ parameter name="flag" string="false">false</｜DSML｜ parameter>' in s.prompt


@pytest.mark.parametrize("effort", [1, 100])
def test_effort_bounds(r, effort):
    p = r.render({"messages": [{"role": "user", "content": "a"}]}, RenderOptions(reasoning_effort=effort)).prompt
    assert p.startswith(f"<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: {effort} (range 1-100")
    assert effective_effort(RenderOptions(reasoning_effort=effort)) == effort
    assert effective_effort(RenderOptions(reasoning_effort=effort, thinking=False)) is None


def test_custom_effort_map():
    card = {"low": 50, "high": 75, "max": 100}
    rr = Renderer(RenderOptions(effort_map=card), cache=SegmentCache())
    body = {"messages": [{"role": "user", "content": "a"}]}
    p = rr.render(body).prompt
    assert "Reasoning Effort: 75 " in p  # default "high" through the lane's map
    assert rr.render_template(body) == p
    with pytest.raises(RenderError):
        rr.render(body, RenderOptions(effort_map=card, reasoning_effort="xhigh"))


def test_chat_mode_has_no_effort_line(r):
    p = r.render({"messages": [{"role": "user", "content": "a"}]}, RenderOptions(thinking=False)).prompt
    assert p == "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜></think>"


def test_system_then_assistant_share_a_segment(r):
    body = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "assistant", "content": "Hi."},
                         {"role": "user", "content": "ok"}]}
    got = r.render(body, RenderOptions(thinking=False))
    assert got.segments[0].message_indices == (0, 1)
    assert got.token_ids == list(load_tokenizer().encode(got.prompt))


def test_engine_render_has_no_marker_and_honours_add_generation_prompt(r):
    from gateway.render.template import load_template

    t = load_template("deepseek_v4.1")
    msgs = [{"role": "user", "content": "a"}]
    with_gp = t.render(messages=msgs, thinking=True, add_generation_prompt=True)
    without = t.render(messages=msgs, thinking=True, add_generation_prompt=False)
    assert with_gp == without + "<｜Assistant｜><think>"
    assert "\x00" not in with_gp
    # chat mode is the template default (no thinking kwarg)
    assert t.render(messages=msgs, add_generation_prompt=True).endswith("<｜Assistant｜></think>")


def test_marked_full_render_splits_like_segments(r):
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                         _asst('{"x": 1}'), {"role": "tool", "tool_call_id": "c2", "content": "t2"},
                         {"role": "tool", "tool_call_id": "c1", "content": "t1"}], "tools": TOOLS}
    marker = "\x00MK\x00"
    marked = r.render_template(body, segment_marker=marker)
    parts = marked.split(marker)
    starts = [p for p in parts[1::2] if p.startswith("s")]
    assert starts == ["s0", "s1", "s2", "s3"]
    text = "".join(parts[0::2])
    assert text == r.render(body).prompt


def test_concurrent_renders_agree():
    body = {"messages": [{"role": "user", "content": f"question {i}"} for i in range(3)]}
    rr = Renderer(RenderOptions(), cache=SegmentCache())
    expected = Renderer(RenderOptions(), cache=SegmentCache()).render(body).token_ids
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(rr.render(body).token_ids)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and all(x == expected for x in results)


def test_tiny_cache_budget_stays_exact():
    cache = SegmentCache(budget_bytes=2000)
    rr = Renderer(RenderOptions(), cache=cache)
    big = Renderer(RenderOptions(), cache=SegmentCache())
    msgs = [{"role": "user", "content": "x" * 500}]
    for i in range(6):
        msgs = msgs + [{"role": "assistant", "content": "y" * 300}, {"role": "user", "content": f"q{i}" * 100}]
        assert rr.render({"messages": msgs}).token_ids == big.render({"messages": msgs}).token_ids
        assert cache.bytes <= 2000
    assert cache.stats().evictions > 0
