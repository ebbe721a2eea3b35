"""What the engine is told and what it renders from it: one code path (gateway/render/told.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.core.config import Lane
from gateway.render.cli import render_request
from gateway.render.options import options_for_lane
from gateway.render.checks import effective_effort
from gateway.render.renderer import Renderer
from gateway.render.told import read, tell, untold
from tests.support.routes import lane_config

MSGS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "next"}]


def _lane(engine: str, **render) -> Lane:
    return lane_config(engine=engine, render=render)


def test_vllm_is_told_the_number_and_drop_thinking() -> None:
    lane = _lane("vllm", effort_map={"low": 20, "high": 75}, drop_thinking=False)
    body = {"messages": MSGS, "reasoning_effort": "high"}
    tell(body, lane, True, 75)
    # A top-level word would override chat_template_kwargs in vLLM's build_chat_params: it must go.
    assert "reasoning_effort" not in body
    assert body["chat_template_kwargs"] == {"thinking": True, "enable_thinking": True, "reasoning_effort": 75,
                                            "drop_thinking": False}
    opts = read(body, options_for_lane(lane))
    assert (opts.thinking, effective_effort(opts), opts.drop_thinking) == (True, 75, False)
    # The engine's template, given exactly these kwargs, renders what the gateway predicts.
    text = Renderer().render_template(body, opts)
    assert "Reasoning Effort: 75" in text and "r</think>" in text


def test_request_drop_thinking_wins_on_vllm_and_is_ignored_on_sglang() -> None:
    body = {"messages": MSGS, "chat_template_kwargs": {"drop_thinking": True}}
    v, s = _lane("vllm", drop_thinking=False), _lane("sglang", drop_thinking=False)
    bv, bs = dict(body), dict(body)
    tell(bv, v, True, 50)
    tell(bs, s, True, 50)
    assert read(bv, options_for_lane(v)).drop_thinking is True  # request kwargs beat server defaults
    assert read(bs, options_for_lane(s)).drop_thinking is False  # SGLang's encoder is never told


def test_sglang_gets_a_word_or_the_number() -> None:
    lane = _lane("sglang")
    body = {"messages": MSGS}
    tell(body, lane, True, 75)
    assert body["reasoning_effort"] == "xhigh"
    tell(body, lane, True, 37)
    assert body["reasoning_effort"] == 37
    assert effective_effort(read(body, options_for_lane(lane))) == 37


def test_gateway_render_and_analysis_share_the_reading() -> None:
    lane = _lane("vllm", effort_map={"low": 20, "high": 75})
    body = {"messages": MSGS, "reasoning_effort": "low"}
    r = render_request(body, options_for_lane(lane), lane=lane)
    assert r.prompt.startswith("<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 20 ")


def test_untold_settings_are_reported(tmp_path: Path) -> None:
    assert untold(_lane("vllm", drop_thinking=False)) == []
    assert any("drop_thinking" in p for p in untold(_lane("sglang", drop_thinking=False)))
    routes = tmp_path / "routes.yaml"
    routes.write_text("lanes:\n  s:\n    engine: sglang\n    replicas: ['http://127.0.0.1:1']\n"
                      "    upstream_model: m\n    qualification: not_required\n"
                      "    render: {drop_thinking: false}\nmodels: {m: s}\n")
    out = subprocess.run([sys.executable, "-m", "gateway.cli", "check", str(routes)], capture_output=True,
                         text=True, timeout=60)
    warning = next(line for line in out.stdout.splitlines() if "warning:" in line)
    assert out.returncode == 0 and "lanes.s.render" in warning and "drop_thinking" in warning
