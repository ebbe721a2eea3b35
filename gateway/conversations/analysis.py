"""The analysis of one turn, a pure function of a Job: render the request, compare it with the
conversation's previous turn, predict the cached tokens and judge the engine's report. It runs in the
analysis worker process (worker.py), in a thread, or for a tiny turn on the event loop (inline.py);
the loop-side steps around it (the store, alerts, the shared prefix model) are in analyzer.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import orjson

from ..core.verdict import CacheVerdict
from ..heal.saved import tokens_saved
from ..pipeline.token_ids import parse_ids
from ..render.normalize import json_digest, template_response_format, tools_digest
from ..render.estimate import Estimator
from ..render.checks import effective_effort
from ..render.renderer import Renderer
from ..render.result import Rendered, RenderError, RenderOptions, Segment
from ..render.tokenizer import load_tokenizer
from .drift import Comparison, Divergence, NewTurn, classify, common_prefix, compare, old_tokens_at
from .identity import anchor_keys, message_digest, request_tail
from . import rawbody, render_check
from .job import Job, Outcome
from .memo import TurnMemo, memos
from .memo import cost as memo_cost
from .prints import message_prints, segment_prints
from .render_check import Checked
from .state import ConversationState, MessagePrints, SegmentPrints, TurnPrint

log = logging.getLogger("gateway.drift")


def analyse_job(job: Job, renderer: Renderer | None, estimator: "Estimator | None") -> Outcome:
    """Compare with the freshest previous turn (another worker or process may have moved on);
    decoding and encoding the ~100 KB state happens here too, off the event loop. The previous
    turn's memo (memo.py), when this process has it, spares re-reading the unchanged history."""
    state = job.state
    if job.seed_tokens:  # the previous render's ids, from the process that analysed it (inline.py)
        segments = renderer.cache if renderer is not None else estimator.cache if estimator is not None else None
        if segments is not None:
            segments.put_tokens(job.seed_tokens)
    book = memos()
    memo = book.take(state.id)
    if job.stored is not None:
        fresh = memo.state if memo is not None and memo.data == job.stored else ConversationState.from_bytes(job.stored)
        if fresh.turn >= state.turn:
            state = fresh
        elif job.last_in_stored:
            state.last = fresh.last  # the print the hot path found, or a newer one (Analyzer.__call__)
    reuse: _Reuse | None = None
    read = None
    body_size = 0  # the JSON's, for the memo's cost
    if isinstance(job.body, bytes):
        body_size = len(job.body)
        read = rawbody.read(job.body, memo.body_print, memo.messages) if memo is not None else rawbody.read(job.body)
        body = read.body if read is not None else orjson.loads(job.body)
        if read is not None and read.unchanged and memo is not None and memo.engine == job.engine:
            # What the memo's turn left for its next one holds only when that turn is the stored one.
            same = job.stored is not None and memo.data == job.stored and state is memo.state
            reuse = _Reuse(memo.previous, read.unchanged, memo.prints, memo.estimated,
                           memo.checked if same else None, memo.kv_keys if same else None)
    else:
        body = job.body
    out: dict[str, Any] = {}
    new_state, cache, divergence, snippets = analyse(job, body, state, renderer, estimator, out, reuse)
    data = new_state.to_bytes()
    rendered = out.get("rendered")
    if read is not None and new_state.last is not None and (rendered is not None or renderer is None):
        # A lane without a template keeps its memo too: the unchanged history's parse, fingerprints
        # and estimated segments are reused.
        previous = rendered.previous if rendered is not None else None
        estimated = out.get("estimated")
        kv_keys = out.get("kv_keys")
        book.put(state.id, TurnMemo(read.print, body["messages"], previous, new_state.last.messages, job.engine, data,
                                    new_state, memo_cost(body_size, previous, read.print, estimated, kv_keys),
                                    estimated, out.get("checked"), kv_keys))
    return Outcome(cache, new_state.turn, data, divergence, snippets, out.get("kv_keys"), out.get("kv_ends"))


class _Reuse(NamedTuple):
    """The previous turn's render and message fingerprints, for a body whose first `unchanged`
    messages are the previous body's byte for byte."""

    previous: Any  # Previous | None
    unchanged: int
    prints: MessagePrints
    estimated: Rendered | None = None  # the previous turn's estimate, on a lane without a template
    checked: Checked | None = None  # the previous turn's prompt ids found equal to its render
    kv_keys: bytes | None = None  # the previous turn's block keys (_block_keys)


