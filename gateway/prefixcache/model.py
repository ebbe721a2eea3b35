"""One replica's prefix cache as the engine keeps it: the chain keys of the token blocks it holds
(a block's key names its whole prefix, gateway/kvevents/chain.py), least recently used first out.

vLLM hashes each full block with its parent's hash and frees the least recently used blocks when the
pool is full; SGLang's radix tree evicts least recently used leaves. Both keep a block only while its
prefix is kept, so the longest held prefix of a prompt is the run of its first keys found here.
Recency is a counter per block (a dict update per turn, at C speed); the oldest blocks leave in a
batch once the pool is a tenth over its size, so a turn costs O(its blocks) and eviction is amortised.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.config import Lane

# Block keys are made of at least this many tokens: an engine that caches token by token (SGLang) is
# modelled in 16-token blocks (a prediction at most 15 tokens short), not a key per token. A lane with
# KV events keys its blocks as the engine does, whatever their size.
MODEL_BLOCK_MIN = 16


def key_block(lane: "Lane") -> int:
    """The block size of a lane's render keys."""
    block = lane.cache.block_size
    return block if lane.kv_events is not None else max(block, MODEL_BLOCK_MIN)


class ReplicaBlocks:
    __slots__ = ("capacity", "_used", "_clock", "evicted")

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity = capacity_blocks  # None: a pool larger than anything sent (nothing is evicted)
        self._used: dict[int, int] = {}  # block key -> the turn counter when a prompt last used it
        self._clock = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._used)

    def held(self, keys: Sequence[int]) -> int:
        """How many of the first `keys` the pool holds, in a row."""
        used = self._used
        n = 0
        for k in keys:
            if k not in used:
                break
            n += 1
        return n

    def store(self, keys: Sequence[int]) -> None:
        """A prompt (and the output it produced) was served: its blocks are held and the most recent."""
        self._clock += 1
        self._used.update(zip(keys, repeat(self._clock)))
        cap = self.capacity
        if cap is not None and len(self._used) > cap + max(1, cap // 10):
            self._evict(cap)

    def clear(self) -> None:
        self._used.clear()

    def _evict(self, cap: int) -> None:
        by_age = sorted(self._used.items(), key=lambda kv: kv[1])
        drop = len(by_age) - cap
        for k, _ in by_age[:drop]:
            del self._used[k]
        self.evicted += drop
