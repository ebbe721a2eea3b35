"""Estimated (template-less) lanes and the render CLI helper."""

from __future__ import annotations

import json

import pytest

from gateway.render import RenderError, RenderOptions
from gateway.render.cli import render_command, render_request
from gateway.render.estimate import Estimator, encoding, normalised_digest

BODY = {
    "messages": [
        {"role": "system", "content": "You are a helper."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"b": 1, "a": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
    ],
    "tools": [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}],
}


def test_estimate_shape():
    r = Estimator().render(BODY)
    assert r.exact is False
    assert [s.message_index for s in r.segments] == [-1, 0, 1, 2, 3]
    assert r.segments[0].role == "prefix"
    assert "[image]" in r.segments[2].text
    enc = encoding()
    assert list(r.segments[1].token_ids) == enc.encode_ordinary(r.segments[1].text)
    assert Estimator.estimated_prompt_tokens(r) > r.n_tokens


def test_normalised_digest_ignores_key_order_but_not_values():
    a = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}]}
    b = {"tool_calls": [{"function": {"arguments": '{"b": 2, "a": 1}', "name": "f"}}], "role": "assistant"}
    c = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1, "b": 3}'}}]}
    assert normalised_digest(a) == normalised_digest(b) != normalised_digest(c)


def test_estimate_finds_the_changed_message():
    r1 = Estimator().render(BODY)
    body2 = json.loads(json.dumps(BODY))
    body2["messages"][3]["content"] = "a dog"
    r2 = Estimator().render(body2)
    diff = [a.message_index for a, b in zip(r1.segments, r2.segments) if a.digest != b.digest]
    assert diff == [3]


def test_estimate_rejects_unknown_role():
    with pytest.raises(RenderError) as ei:
        Estimator().render({"messages": [{"role": "robot", "content": "x"}]})
    assert ei.value.param == "messages[0].role"


def test_render_command(tmp_path):
    p = tmp_path / "req.json"
    p.write_text(json.dumps({**BODY, "reasoning_effort": "max"}))
    prompt = render_command(str(p), RenderOptions(), summary=False)
    assert prompt.startswith("<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 100 ")
    summary = render_command(str(p), RenderOptions(), summary=True)
    lines = summary.splitlines()
    assert lines[0].startswith("template deepseek_v4.1  thinking on  effort 100")
    n = render_request({**BODY, "reasoning_effort": "max"}, RenderOptions()).n_tokens
    assert f"tokens {n} " in lines[1]
    rows = [ln.split() for ln in lines[3:]]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert rows[-1][2].endswith(f"-{n}")
    est = render_command(str(p), RenderOptions(template=""), summary=True)
    assert "estimate" in est.splitlines()[0]


def test_render_command_reports_bad_input(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "<｜deepseek_image｜>"}]}))
    with pytest.raises(RenderError) as ei:
        render_command(str(p), RenderOptions(), summary=True)
    assert ei.value.param == "messages[0].content"