def analyse(job: Job, body: dict[str, Any], state: ConversationState, renderer: Renderer | None,
            estimator: Any, out: dict[str, Any] | None = None, reuse: _Reuse | None = None,
            ) -> tuple[ConversationState, CacheVerdict, Divergence | None, tuple[str, str] | None]:
    options = job.options
    generated_msg = job.generated
    rendered: Rendered | None = None
    generated = None
    engine_ids: list[int] | None = None  # the engine's prompt ids, parsed (render_check.py)
    if renderer is not None:
        # Parsed unless the previous turn's check lets this one read only its new ids.
        engine_ids = job.prompt_token_ids if isinstance(job.prompt_token_ids, list) else \
            parse_ids(job.prompt_token_ids) if job.prompt_token_ids is not None and \
            (reuse is None or reuse.checked is None) else None
        try:
            if reuse is not None and reuse.previous is not None:
                rendered, generated = renderer.render_turn(body, generated_msg, options, reuse.previous,
                                                           reuse.unchanged, engine_ids)
            else:
                rendered, generated = renderer.render_turn(body, generated_msg, options, engine_ids=engine_ids)
            if out is not None:
                out["rendered"] = rendered
        except RenderError as exc:
            log.info("cannot render %s on lane %s: %s", job.request_id, job.lane, exc)
            rendered = None
    if rendered is None:
        if estimator is None:
            return _next_state(job, state, None), CacheVerdict.unknown("no renderer for this lane"), None, None
        if reuse is not None and reuse.estimated is not None:
            rendered = estimator.render(body, previous=reuse.estimated, unchanged=reuse.unchanged)
        else:
            rendered = estimator.render(body)
        if out is not None:
            out["estimated"] = rendered
        # Message-level analysis: what was generated is one more message in the next request.
        said = generated_msg if generated_msg.get("role") else {**generated_msg, "role": "assistant"}
        generated = estimator.segment(said, len(body.get("messages") or []))

    thinking, effort = _rendered_mode(options, job) if rendered.exact else (job.thinking, job.effort)
    prints = None
    if reuse is not None:
        prints = _message_prints(body.get("messages") or [], rendered.message_digests, job.engine, reuse)
    new = new_turn(body, thinking, effort, job.rewritten, rendered.message_digests, job.engine, prints)
    old = state.last
    block = job.block_size
    seg_prints = segment_prints(rendered.segments)  # once: compared here, kept in the turn's print
    n = seg_prints.total_tokens()
    reported = _reported_cached(job.usage, job.engine)
    divergence: Divergence | None = None
    snippets = None
    cmp: Comparison | None = None
    if old is None:
        predicted = 0
        verdict, tokens_lost = "cold", 0
    else:
        tokens_of = _tokens_of(renderer, options) if renderer is not None and rendered.exact else (
            estimator.tokens_of if estimator is not None else _tokens_of(None, options))
        cmp = compare(old, rendered, tokens_of, seg_prints)
        held = cmp.old_tokens - 1 if old.kv_tokens is None else min(cmp.old_tokens - 1, old.kv_tokens)
        usable = min(cmp.lcp_tokens, held, n - 1)
        predicted = max(0, usable) // block * block
        potential = max(0, min(held, n - 1)) // block * block
        if not cmp.stable:
            offset_chars = _char_offset(rendered, cmp, options, old, tokens_of)
            divergence = classify(old, new, rendered, cmp, offset_chars)
            if job.rejoined:  # the turn was found through an earlier answer: the client redid its last turn
                divergence = Divergence("client_retried_turn", divergence.message_index, divergence.field)
            snippets = _snippets(rendered, cmp, old, tokens_of, options) if rendered.exact else \
                _message_snippets(rendered, cmp, old, tokens_of)
            verdict, tokens_lost = "drift", max(0, potential - predicted)
        elif reported is None:
            verdict, tokens_lost = "unknown", 0
        elif reported < predicted and old.retokenized_at is not None and reported <= old.retokenized_at:
            # The engine cached the ids it generated; the output, sent back as text, renders to other ids
            # from this position on: not an eviction, and nobody's fault.
            verdict, tokens_lost = "drift", predicted - reported
            divergence = Divergence("output_retokenized", len(old.messages), None)
        elif reported < predicted and job.rehomed:
            # The router moved the conversation (re-homed): its cache stayed where it was.
            verdict, tokens_lost, predicted = "cold", predicted - reported, 0
        elif reported < predicted:
            verdict, tokens_lost = "eviction", predicted - reported
        else:
            verdict, tokens_lost = "hit", 0
    cache = CacheVerdict(
        verdict, predicted, reported,
        cause=divergence.cause if divergence else ("rehomed" if verdict == "cold" and old is not None else None),
        divergence_message_index=divergence.message_index if divergence else None,
        divergence_field=divergence.field if divergence else None,
        lcp_tokens=cmp.lcp_tokens if cmp else 0, tokens_lost=tokens_lost,
        seconds_lost=round(tokens_lost / job.prefill_tokens_per_s, 3), rendered_prompt_tokens=n,
        render="exact" if rendered.exact else "estimated", repinned=job.repinned)
    if job.healed:
        segs = [(s.message_index, len(s.token_ids)) for s in rendered.segments]
        cache.healed_tokens = tokens_saved(segs, predicted, job.healed)  # by kind
    if job.prompt_token_ids is not None and rendered.exact:
        # The engine said which ids it prefilled: compare content, not counts.
        checked = render_check.check(job.prompt_token_ids, engine_ids, rendered.token_array,
                                     cmp.lcp_tokens if cmp is not None else 0, reuse.checked if reuse else None)
        cache.render_check = "token_ids"
        cache.render_matches_engine = checked.matches
        if not checked.matches:
            cache.render_first_difference = checked.first_difference
        if out is not None:
            out["checked"] = checked.checked
    elif job.usage and isinstance(job.usage.get("prompt_tokens"), int) and rendered.exact:
        cache.render_check = "count"  # the engine gave no ids: a same-length difference would pass unseen
        cache.render_matches_engine = job.usage["prompt_tokens"] == n
        cache.render_check_why = job.token_ids_why  # why the engine gave no ids
    if out is not None and job.kv_block_size and rendered.exact:
        known = reuse.kv_keys if reuse is not None and cmp is not None else None
        out["kv_keys"] = _block_keys(rendered, generated, job.kv_block_size, known, cmp.lcp_tokens if cmp else 0)
        out["kv_ends"] = _message_ends(rendered, len(body.get("messages") or ()))
    last = turn_print(new, rendered, generated, generated_msg, request_tail(body.get("messages") or [], job.engine),
                      _kv_tokens(job, n), job.engine, seg_prints)
    last.retokenized_at = _retokenized_at(job, rendered, generated)
    new_state = _next_state(job, state, last)
    new_state.last_cache = cache
    return new_state, cache, divergence, snippets


