"""A generated coding-agent conversation: exactness and incremental cost over its turns; the
template's compatibility with vLLM's content-format detection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from gateway.render import Renderer, RenderOptions, SegmentCache
from gateway.render.template import template_source
from gateway.render.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
TOOL = SHARED / "tools" / "make_agent_corpus.py"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    if not TOOL.exists():
        pytest.skip(f"{TOOL} not found")
    out = tmp_path_factory.mktemp("corpus") / "agent.json"
    subprocess.run([sys.executable, str(TOOL), "--messages", "200", "--approx-tokens", "40000", "-o", str(out)],
                   check=True, capture_output=True)
    return json.loads(out.read_text())


def test_corpus_exact(corpus):
    opts = RenderOptions(reasoning_effort=corpus.get("reasoning_effort"))
    r = Renderer(opts, cache=SegmentCache())
    got = r.render(corpus, opts)
    assert got.prompt == r.render_template(corpus, opts)
    assert got.token_ids == list(load_tokenizer().encode(got.prompt))


def test_corpus_append_only_turns_tokenize_only_new_segments(corpus):
    opts = RenderOptions(reasoning_effort="high")
    msgs = corpus["messages"]
    bounds = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    r = Renderer(opts, cache=SegmentCache())
    r.render({**corpus, "messages": msgs[: bounds[0]]}, opts)
    prev = None
    for b in bounds[1:]:
        turn = {**corpus, "messages": msgs[:b]}
        got = r.render(turn, opts)
        if prev is not None:
            new_msgs = b - prev
            # only the new assistant message and the new tool/user group are rendered and tokenized
            assert got.render_misses <= new_msgs and got.token_misses <= new_msgs
        prev = b
    fresh = Renderer(opts, cache=SegmentCache()).render({**corpus, "messages": msgs[: bounds[-1]]}, opts)
    assert got.token_ids == fresh.token_ids


def test_generated_output_tokens_are_reused_next_turn(corpus):
    """render_generated's tokens serve the next turn's copy of the assistant message."""
    opts = RenderOptions(reasoning_effort="high")
    msgs = corpus["messages"]
    bounds = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    cache = SegmentCache()
    r = Renderer(opts, cache=cache)
    b = bounds[3]
    t1 = r.render({**corpus, "messages": msgs[:b]}, opts)
    gen = r.render_generated({**corpus, "messages": msgs[:b]}, msgs[b], opts)
    t2 = r.render({**corpus, "messages": msgs[: b + 2]}, opts)
    assert t2.prompt.startswith(t1.prompt + gen.text)
    assert t2.segments[len(t1.segments)].text == gen.text
    assert t2.token_misses == 1  # the new tool result only


def _content_format(source: str) -> str:
    """vLLM's chat-template content-format detection (vllm/entrypoints/chat_utils.py), condensed."""
    ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)

    def access(node, var, key=None):
        if key is None:
            if isinstance(node, jinja2.nodes.Name):
                return node.name == var
            if isinstance(node, (jinja2.nodes.Getitem, jinja2.nodes.Slice)):
                return access(node.node, var)
            if isinstance(node, jinja2.nodes.Filter):
                return node.node is not None and access(node.node, var)
            return False
        if isinstance(node, jinja2.nodes.Getitem):
            return access(node.node, var) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        if isinstance(node, jinja2.nodes.Getattr):
            return access(node.node, var) and node.attr == key
        return False

    names = ["messages"]
    for a in ast.find_all(jinja2.nodes.Assign):
        if isinstance(a.target, jinja2.nodes.Name) and any(access(a.node, n) for n in names):
            names.append(a.target.name)
    msg_vars = [f.target.name for f in ast.find_all(jinja2.nodes.For) if any(access(f.iter, n) for n in names)]
    for f in ast.find_all(jinja2.nodes.For):
        if any(access(f.iter, v, "content") for v in msg_vars):
            return "openai"
    return "string"


def test_vllm_sees_openai_content_format():
    source = template_source("deepseek_v4.1")
    assert _content_format(source) == "openai"
