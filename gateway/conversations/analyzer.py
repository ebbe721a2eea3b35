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
from typing import Any, Protocol

import orjson

from ..pipeline import token_ids
from ..pipeline.body_parts import Body
from ..core.exchange import Exchange
from ..core.verdict import CacheVerdict
from ..render.options import options_for_lane
from ..render.result import RenderOptions
from ..render.told import read as read_options
from ..core.runtime import LaneRuntime
from ..store import StateStore
from .alerts import AlertBook
from . import handoff, inline
from .job import Job, Outcome
from .found import Found
from .state import ConversationState
from .analysis import analyse_job
from .worker import AnalysisProcess
from ..prefixcache import SharedPrefixes, key_block

log = logging.getLogger("gateway.drift")


class TurnJudge(Protocol):
    """Ground truth of a turn's verdict from the engine's KV-cache events (kvevents.service.KVEventsService):
    it refines `outcome.cache` in place."""

    async def judge(self, ex: Exchange, lane: LaneRuntime, state: ConversationState, outcome: Outcome) -> object: ...


class Analyzer:
    def __init__(self, store: StateStore, alerts: AlertBook, ttl_s: float, threads: int = 1,
                 process: AnalysisProcess | None = None, kv_events: TurnJudge | None = None,
                 inline_max_bytes: int = 0, shared: SharedPrefixes | None = None) -> None:
        self.store = store
        self.shared = shared
        self.kv_events = kv_events
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
            ex.cache = CacheVerdict.unknown("request did not complete")
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
                    # sent once, not twice, the job's pickle and its load on the other side do half the
                    # work (far more than half for a long session's print).
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
                ex.cache = CacheVerdict.unknown("analysis failed")
                return
            # What the replica holds from other conversations (prefixcache/): a first turn's prediction.
            if self.shared is not None and await self.shared.judge(ex, lane, outcome):
                # A first turn's verdict changed: its state says so too (once per conversation).
                outcome.data = ConversationState.with_last_cache(outcome.data, outcome.cache)
            # Ground truth from the engine's KV-cache events (gateway/kvevents).
            if self.kv_events is not None:
                try:
                    await self.kv_events.judge(ex, lane, found.state, outcome)
                except Exception:  # the count-based verdict stands
                    log.exception("kv-event verdict of %s failed", ex.request_id)
            # ----------------------------------------------------------------------------------------------
            ex.cache = outcome.cache
            saved = outcome.cache.healed_tokens or {}
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
        if outcome.divergence is not None and outcome.cache.tokens_lost >= 0:
            await self.alerts.raise_alert(ex, lane.name, outcome.divergence, outcome.cache, outcome.snippets)


def make_job(ex: Exchange, lane: LaneRuntime, found: Found, in_process: bool = True) -> Job:
    """The turn as plain data; for the worker process, the body is the JSON that was forwarded
    (a memory copy to send, where pickling the parsed body would cost the event loop milliseconds)."""
    cfg = lane.config
    routing = ex.routing
    body: dict[str, Any] | Body = ex.chat or {}
    if not in_process:
        # A chat request's view is the body as forwarded; a Responses request's is its mapping
        # (gateway/pipeline/responses_chat.py), serialised here, after the answer has gone.
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
        rehomed=routing is not None and routing.expected_cold,
        repinned=found.repinned, state=found.state,
        healed=tuple((h.kind, i) for h in ex.healed if h.repairs_prefix for i in h.indices),
        prompt_token_ids=ex.generated.prompt_token_ids, generated_token_ids=ex.generated.token_ids or None,
        token_ids_why=token_ids.why_counts(ex),  # why the record compares counts, not ids
        # The render's block keys: for the KV-event index and the model of the replica's cache.
        kv_block_size=key_block(cfg),
        rejoined=ex.conversation_source == "lineage_rejoined",
    )


def _options(lane: LaneRuntime, ex: Exchange) -> RenderOptions:
    """This turn's render options: the body as forwarded, read the way the lane's engine reads it
    (render/told.py; `gateway render` goes through the same function)."""
    base = lane.renderer.defaults if lane.renderer is not None else options_for_lane(lane.config)
    return read_options(ex.chat or {}, base)
