"""The render check against the engine's prompt ids, and the block keys, read only what a turn adds
when the previous turn's are known (conversations/render_check.py, analysis._block_keys): the results
are the full comparison's, whatever the ids, their JSON's spacing or the edits between turns."""

from __future__ import annotations

import json
from array import array

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.conversations import render_check
from gateway.conversations.analysis import analyse_job
from gateway.conversations.drift import common_prefix
from gateway.conversations.job import Job
from gateway.conversations.memo import memos
from gateway.conversations.state import ConversationState
from gateway.render.cache import SegmentCache
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions

OPTS = RenderOptions(engine="vllm", reasoning_effort=50, drop_thinking=False)
IDS = st.lists(st.integers(0, 129_000), max_size=40)


def _full(engine: list[int], ours: list[int]) -> tuple[bool, int | None]:
    return (True, None) if engine == ours else (False, common_prefix(engine, ours))


@settings(max_examples=300, deadline=None)
@given(before=IDS, engine_tail=IDS, ours_tail=IDS, cut=st.integers(0, 40), spaced=st.booleans(),
       common_short=st.booleans())
def test_a_check_from_the_previous_turn_decides_as_the_whole_comparison(
        before: list[int], engine_tail: list[int], ours_tail: list[int], cut: int, spaced: bool,
        common_short: bool) -> None:
    dumps = (lambda v: json.dumps(v).encode()) if spaced else orjson.dumps
    first = render_check.check(dumps(before), None, array("I", before), 0, None)
    assert first.matches and first.checked is not None and first.checked.tokens == len(before)
    engine = before[:len(before) - cut] + engine_tail if cut else before + engine_tail  # history edited or kept
    ours = before + ours_tail
    common = len(before) - 1 if common_short and before else len(before)
    got = render_check.check(dumps(engine), None, array("I", ours), common, first.checked)
    assert (got.matches, got.first_difference) == _full(engine, ours)
    if got.matches:
        again = render_check.check(dumps(engine + [7]), None, array("I", ours + [7]), len(ours), got.checked)
        assert again.matches


def test_what_is_not_a_list_of_ids_matches_nothing() -> None:
    ours = array("I", [1, 2, 3])
    for engine in (b"[1,2,-3]", b"[1,2,1e99]", b'{"a":1}', b"[1,2", b"", b'[1,2,"3"]', b"[1,2,99999999999]"):
        got = render_check.check(engine, None, ours, 0, None)
        assert not got.matches and got.checked is None, engine


def _session_jobs():
    """An agent session's turns, each with the engine's ids of its prompt (JSON) as vLLM returns them."""
    messages = [{"role": "system", "content": "You are an agent. " + "lorem ipsum " * 300},
                {"role": "user", "content": "Fix the tests."}]
    ids_of = Renderer(OPTS, cache=SegmentCache())
    for turn in range(6):
        said = {"role": "assistant", "content": f"Step {turn} done.", "reasoning_content": "Thought."}
        body = {"messages": list(messages), "model": "m"}
        prompt = orjson.dumps(ids_of.render(body, OPTS).token_ids)
        yield body, said, prompt
        messages += [said, {"role": "user", "content": f"Now part {turn}: " + "dolor sit " * 50}]


def _run(fresh_memo_each_turn: bool) -> list[tuple[dict, bytes | None]]:
    memos().clear()
    renderer = Renderer(OPTS, cache=SegmentCache())
    stored: bytes | None = None
    out = []
    for body, said, prompt in _session_jobs():
        if fresh_memo_each_turn:
            memos().clear()
        state = ConversationState.from_bytes(stored) if stored else ConversationState("c", "new")
        job = Job(request_id="r", lane="l", lane_render=OPTS, options=OPTS, block_size=16, engine="vllm",
                  prefill_tokens_per_s=1000.0, body=orjson.dumps(body), generated=said, finish_reason="stop",
                  usage={"prompt_tokens": 1, "completion_tokens": 3}, thinking=True, effort=50, rewritten=None,
                  replica=None, rehomed=False, repinned=False, state=state, prompt_token_ids=prompt,
                  kv_block_size=16)
        job.stored = stored
        outcome = analyse_job(job, renderer, None)
        stored = outcome.data
        out.append((outcome.cache, outcome.kv_keys))
    memos().clear()
    return out


def test_a_session_with_its_memo_is_judged_and_keyed_as_without() -> None:
    with_memo, without = _run(False), _run(True)
    assert with_memo == without
    assert all(cache.render_matches_engine is True for cache, _ in with_memo)
    assert all(keys for _, keys in with_memo)
