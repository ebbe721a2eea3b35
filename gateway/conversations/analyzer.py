"""After each response: render it, compare with the previous turn, predict and judge the cache.

Runs in the aftermath queue, never before the first byte. The CPU part (render, tokenize, compare:
`analyse`, a pure function of a Job) runs in a worker process by default (worker.py), so the
event loop never waits for the GIL behind it; GATEWAY_ANALYSIS=thread runs it in a thread of this
process instead. The store reads and writes run on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import orjson

from ..pipeline import token_ids
from ..core.exchange import Exchange
from ..heal.saved import tokens_saved
from ..render.normalize import json_digest, template_response_format, tools_digest
from ..render.options import options_for_lane
from ..render.renderer import Rendered, RenderError, Renderer, RenderOptions, Segment, effective_effort
from ..render.told import read as read_options
from ..render.tokenizer import load_tokenizer
from ..core.runtime import LaneRuntime
from ..store import StateStore
from .alerts import AlertBook
from .drift import Comparison, Divergence, NewTurn, classify, common_prefix, compare, old_tokens_at
from .identity import anchor_keys, message_digest, request_tail
from . import handoff, inline, rawbody
from .job import Job, Outcome
from .memo import TurnMemo, memos
from .memo import cost as memo_cost
from .found import Found
from .prints import message_prints, segment_prints
from .state import ConversationState, Head, MessagePrints, SegmentPrints, TurnPrint
from .worker import AnalysisProcess
from ..prefixcache import SharedPrefixes, key_block

log = logging.getLogger("gateway.drift")


class TurnEnd:
    """The moment a response ends: anchors and head, so the client's next turn finds its
    conversation, turn number and pins even before this turn's analysis is done."""

    def __init__(self, store: StateStore, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._tasks: set[asyncio.Task[None]] = set()

    def exchange_ended(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        found: Found | None = ex.conversation
        if found is None or lane is None or ex.status != 200 or ex.cancelled or ex.error_code:
            return
        task = asyncio.get_running_loop().create_task(self._write(ex, found, lane.name, lane.config.engine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, ex: Exchange, found: Found, lane: str, lane_engine: str) -> None:
        state = found.state
        n = len((ex.chat or {}).get("messages") or ())
        head = Head(state.turn + 1, ex.effort_applied, ex.thinking_applied, ex.replica, n, state.source, lane,
                    state.created)
        value = f"{state.id}|{state.turn + 1}".encode()
        try:
            await self.store.set("head:" + state.id, head.to_bytes(), self.ttl_s)
            for key in _anchors(ex.tenant, ex.generated.as_message(), n, lane_engine):
                await self.store.set(key, value, self.ttl_s)
        except Exception:  # never let bookkeeping hurt anyone; the analyzer writes state later
            log.exception("writing the head of %s failed", state.id)


class Analyzer:
    def __init__(self, store: StateStore, alerts: AlertBook, ttl_s: float, threads: int = 1,
                 process: AnalysisProcess | None = None, kv_events: Any = None,
                 inline_max_bytes: int = 0, shared: SharedPrefixes | None = None) -> None:
        self.store = store
        self.shared = shared
        self.kv_events = kv_events  # issue 20: gateway.kvevents.service.KVEventsService, or None
        self.alerts = alerts
        self.ttl_s = ttl_s
        self.process = process  # None: analyse in threads of this process
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="analysis")
        self.analysed = 0
        self.failures = 0
        self.last_ms = 0.0
        self.placement = inline.Placement(inline_max_bytes)  # tiny turns on a quiet lane: on the event loop
        self.inline = 0  # turns analysed there
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def __call__(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        found: Found | None = ex.conversation
        if found is None or lane is None:
            return
        if ex.status != 200 or ex.cancelled or ex.error_code:
            ex.cache = _unknown("request did not complete")
            return
        t0 = time.perf_counter()
        cid = found.state.id
        async with self._lock(cid):
            stored = await self.store.get("conv:" + cid)
            here = self.placement.here(ex, lane, self.process, cid, new=stored is None)
            job = make_job(ex, lane, found, in_process=self.process is None)
            job.stored = stored
            if here:
                job.body = handoff.pack(job.body, None)  # the forwarded bytes, as the worker reads them
            elif self.process is not None:
                job.seed_tokens = self.placement.seeds(cid, lane, stored)  # a conversation leaving the loop
                if stored is not None and job.state.last is not None:
                    # The worker reads the previous turn's print from `stored` (the same or a newer one):
                    # sent once, the job pickles in half the time on both sides (~13 -> 6 us here,
                    # ~18 -> 9 us to load for a small agent turn; far more for a long session's print).
                    job.state = dataclasses.replace(job.state, last=None, last_cache=None)
                    job.last_in_stored = True
            try:
                if here:
                    outcome = analyse_job(job, lane.renderer, lane.estimator)
                    self.placement.analysed_here(cid)
                    self.inline += 1
                elif self.process is not None:
                    outcome = await self.process.run(job)
                else:
                    renderer, estimator = lane.renderer, lane.estimator
                    outcome = await asyncio.get_running_loop().run_in_executor(
                        self.executor, analyse_job, job, renderer, estimator)
            except Exception:
                self.failures += 1
                log.exception("analysis of %s failed", ex.request_id)
                ex.cache = _unknown("analysis failed")
                return
            # What the replica holds from other conversations (prefixcache/): a first turn's prediction.
            if self.shared is not None and self.shared.apply(ex, lane, outcome):
                # A first turn's verdict changed: its state says so too (once per conversation).
                state = ConversationState.from_bytes(outcome.data)
                state.last_cache = outcome.cache
                outcome.data = state.to_bytes()
            # Ground truth from the engine's KV-cache events (gateway/kvevents).
            if self.kv_events is not None:
                try:
                    self.kv_events.judge(ex, lane, found.state, outcome)
                except Exception:  # the count-based verdict stands
                    log.exception("kv-event verdict of %s failed", ex.request_id)
            # ----------------------------------------------------------------------------------------------
            ex.cache = outcome.cache
            saved = outcome.cache.get("healed_tokens") or {}
            for healed in ex.healed:
                healed.tokens_saved = saved.get(healed.kind, 0)
            await self._save(ex, lane, found.state.id, outcome, job.stored)
        self.analysed += 1
        self.last_ms = (time.perf_counter() - t0) * 1000
        ex.analysis_ms = round(self.last_ms, 3)

    def _lock(self, cid: str) -> asyncio.Lock:
        lock = self._locks.get(cid)
        if lock is None:
            lock = self._locks[cid] = asyncio.Lock()
        return lock

    async def _save(self, ex: Exchange, lane: LaneRuntime, cid: str, outcome: Outcome,
                    read: bytes | None = None) -> None:
        current = await self.store.get("conv:" + cid)
        # The state the analysis read (`read`) is older than its outcome: only another one is parsed.
        if current is not None and current is not read and current != read and \
                orjson.loads(current)["t"] >= outcome.turn:
            return  # another process already stored a later turn: never move the state back
        await self.store.set("conv:" + cid, outcome.data, self.ttl_s)
        ex.state_bytes = len(outcome.data)
        if outcome.divergence is not None and outcome.cache["tokens_lost"] >= 0:
            await self.alerts.raise_alert(ex, lane.name, outcome.divergence, outcome.cache, outcome.snippets)


def make_job(ex: Exchange, lane: LaneRuntime, found: Found, in_process: bool = True) -> Job:
    """The turn as plain data; for the worker process, the body is the JSON that was forwarded
    (a memory copy to send, where pickling the parsed body would cost the event loop milliseconds)."""
    cfg = lane.config
    routing = ex.routing
    body: dict[str, Any] | bytes = ex.chat or {}
    if not in_process:
        # A chat request's view is the body as forwarded; a Responses request's is its mapping
        # (gateway/pipeline/responses_chat.py), serialised here (measured 0.1-0.5 ms per MB with orjson).
        body = ex.forwarded if ex.chat is ex.body and ex.forwarded is not None else orjson.dumps(body)
    return Job(
        request_id=ex.request_id, lane=lane.name,
        lane_render=lane.renderer.defaults if lane.renderer is not None else None,
        options=_options(lane, ex), block_size=cfg.cache.block_size, engine=cfg.engine,
        prefill_tokens_per_s=cfg.cache.prefill_tokens_per_s, body=body,
        generated=ex.generated.as_message(), finish_reason=ex.generated.finish_reason, usage=ex.usage,
        thinking=ex.thinking_applied, effort=ex.effort_applied,
        rewritten=ex.limits.history_rewritten, replica=ex.replica,
        # The router says this turn runs away from the conversation's cache (see routing/base.py).
        rehomed=isinstance(routing, dict) and bool(routing.get("expected_cold")),
        repinned=found.repinned, state=found.state, healed=tuple((h.kind, i) for h in ex.healed for i in h.indices),
        prompt_token_ids=ex.generated.prompt_token_ids, generated_token_ids=ex.generated.token_ids or None,
        token_ids_why=token_ids.why_counts(ex),  # token ids (issue 13)
        # The render's block keys: for the KV-event index and the model of the replica's cache.
        kv_block_size=key_block(cfg),
        rejoined=ex.conversation_source == "lineage_rejoined",
    )


def analyse_job(job: Job, renderer: Renderer | None, estimator: Any) -> Outcome:
    """Compare with the freshest previous turn (another worker or process may have moved on);
    decoding and encoding the ~100 KB state happens here too, off the event loop. The previous
    turn's memo (memo.py), when this process has it, spares re-reading the unchanged history."""
    state = job.state
    token_ids.parse_job(job)  # token ids (issue 13): the prompt's ids, parsed here off the event loop
    if job.seed_tokens:  # the previous render's ids, from the process that analysed it (inline.py)
        cache = renderer.cache if renderer is not None else getattr(estimator, "cache", None)
        if cache is not None:
            cache.put_tokens(job.seed_tokens)
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
    if isinstance(job.body, bytes):
        read = rawbody.read(job.body, memo.body_print, memo.messages) if memo is not None else rawbody.read(job.body)
        body = read.body if read is not None else orjson.loads(job.body)
        if read is not None and read.unchanged and memo is not None and memo.engine == job.engine:
            reuse = _Reuse(memo.previous, read.unchanged, memo.prints, memo.estimated)
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
        book.put(state.id, TurnMemo(read.print, body["messages"], previous, new_state.last.messages, job.engine, data,
                                    new_state, memo_cost(len(job.body), previous, read.print, estimated), estimated))
    return Outcome(cache, new_state.turn, data, divergence, snippets, out.get("kv_keys"), out.get("kv_ends"))


class _Reuse(NamedTuple):
    """The previous turn's render and message fingerprints, for a body whose first `unchanged`
    messages are the previous body's byte for byte."""

    previous: Any  # Previous | None
    unchanged: int
    prints: MessagePrints
    estimated: Rendered | None = None  # the previous turn's estimate, on a lane without a template


def analyse(job: Job, body: dict[str, Any], state: ConversationState, renderer: Renderer | None,
            estimator: Any, out: dict[str, Any] | None = None, reuse: _Reuse | None = None,
            ) -> tuple[ConversationState, dict[str, Any], Divergence | None, tuple[str, str] | None]:
    options = job.options
    generated_msg = job.generated
    rendered: Rendered | None = None
    generated = None
    if renderer is not None:
        try:
            if reuse is not None and reuse.previous is not None:
                rendered, generated = renderer.render_turn(body, generated_msg, options, reuse.previous, reuse.unchanged)
            else:
                rendered, generated = renderer.render_turn(body, generated_msg, options)
            if out is not None:
                out["rendered"] = rendered
        except RenderError as exc:
            log.info("cannot render %s on lane %s: %s", job.request_id, job.lane, exc)
            rendered = None
    if rendered is None:
        if estimator is None:
            return _next_state(job, state, None), _unknown("no renderer for this lane"), None, None
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
    cache = {
        "predicted_cached_tokens": predicted,
        "reported_cached_tokens": reported,
        "verdict": verdict,
        "cause": divergence.cause if divergence else ("rehomed" if verdict == "cold" and old is not None else None),
        "divergence_message_index": divergence.message_index if divergence else None,
        "divergence_field": divergence.field if divergence else None,
        "lcp_tokens": cmp.lcp_tokens if cmp else 0,
        "tokens_lost": tokens_lost,
        "seconds_lost": round(tokens_lost / job.prefill_tokens_per_s, 3),
        "rendered_prompt_tokens": n,
        "render": "exact" if rendered.exact else "estimated",
        "repinned": job.repinned,
    }
    if job.healed:
        segs = [(s.message_index, len(s.token_ids)) for s in rendered.segments]
        cache["healed_tokens"] = tokens_saved(segs, predicted, job.healed)  # by kind
    if job.prompt_token_ids is not None and rendered.exact:
        # The engine said which ids it prefilled: compare content, not counts.
        ours = rendered.token_ids
        cache["render_check"] = "token_ids"
        cache["render_matches_engine"] = job.prompt_token_ids == ours
        if not cache["render_matches_engine"]:
            cache["render_first_difference"] = common_prefix(job.prompt_token_ids, ours)
    elif job.usage and isinstance(job.usage.get("prompt_tokens"), int) and rendered.exact:
        cache["render_check"] = "count"  # the engine gave no ids: a same-length difference would pass unseen
        cache["render_matches_engine"] = job.usage["prompt_tokens"] == n
        cache["render_check_why"] = job.token_ids_why  # token ids (issue 13)
    if out is not None and job.kv_block_size and rendered.exact:
        out["kv_keys"] = _block_keys(rendered, generated, job.kv_block_size)
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
        return options.thinking, effective_effort(RenderOptions(thinking=True, reasoning_effort=options.reasoning_effort,
                                                                effort_map=options.effort_map))
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


def _block_keys(rendered: Rendered, generated: Segment | None, block_size: int) -> bytes:
    """Issue 20: the engine's blocks of this turn (prompt, then the output as the next turn will render
    it) named as the KV-event index names them. ~10 ms for 480K tokens (gateway/kvevents/chain.py)."""
    from array import array

    from ..kvevents.chain import keys

    ids = rendered.token_array
    if generated is not None and rendered.exact:
        ids.extend(generated.token_ids if isinstance(generated.token_ids, array) else array("I", generated.token_ids))
    return array("Q", keys(ids, block_size)).tobytes()


def _message_ends(rendered: Rendered, n_messages: int) -> bytes:
    """Issue 20: render tokens through each request message (for routing by the KV-event index)."""
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


def _anchors(tenant: str, generated_msg: dict[str, Any], n_messages: int, engine: str) -> list[str]:
    """What the client's next turn will carry as its latest assistant message, at its position."""
    return anchor_keys(message_digest(generated_msg, engine), n_messages, tenant)


def _options(lane: LaneRuntime, ex: Exchange) -> RenderOptions:
    """This turn's render options: the body as forwarded, read the way the lane's engine reads it
    (render/told.py; `gateway render` goes through the same function)."""
    base = lane.renderer.defaults if lane.renderer is not None else options_for_lane(lane.config)
    return read_options(ex.chat or {}, base)


def _tokens_of(renderer: Renderer | None, options: RenderOptions):
    if renderer is None:
        return lambda digest, length: None
    path = load_tokenizer(options.tokenizer_path).path

    def tokens_of(digest: int, length: int):
        return renderer.cache.get_tokens([(path, digest, length)])[0]

    return tokens_of


def _char_offset(rendered: Rendered, cmp: Comparison, options: RenderOptions, old: TurnPrint | None = None,
                 tokens_of=None) -> int:
    """The first differing *character* in the break segment: where the first differing token starts,
    plus the characters the two differing tokens still share (a token can straddle the change, e.g.
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
    return min(base + shared, max(0, len(seg.text) - 1))


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
    olds = old.segments.digests + old.generated.digests
    lens = old.segments.lengths + old.generated.lengths
    before = ""
    if cmp.segment < len(olds):
        ids = tokens_of(olds[cmp.segment], lens[cmp.segment])
        if ids is not None:
            before = tok.decode(list(ids)[max(0, k - width): k + width])
    return before[:200], after[:200]


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
    olds = old.segments.digests + old.generated.digests
    lens = old.segments.lengths + old.generated.lengths
    before = ""
    if cmp.segment < len(olds):
        ids = tokens_of(olds[cmp.segment], lens[cmp.segment])
        if ids is not None:
            before = enc.decode(list(ids)[max(0, k - 16): k + 16]) if cmp.exact else enc.decode(list(ids)[:32])
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



def _unknown(why: str) -> dict[str, Any]:
    return {"predicted_cached_tokens": None, "reported_cached_tokens": None, "verdict": "unknown", "cause": None,
            "divergence_message_index": None, "divergence_field": None, "tokens_lost": 0, "seconds_lost": 0.0,
            "rendered_prompt_tokens": None, "render": "none", "note": why}
