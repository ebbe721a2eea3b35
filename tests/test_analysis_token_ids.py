"""Compare content, not counts: prompt ids the engine reports (vLLM return_token_ids) against the render,
and output that re-tokenizes differently named as such instead of eviction."""

from __future__ import annotations

import dataclasses

from gateway.conversations.analysis import analyse
from gateway.conversations.job import Job
from gateway.conversations.state import ConversationState
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions

OPTS = RenderOptions(engine="vllm", reasoning_effort=50, drop_thinking=False)
RENDERER = Renderer(OPTS)
BODY = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]}
OUT = {"role": "assistant", "content": "Seven.", "reasoning_content": "Small prime."}


def _job(body: dict, usage: dict, **kw) -> Job:
    return Job(request_id="r", lane="l", lane_render=OPTS, options=OPTS, block_size=1, engine="vllm",
               prefill_tokens_per_s=1000.0, body=body, generated=OUT, finish_reason="stop", usage=usage,
               thinking=True, effort=50, rewritten=None, replica=None, rehomed=False, repinned=False,
               state=ConversationState("c", "new"), **kw)


def test_prompt_ids_are_compared_when_the_engine_says_them() -> None:
    ids = RENDERER.render(BODY, OPTS).token_ids
    _, cache, _, _ = analyse(_job(BODY, {"prompt_tokens": len(ids)}, prompt_token_ids=list(ids)), BODY,
                             ConversationState("c", "new"), RENDERER, None)
    assert cache.render_check == "token_ids" and cache.render_matches_engine is True
    other = [*ids[:-2], ids[-1], ids[-2]]  # same length, other content: a count check would pass it
    _, cache, _, _ = analyse(_job(BODY, {"prompt_tokens": len(ids)}, prompt_token_ids=other), BODY,
                             ConversationState("c", "new"), RENDERER, None)
    assert cache.render_matches_engine is False and cache.render_first_difference == len(ids) - 2
    _, cache, _, _ = analyse(_job(BODY, {"prompt_tokens": len(ids)}), BODY, ConversationState("c", "new"),
                             RENDERER, None)
    assert cache.render_check == "count" and cache.render_matches_engine is True


def test_output_that_retokenizes_differently_is_not_an_eviction() -> None:
    ids = RENDERER.render(BODY, OPTS).token_ids
    gen = RENDERER.render_generated(BODY, OUT, OPTS).token_ids
    engine_gen = [*gen[:3], 5, *gen[4:]]  # the engine generated other ids for the same text
    state, _, _, _ = analyse(_job(BODY, {"prompt_tokens": len(ids)}, generated_token_ids=engine_gen), BODY,
                             ConversationState("c", "new"), RENDERER, None)
    assert state.last is not None and state.last.retokenized_at == len(ids) + 3
    body2 = {"messages": [*BODY["messages"], OUT, {"role": "user", "content": "Another."}]}
    held = len(ids) + 3
    _, cache, div, _ = analyse(_job(body2, {"prompt_tokens": 99, "prompt_tokens_details": {"cached_tokens": held}}),
                               body2, dataclasses.replace(state), RENDERER, None)
    assert cache.verdict == "drift" and cache.cause == "output_retokenized", cache
    assert div is not None and div.cause == "output_retokenized"