def _rendered_mode(options: RenderOptions, job: Job) -> tuple[bool | None, int | str | None]:
    """(thinking, effort number) the engine renders this turn with, as the analysis reads the body."""
    try:
        return options.thinking, effective_effort(RenderOptions(
            thinking=True, reasoning_effort=options.reasoning_effort, effort_map=options.effort_map))
    except RenderError:
        return job.thinking, job.effort


def _next_state(job: Job, state: ConversationState, last: TurnPrint | None) -> ConversationState:
    return ConversationState(state.id, state.source, job.lane, state.created, time.time(), state.turn + 1,
                             job.effort, job.thinking, state.parent, job.replica, last)


def _message_prints(messages: list[dict[str, Any]], digests: list[int] | None, engine: str,
                    reuse: _Reuse) -> MessagePrints:
    """The fingerprints of the unchanged messages as they were, of the others computed."""
    u = min(reuse.unchanged, len(reuse.prints), len(messages))
    old = reuse.prints
    tail = message_prints(messages[u:], digests[u:] if digests is not None and len(digests) == len(messages) else None,
                          engine)
    return MessagePrints(old.roles[:u] + tail.roles, old.content[:u] + tail.content,
                         old.reasoning[:u] + tail.reasoning, old.tool_calls[:u] + tail.tool_calls,
                         old.tool_call_ids[:u] + tail.tool_call_ids, old.images[:u] + tail.images)


