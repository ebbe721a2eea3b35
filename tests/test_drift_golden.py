"""Every golden turn pair: the expected LCP in tokens, the message where it breaks, and the cause."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.conversations.analysis import _tokens_of, char_offset, new_turn, turn_print
from gateway.conversations.drift import classify, compare
from gateway.render.checks import effective_effort
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions

SHARED = Path(os.environ.get("GATEWAY_SHARED", Path(__file__).resolve().parents[2] / "shared"))
TURNS = sorted((SHARED / "golden" / "dsv41_turns").glob("*.json"))


def _options(turn: dict) -> RenderOptions:
    return RenderOptions(thinking=turn["thinking"], reasoning_effort=turn["reasoning_effort"],
                         drop_thinking=turn["drop_thinking"])


def _body(turn: dict) -> dict:
    return {"messages": turn["messages"], "tools": turn.get("tools"), "response_format": turn.get("response_format")}


@pytest.mark.parametrize("path", TURNS, ids=[p.stem for p in TURNS])
def test_turn_pair(path: Path) -> None:
    case = json.loads(path.read_text())
    renderer = Renderer()
    o1, o2 = _options(case["turn1"]), _options(case["turn2"])
    b1, b2 = _body(case["turn1"]), _body(case["turn2"])
    r1 = renderer.render(b1, o1)
    gen = renderer.render_generated(b1, case["assistant_output"], o1)
    e1 = effective_effort(RenderOptions(thinking=True, reasoning_effort=o1.reasoning_effort))
    e2 = effective_effort(RenderOptions(thinking=True, reasoning_effort=o2.reasoning_effort))
    old = turn_print(new_turn(b1, o1.thinking, e1), r1, gen, case["assistant_output"], 0)
    r2 = renderer.render(b2, o2)
    tokens_of = _tokens_of(renderer, o2)
    cmp = compare(old, r2, tokens_of)
    assert cmp.lcp_tokens == case["lcp_tokens"]
    assert cmp.stable == case["stable"]
    if case["stable"]:
        return
    div = classify(old, new_turn(b2, o2.thinking, e2), r2, cmp, char_offset(r2, cmp, o2, old, tokens_of))
    assert (div.message_index, div.cause) == (case["divergence_message_index"], case["cause"])


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=80),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=80))
def test_the_first_differing_segment_is_found_by_slices_as_by_a_loop(old: list, new: list) -> None:
    """drift._first_difference (slice comparisons) against the segment-by-segment loop it replaced."""
    from gateway.conversations.drift import _first_difference
    from gateway.conversations.state import SegmentPrints

    m = min(len(old), len(new))
    naive = next((k for k in range(m) if old[k] != new[k]), m)
    prints = [SegmentPrints([d for d, _ in x], [1] * len(x), [n for _, n in x]) for x in (old, new)]
    assert _first_difference(prints[0], prints[1], m) == naive
