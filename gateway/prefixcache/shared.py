"""Prediction from the model of each replica's cache: a conversation's first turn (or any turn with
nothing of its own to compare with) is predicted the longest prefix that the replica it goes to holds,
whoever stored it: a new session whose system prompt and tools equal another's gets the shared blocks.
After every analysed turn, its blocks (prompt, then the output as the next turn renders it) are held,
from when they were there (model.py): a first turn is credited only what was there when it was sent.
"""

from __future__ import annotations

import asyncio
import threading
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .model import ReplicaBlocks, key_block

if TYPE_CHECKING:
    from ..conversations.job import Outcome
    from ..core.exchange import Exchange
    from ..core.runtime import LaneRuntime


# A turn with more blocks than this is modelled on the model's own thread, not on the event loop.
LOOP_MAX_BLOCKS = 2048

# A lane that does not declare its pool (cache.pool_tokens) is modelled with this many blocks at most
# (4M tokens in 16-token blocks): beyond any engine's pool here, and the model's memory stays bounded.
UNDECLARED_POOL_BLOCKS = 1 << 18


class SharedPrefixes:
    def __init__(self) -> None:
        self.replicas: dict[tuple[str, str], ReplicaBlocks] = {}
        self.predicted_turns = 0  # first turns predicted from another conversation's blocks
        self._lock = threading.Lock()  # one turn at a time changes the model, on the loop or its thread
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefix-model")

    def replica(self, lane: "LaneRuntime", url: str) -> ReplicaBlocks:
        key = (lane.name, url)
        blocks = self.replicas.get(key)
        if blocks is None:
            pool = lane.config.cache.pool_tokens
            capacity = pool // key_block(lane.config) if pool else UNDECLARED_POOL_BLOCKS
            blocks = self.replicas[key] = ReplicaBlocks(capacity)
        return blocks

    async def judge(self, ex: "Exchange", lane: "LaneRuntime", outcome: "Outcome") -> bool:
        """`apply`, on the event loop for a short prompt when the model is free and no eviction batch
        can start, else on the model's own thread: a long prompt's blocks are dict work in proportion to
        it, and an eviction batch in proportion to the pool (tens of ms for a large one), which must not
        hold the event loop and every stream on it."""
        n = len(outcome.kv_keys or b"") // 8
        if n <= LOOP_MAX_BLOCKS and self._lock.acquire(blocking=False):
            try:
                if ex.replica is None or not self.replica(lane, ex.replica).may_evict(n):
                    return self._apply(ex, lane, outcome)
            finally:
                self._lock.release()
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.apply, ex, lane, outcome)

    def apply(self, ex: "Exchange", lane: "LaneRuntime", outcome: "Outcome") -> bool:
        """Predict a first turn from what its replica holds; then hold this turn's blocks there.
        True when the turn's verdict changed."""
        with self._lock:
            return self._apply(ex, lane, outcome)

    def _apply(self, ex: "Exchange", lane: "LaneRuntime", outcome: "Outcome") -> bool:
        cache = outcome.cache
        changed = False
        if not outcome.kv_keys or ex.replica is None:
            return changed
        keys = array("Q", outcome.kv_keys)
        blocks = self.replica(lane, ex.replica)
        block = key_block(lane.config)
        prompt = cache.rendered_prompt_tokens or 0
        if cache.verdict == "cold" and not cache.predicted_cached_tokens and cache.cause is None:
            # The engine never reuses the prompt's last token: a prefix ends one token short of it.
            usable = (max(0, prompt - 1) // block)
            held = blocks.held(keys[:usable], ex.t_forwarded if ex.t_forwarded is not None else ex.started)
            if held:
                predicted = held * block
                reported = cache.reported_cached_tokens
                changed = True
                cache.predicted_cached_tokens = predicted
                cache.shared_prefix_tokens = predicted
                self.predicted_turns += 1
                if reported is not None and reported < predicted:
                    cache.verdict, cache.tokens_lost = "eviction", predicted - reported
                    cache.seconds_lost = round((predicted - reported) / lane.config.cache.prefill_tokens_per_s, 3)
                else:
                    cache.verdict, cache.cause = "hit", "shared_prefix"
        ready = ex.t_first_token or ex.t_first_byte
        blocks.store(keys, prompt // block, ready if ready is not None else time.perf_counter(), time.perf_counter())
        return changed

    def snapshot(self) -> dict[str, Any]:
        return {f"{lane} {url}": {"blocks": len(b), "capacity_blocks": b.capacity, "evicted": b.evicted}
                for (lane, url), b in self.replicas.items()}