def new_turn(body: dict[str, Any], thinking: bool | None, effort: int | str | None,
             rewritten: dict | None = None, digests: list[int] | None = None, engine: str = "sglang",
             prints: MessagePrints | None = None) -> NewTurn:
    return NewTurn(
        messages=prints if prints is not None else message_prints(body.get("messages") or [], digests, engine),
        thinking=thinking,
        effort=effort,
        # What the engine's template sees (vLLM re-serialises tools and ignores a top-level
        # response_format), in the given key order (the template renders it in that order).
        tools_digest=tools_digest(engine, body.get("tools")),
        response_format_digest=json_digest(template_response_format(engine, body)),
        rewritten=rewritten,
    )


def turn_print(new: NewTurn, rendered: Rendered, generated: Segment | None, generated_msg: dict[str, Any],
               request_chain: int, kv_tokens: int | None = None, engine: str = "sglang",
               prints: SegmentPrints | None = None) -> TurnPrint:
    segments = prints if prints is not None else segment_prints(rendered.segments)
    return TurnPrint(
        segments=segments,
        generated=segment_prints([generated] if generated is not None else []),
        messages=new.messages,
        generated_message=message_prints([{**generated_msg, "role": "assistant"}], engine=engine),
        thinking=new.thinking,
        effort=new.effort,
        tools_digest=new.tools_digest,
        response_format_digest=new.response_format_digest,
        prompt_tokens=segments.total_tokens(),
        exact=rendered.exact,
        request_chain=request_chain,
        kv_tokens=kv_tokens,
        dropped=rendered.dropped,
    )


def _retokenized_at(job: Job, rendered: Rendered, generated: Segment | None) -> int | None:
    """Where the engine's generated ids (when it said them) part from the render of the output as the
    next turn sends it back: absolute token position, or None when they agree (or nobody knows)."""
    ids = job.generated_token_ids
    if not ids or generated is None or not rendered.exact:
        return None
    k = common_prefix(ids, list(generated.token_ids))
    return None if k >= min(len(ids), len(generated.token_ids)) else rendered.n_tokens + k


