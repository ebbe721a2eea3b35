"""The engine's prompt ids cut into the render's segments (render/engine_ids.py): where they spell the
render, a new long conversation is analysed without tokenising it; anything else tokenises as before,
with the same result."""

from __future__ import annotations

import orjson
import pytest

from gateway.conversations.analysis import analyse, analyse_job
from gateway.conversations.job import Job
from gateway.conversations.state import ConversationState
from gateway.render.cache import SegmentCache
from gateway.render.renderer import ENGINE_IDS_MIN_CHARS, Renderer
from gateway.render.result import RenderOptions
from gateway.render.tokenizer import load_tokenizer
from tests.support.agent_bodies import agent_body

OPTS = RenderOptions(engine="vllm", reasoning_effort=50, drop_thinking=False)
SAID = {"role": "assistant", "content": "Done.", "reasoning_content": "Looked."}
BODY = agent_body(40, 0)  # ~100K characters: system, tools, tool calls and results, non-ASCII text


def _fresh() -> Renderer:
    return Renderer(OPTS, cache=SegmentCache())


def _tokenised(body: dict = BODY):
    return _fresh().render_turn(body, SAID, OPTS)[0]


def test_ids_that_spell_the_render_are_cut_into_its_segments() -> None:
    want = _tokenised()
    got, _ = _fresh().render_turn(BODY, SAID, OPTS, engine_ids=want.token_ids)
    assert got.engine_cut == len(got.segments) > 10 and got.token_misses == 0
    assert [list(s.token_ids) for s in got.segments] == [list(s.token_ids) for s in want.segments]
    assert got.prompt == want.prompt


def test_segments_the_cache_knows_are_kept_and_the_rest_cut() -> None:
    renderer = _fresh()
    head = {**BODY, "messages": BODY["messages"][:10]}
    renderer.render_turn(head, SAID, OPTS)  # the first quarter tokenised and cached
    want = _tokenised()
    got, _ = renderer.render_turn(BODY, SAID, OPTS, engine_ids=want.token_ids)
    assert 0 < got.engine_cut < len(got.segments)
    assert got.token_ids == want.token_ids


@pytest.mark.parametrize("change", ["other text", "same text, other ids", "unknown id", "negative id",
                                    "cut short", "one id more"])
def test_ids_that_do_not_spell_the_render_are_not_used(change: str) -> None:
    want = _tokenised()
    ids = list(want.token_ids)
    tok = load_tokenizer()
    if change == "other text":  # the engine rendered something else (a template difference)
        ids[len(ids) // 2] = tok.encode(" zebra")[0]
    elif change == "same text, other ids":  # a tokenizer of another make: a common word spelled in pieces
        common = max((t for t in set(ids) if len(tok.decode([t]).strip()) >= 3), key=ids.count)
        word = tok.decode([common])
        pieces = list(tok.encode(word[:1])) + list(tok.encode(word[1:]))
        assert len(word) >= 2 and pieces != [common]
        ids = [p for t in ids for p in (pieces if t == common else [t])]
    elif change == "unknown id":
        ids[5] = tok.vocab_size + 1000
    elif change == "negative id":
        ids[5] = -1
    elif change == "cut short":
        ids = ids[:-1]
    else:
        ids = [*ids, ids[-1]]
    got, _ = _fresh().render_turn(BODY, SAID, OPTS, engine_ids=ids)
    assert got.engine_cut == 0
    assert got.token_ids == want.token_ids


def test_a_small_prompt_is_tokenised() -> None:
    small = agent_body(3, 0)
    want = _tokenised(small)
    assert len(want.prompt) < ENGINE_IDS_MIN_CHARS
    got, _ = _fresh().render_turn(small, SAID, OPTS, engine_ids=want.token_ids)
    assert got.engine_cut == 0 and got.token_ids == want.token_ids


def _job(prompt_token_ids: bytes | None) -> Job:
    return Job(request_id="r", lane="l", lane_render=OPTS, options=OPTS, block_size=16, engine="vllm",
               prefill_tokens_per_s=1000.0, body=orjson.dumps(BODY), generated=SAID, finish_reason="stop",
               usage={"prompt_tokens": 1, "completion_tokens": 2}, thinking=True, effort=50, rewritten=None,
               replica=None, rehomed=False, repinned=False, state=ConversationState("c", "new"),
               prompt_token_ids=prompt_token_ids)


def test_the_analysis_of_a_new_conversation_reads_the_engines_ids() -> None:
    ids = _tokenised().token_ids
    with_ids = analyse_job(_job(orjson.dumps(ids)), _fresh(), None)
    assert with_ids.cache.render_check == "token_ids" and with_ids.cache.render_matches_engine is True
    assert with_ids.cache.rendered_prompt_tokens == len(ids)
    without = analyse_job(_job(None), _fresh(), None)
    assert ConversationState.from_bytes(with_ids.data).last == ConversationState.from_bytes(without.data).last
    # the next turn compares against a print made from the engine's ids as from the tokenizer's
    body2 = {**BODY, "messages": [*BODY["messages"], SAID, {"role": "user", "content": "Go on."}]}
    state = ConversationState.from_bytes(with_ids.data)
    j = _job(None)
    j.body = body2
    _, cache, _, _ = analyse(j, body2, state, _fresh(), None)
    assert cache.verdict in ("unknown", "hit") and cache.lcp_tokens >= len(ids)
