"""Golden vectors: every DeepSeek-V4.1 case renders byte for byte with the exact token ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gateway.render import Renderer, RenderOptions, SegmentCache
from gateway.render.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
GOLDEN = SHARED / "golden"
CASES = sorted((GOLDEN / "dsv41").glob("*.json"))
TURNS = sorted((GOLDEN / "dsv41_turns").glob("*.json"))

pytestmark = pytest.mark.skipif(not CASES, reason=f"no golden files under {GOLDEN}")


def _opts(req: dict) -> RenderOptions:
    return RenderOptions(thinking=req["thinking"], reasoning_effort=req["reasoning_effort"],
                         drop_thinking=req["drop_thinking"])


def _body(req: dict) -> dict:
    return {"messages": req["messages"], "tools": req.get("tools"), "response_format": req.get("response_format")}


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(RenderOptions(), cache=SegmentCache())


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_prompt_and_ids(renderer: Renderer, path: Path) -> None:
    case = json.loads(path.read_text())
    r = renderer.render(_body(case), _opts(case))
    assert r.prompt == case["expected_prompt"]
    assert r.token_ids == case["expected_token_ids"]
    assert r.n_tokens == case["expected_token_count"]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_full_template_render(renderer: Renderer, path: Path) -> None:
    """The engine's path (one template render of the whole request) gives the same bytes."""
    case = json.loads(path.read_text())
    assert renderer.render_template(_body(case), _opts(case)) == case["expected_prompt"]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_cold_equals_warm(path: Path) -> None:
    case = json.loads(path.read_text())
    r = Renderer(RenderOptions(), cache=SegmentCache())
    cold = r.render(_body(case), _opts(case))
    warm = r.render(_body(case), _opts(case))
    assert warm.render_misses == 0 and warm.token_misses == 0
    assert warm.prompt == cold.prompt and warm.token_ids == cold.token_ids


@pytest.mark.parametrize("path", CASES + TURNS, ids=lambda p: p.stem)
def test_segments_tokenize_like_the_whole(renderer: Renderer, path: Path) -> None:
    data = json.loads(path.read_text())
    tok = load_tokenizer()
    reqs = [data] if "expected_prompt" in data else [data["turn1"], data["turn2"]]
    for req in reqs:
        r = renderer.render(_body(req), _opts(req))
        whole = list(tok.encode(r.prompt))
        assert r.token_ids == whole
        for s in r.segments:
            assert list(s.token_ids) == list(tok.encode(s.text))
            for name, a, b in s.fields:
                assert 0 <= a <= b <= len(s.text), name
        assert tok.decode(r.token_ids) == r.prompt


@pytest.mark.parametrize("path", TURNS, ids=lambda p: p.stem)
def test_turn_pair(renderer: Renderer, path: Path) -> None:
    d = json.loads(path.read_text())
    r1 = renderer.render(_body(d["turn1"]), _opts(d["turn1"]))
    r2 = renderer.render(_body(d["turn2"]), _opts(d["turn2"]))
    assert r1.prompt == d["turn1_prompt"]
    assert r2.prompt == d["turn2_prompt"]
    assert r1.token_ids == d["turn1_prompt_token_ids"]
    assert r2.token_ids == d["turn2_prompt_token_ids"]
    g = renderer.render_generated(_body(d["turn1"]), d["assistant_output"], _opts(d["turn1"]))
    assert g.text == d["turn1_generated_text"]
    assert list(g.token_ids) == d["turn1_generated_token_ids"]
    assert g.message_index == len(d["turn1"]["messages"]) and g.role == "assistant"

    # Stability and divergence, computed from segments.
    t1 = r1.prompt + g.text
    t2 = r2.prompt
    assert t2.startswith(t1) == d["stable"]
    lcp = next((i for i in range(min(len(t1), len(t2))) if t1[i] != t2[i]), min(len(t1), len(t2)))
    assert lcp == d["lcp_chars"]
    ids1 = r1.token_ids + list(g.token_ids)
    lcp_t = next((i for i in range(min(len(ids1), len(r2.token_ids))) if ids1[i] != r2.token_ids[i]),
                 min(len(ids1), len(r2.token_ids)))
    assert lcp_t == d["lcp_tokens"]
    div = None
    if not d["stable"]:
        pos = 0
        for s in r2.segments:
            if pos + len(s.text) > lcp:
                div = s.message_index
                break
            pos += len(s.text)
    assert div == d["divergence_message_index"]


def test_segment_indices_and_generation_header(renderer: Renderer) -> None:
    case = json.loads((GOLDEN / "dsv41" / "10_agent_loop_tools.json").read_text())
    r = renderer.render(_body(case), _opts(case))
    idx = [s.message_index for s in r.segments]
    # system, user, assistant, merged tool results (3,4), assistant, tool, assistant, tool, assistant, user
    assert idx == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10]
    assert r.segments[3].message_indices == (3, 4)
    assert r.segments[1].text.endswith("<｜Assistant｜><think>")
    names = [f[0] for f in r.segments[0].fields]
    assert names[:4] == ["bos", "header", "effort", "content"] and "tools" in names
    s = r.segments[1]
    gh = [f for f in s.fields if f[0] == "generation_header"]
    assert gh and s.text[gh[0][1]:gh[0][2]] == "<｜Assistant｜><think>"
    a = r.segments[2]
    spans = {n: a.text[x:y] for n, x, y in a.fields}
    assert spans["reasoning_content"].startswith("Start by reproducing")
    assert spans["tool_calls"].startswith("<｜DSML｜ calls>")
    assert spans["eos"] == "<｜end▁of▁sentence｜>"


def test_inserted_system_is_a_prefix_segment(renderer: Renderer) -> None:
    case = json.loads((GOLDEN / "dsv41" / "17_tools_without_system_message.json").read_text())
    r = renderer.render(_body(case), _opts(case))
    assert r.segments[0].message_index == -1 and r.segments[0].role == "prefix"
    assert r.segments[1].message_index == 0
    assert r.prompt == case["expected_prompt"]