def _block_keys(rendered: Rendered, generated: Segment | None, block_size: int, known: bytes | None = None,
                common: int = 0) -> bytes:
    """The engine's blocks of this turn (prompt, then the output as the next turn will render
    it) named as the KV-event index names them (gateway/kvevents/chain.py), here off the event loop.
    `known`: the previous turn's keys, of which the blocks inside the first `common` ids (the
    comparison's common prefix with the previous turn) are this turn's too: a key names its block
    and every block before it."""
    from array import array

    from ..kvevents.chain import keys

    ids = rendered.token_array
    if generated is not None and rendered.exact:
        ids.extend(generated.token_ids if isinstance(generated.token_ids, array) else array("I", generated.token_ids))
    kept = array("Q")
    if known:
        kept.frombytes(known[:8 * min(common // block_size, len(known) // 8, len(ids) // block_size)])
    if not kept:
        return array("Q", keys(ids, block_size)).tobytes()
    n = len(kept)
    kept.extend(keys(ids[n * block_size:], block_size, parent=kept[-1]))
    return kept.tobytes()


def _message_ends(rendered: Rendered, n_messages: int) -> bytes:
    """Render tokens through each request message (for routing by the KV-event index)."""
    from array import array

    ends = array("I", bytes(4 * n_messages))
    total = 0
    for seg in rendered.segments:
        total += seg.n_tokens
        for m in seg.message_indices or (seg.message_index,):
            if 0 <= m < n_messages:
                ends[m] = total
    for i in range(1, n_messages):  # a message rendered as nothing ends where the one before it did
        ends[i] = max(ends[i], ends[i - 1])
    return ends.tobytes()


def _kv_tokens(job: Job, n_tokens: int) -> int | None:
    """The engine's KV extent after an output cut at max_tokens (see TurnPrint.kv_tokens)."""
    completion = (job.usage or {}).get("completion_tokens")
    if job.finish_reason != "length" or not isinstance(completion, int) or completion < 1:
        return None
    return n_tokens + completion - 1


def char_offset(rendered: Rendered, cmp: Comparison, options: RenderOptions, old: TurnPrint | None = None,
                tokens_of=None) -> int:
    return _char_offset(rendered, cmp, options, old, tokens_of)


def anchors(tenant: str, generated_msg: dict[str, Any], n_messages: int, engine: str) -> list[str]:
    """What the client's next turn will carry as its latest assistant message, at its position. An
    answer that is reasoning only is found by its reasoning, and also, at its position only, as the
    empty answer a client that strips reasoning sends back."""
    said = message_digest(generated_msg, engine)
    keys = anchor_keys(said, n_messages, tenant)
    if "reasoning" in generated_msg or "reasoning_content" in generated_msg:
        stripped = {k: v for k, v in generated_msg.items() if k not in ("reasoning", "reasoning_content")}
        bare = message_digest(stripped, engine)
        if bare != said:
            keys.append(anchor_keys(bare, n_messages, tenant)[0])
    return keys


def _tokens_of(renderer: Renderer | None, options: RenderOptions):
    if renderer is None:
        return lambda digest, length: None
    path = load_tokenizer(options.tokenizer_path).path

    def tokens_of(digest: int, length: int):
        return renderer.cache.get_tokens([(path, digest, length)])[0]

    return tokens_of


def _char_offset(rendered: Rendered, cmp: Comparison, options: RenderOptions, old: TurnPrint | None = None,
                 tokens_of=None) -> int:
    """The first differing *character*, counted from the break segment's start: where the first differing
    token starts, plus the characters the two differing tokens still share (a token can straddle the change, e.g.
    "\n" + "\n\n## Response" tokenizing as "\n\n\n": the change is after the tools block, not in it)."""
    seg = rendered.segments[cmp.segment] if cmp.segment is not None and cmp.segment < len(rendered.segments) else None
    if seg is None or not rendered.exact:
        return 0
    tok = load_tokenizer(options.tokenizer_path)
    base = len(tok.decode(list(seg.token_ids[: cmp.token_offset])))
    if old is None or tokens_of is None:
        return base
    old_ids = old_tokens_at(old, tokens_of, cmp.lcp_tokens, 8)
    if not old_ids:
        return base
    new_ids = list(seg.token_ids[cmp.token_offset: cmp.token_offset + 8])
    a, b = tok.decode(old_ids), tok.decode(new_ids)
    shared = 0
    for x, y in zip(a, b):
        if x != y:
            break
        shared += 1
    return base + shared  # may lie past the segment's end: the change starts in a later segment


def _snippets(rendered: Rendered, cmp: Comparison, old: TurnPrint, tokens_of, options: RenderOptions,
              width: int = 16) -> tuple[str, str] | None:
    """Short text around the break, from both renders (never whole prompts)."""
    if cmp.segment is None or cmp.segment >= len(rendered.segments) or not rendered.exact:
        return None
    tok = load_tokenizer(options.tokenizer_path)
    seg = rendered.segments[cmp.segment]
    k = cmp.token_offset
    new_ids = list(seg.token_ids)
    after = tok.decode(new_ids[max(0, k - width): k + width])
    ids = _old_segment_ids(old, cmp.segment, tokens_of)
    before = tok.decode(list(ids)[max(0, k - width): k + width]) if ids is not None else ""
    return before[:200], after[:200]


def _old_segment_ids(old: TurnPrint, segment: int, tokens_of) -> Any:
    """Token ids of the previous render's (+ output's) segment `segment`, if still at hand."""
    digests = old.segments.digests + old.generated.digests
    if segment >= len(digests):
        return None
    return tokens_of(digests[segment], (old.segments.lengths + old.generated.lengths)[segment])


def _message_snippets(rendered: Rendered, cmp: Comparison, old: TurnPrint, tokens_of,
                      width: int = 100) -> tuple[str, str] | None:
    """Template-less lanes: both snippets from the messages' canonical text (estimate.py) around the break."""
    if cmp.segment is None or cmp.segment >= len(rendered.segments):
        return None
    from ..render.estimate import encoding

    seg = rendered.segments[cmp.segment]
    enc = encoding()
    k = cmp.token_offset
    after = enc.decode(list(seg.token_ids)[max(0, k - 16): k + 16]) if cmp.exact else seg.text[:width]
    ids = _old_segment_ids(old, cmp.segment, tokens_of)
    before = "" if ids is None else enc.decode(list(ids)[max(0, k - 16): k + 16]) if cmp.exact else \
        enc.decode(list(ids)[:32])
    return before[:200], after[:200]


def _reported_cached(usage: dict[str, Any] | None, engine: str = "vllm") -> int | None:
    if not usage:
        return None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return details["cached_tokens"]
    if isinstance(usage.get("cached_tokens"), int):
        return usage["cached_tokens"]
    if engine == "sglang" and "prompt_tokens_details" in usage and details is None:
        return 0  # SGLang sends null details when nothing was cached
    return None
