"""The admission step of the request path: a new conversation is admitted only when the lane's pool can
hold it beside the active ones; otherwise the lane's `admission.policy` holds it (FIFO, up to `hold_s`,
woken by every turn that ends), refuses it with a Retry-After, or diverts it: sends it to the first of
its `divert_to` lanes whose own pool holds it (each later turn of it follows it there, where its prefix
is cached; runtime.Reroute), holding it meanwhile when none has room. Continuing conversations pass at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..core.errors import GatewayError
from ..core.exchange import AdmissionNote, Exchange
from ..core.runtime import LaneRuntime, Reroute
from ..pipeline.fallback import has_healthy_replica
from .sessions import ActiveSessions, Load

if TYPE_CHECKING:
    from ..core.config import Admission
    from ..kvevents.service import KVEventsService

# A JSON chat body carries roughly this many bytes per prompt token (when no exact count was made).
BYTES_PER_TOKEN = 4


class AdmissionPolicy:
    """A pipeline policy (after the conversation policy, which says whether the conversation is new) and a
    finisher (each ended turn updates what its conversation holds and wakes the held newcomers)."""

    name = "admission"
    per_lane = True

    def __init__(self, kv: "KVEventsService | None" = None, clock: Callable[[], float] = time.monotonic,
                 lanes: Callable[[], Mapping[str, LaneRuntime]] = dict) -> None:
        self.kv = kv
        self.clock = clock
        self.lanes = lanes  # the live lanes by name (the runtime's snapshot): where a newcomer may be diverted
        self.sessions = ActiveSessions()
        self._queues: dict[str, deque[object]] = {}
        self._changed = asyncio.Event()

    async def apply(self, ex: Exchange, lane: LaneRuntime, body: dict[str, Any]) -> None:
        found = ex.conversation
        cid = ex.conversation_id
        if found is None or cid is None:
            return  # nothing to protect: no conversation (completions, embeddings, an unread request)
        cfg = lane.config.admission
        now = self.clock()
        sent = ex.admission
        if sent is not None and sent.diverted_to == lane.name:
            self.sessions.begin(lane.name, cid, sent.need_tokens, now)  # its room here was judged by the sender
            return
        if cfg.policy == "divert" and not found.is_new:
            self._follow(found.state.lane, lane, cfg)
        if not found.is_new or cfg.policy == "admit":
            self.sessions.begin(lane.name, cid, self._need(ex, cfg), now)
            return
        note = await self._decide(ex, lane, cfg, cid)
        ex.admission = note
        if note.decision.startswith("refused"):
            raise self._refusal(lane, cfg, note)

    def _refusal(self, lane: LaneRuntime, cfg: "Admission", note: AdmissionNote) -> GatewayError:
        retry = self._retry_after(lane.name, cfg)
        return GatewayError(
            cfg.status, f"The lane is busy protecting the prompt cache of its active conversations: {note.reason}. "
            f"Retry after {retry} s.", code="cache_admission", type="rate_limit_error" if cfg.status == 429
            else None, headers={"Retry-After": str(retry)})

    def _follow(self, home: str | None, lane: LaneRuntime, cfg: "Admission") -> None:
        """A continuing conversation that was diverted goes on where its prefix is cached."""
        if home is None or home == lane.name or home not in cfg.divert_to:
            return
        there = self.lanes().get(home)
        if there is None or not has_healthy_replica(there):
            return  # gone or down: it goes on here (cold)
        raise Reroute(home, "diverted_conversation", GatewayError(
            503, f"The lane {home!r}, where this conversation was diverted and its prompt is cached, cannot "
            "serve it now.", code="cache_admission"))

    async def _decide(self, ex: Exchange, lane: LaneRuntime, cfg: "Admission", cid: str) -> AdmissionNote:
        need = self._need(ex, cfg)
        pool = self._pool(lane, cfg)
        start = self.clock()
        if pool is None:
            self.sessions.begin(lane.name, cid, need, start)
            return AdmissionNote("admitted", "the lane's pool size is unknown", need_tokens=need, lane=lane.name)
        queue = self._queues.setdefault(lane.name, deque())
        me = object()
        queue.append(me)
        held = False
        try:
            while True:
                now = self.clock()
                load = self.sessions.load(lane.name, cfg.idle_after_s, now, self._held(lane.name))
                waited = now - start
                # Alone in the pool it can only be admitted: waiting would not make room for it.
                fits = load.tokens + need <= pool or load.conversations == 0
                if fits and queue[0] is me:
                    self.sessions.begin(lane.name, cid, need, now)
                    decision = "admitted_after_hold" if held else "admitted"
                    return self._note(lane, decision, "the pool holds it beside the active conversations", waited,
                                      need, load, pool)
                why = (f"{load.conversations} active conversations hold {load.tokens:,} of the pool's {pool:,} "
                       f"tokens; this one needs {need:,}")
                if cfg.policy == "divert":
                    self._divert(lane, cfg, why, waited, need, load, pool, now)
                if cfg.policy == "refuse" or waited >= cfg.hold_s:
                    if cfg.policy != "refuse" and cfg.then == "admit":
                        self.sessions.begin(lane.name, cid, need, now)
                        return self._note(lane, "admitted_after_timeout", why, waited, need, load, pool)
                    return self._note(lane, "refused_after_hold" if held else "refused", why, waited, need, load,
                                      pool)
                # Woken by each turn that ends; at least every second for conversations going idle.
                changed = self._changed
                held = True
                try:
                    await asyncio.wait_for(changed.wait(), timeout=min(1.0, cfg.hold_s - waited))
                except TimeoutError:
                    pass
        finally:
            queue.remove(me)
            self._wake()  # the next in line looks again

    def _divert(self, lane: LaneRuntime, cfg: "Admission", why: str, waited: float, need: int, load: Load,
                pool: int, now: float) -> None:
        """Raises Reroute to the first `divert_to` lane that is up and whose pool holds the newcomer beside
        its own active conversations (a lane whose pool is unknown is taken at its word: the operator
        named it); returns when none has room."""
        for name in cfg.divert_to:
            there = self.lanes().get(name)
            if there is None or not has_healthy_replica(there):
                continue
            theirs = there.config.admission
            their_pool = self._pool(there, theirs)
            their_load = self.sessions.load(name, theirs.idle_after_s, now, self._held(name))
            if their_pool is None:
                room = f"{name}'s pool is unknown"
            elif their_load.tokens + need <= their_pool or their_load.conversations == 0:
                room = f"{name} holds it: {their_load.conversations} active conversations, {their_load.tokens:,} of " \
                       f"{their_pool:,} tokens"
            else:
                continue
            note = self._note(lane, "diverted", f"{why}; {room}", waited, need, load, pool)
            note.diverted_to = name
            raise Reroute(name, "cache_admission", self._refusal(lane, cfg, note), note)

    @staticmethod
    def _note(lane: LaneRuntime, decision: str, reason: str, waited: float, need: int, load: Any,
              pool: int) -> AdmissionNote:
        return AdmissionNote(decision, reason, waited_s=round(waited, 3), need_tokens=need, active_tokens=load.tokens,
                             pool_tokens=pool, active_conversations=load.conversations, lane=lane.name)

    def exchange_ended(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        cid = ex.conversation_id
        if lane is None or cid is None or ex.conversation is None:
            return
        note = ex.admission
        if note is not None and note.decision.startswith("refused"):
            return  # never began
        if not 200 <= ex.status < 300 and ex.conversation.is_new:
            self.sessions.drop(lane.name, cid)  # a new conversation that failed holds nothing
        else:
            usage = ex.usage if isinstance(ex.usage, dict) else {}
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            tokens = prompt + (completion or 0) if isinstance(prompt, int) else None
            self.sessions.end(lane.name, cid, tokens, self.clock())
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _need(self, ex: Exchange, cfg: "Admission") -> int:
        counted = ex.limits.prompt_tokens_counted
        tokens = counted["n"] if counted else ex.body_bytes // BYTES_PER_TOKEN
        return max(cfg.reserve_tokens, int(tokens))

    def _pool(self, lane: LaneRuntime, cfg: "Admission") -> int | None:
        if cfg.pool_tokens is not None:
            return cfg.pool_tokens
        if self.kv is None:
            return None
        pools = [r.pool_tokens if (r := self.kv.replica(lane.name, url)) is not None else None
                 for url in lane.config.replicas]
        return None if not pools or None in pools else sum(p for p in pools if p is not None)

    def _held(self, lane: str) -> Callable[[str], int | None] | None:
        kv = self.kv
        if kv is None:
            return None
        return lambda cid: kv.tokens_of(lane, cid)

    def _retry_after(self, lane: str, cfg: "Admission") -> int:
        soonest = self.sessions.next_idle_in(lane, cfg.idle_after_s, self.clock())
        return int(min(600, max(1, soonest if soonest is not None else cfg.hold_s)))
