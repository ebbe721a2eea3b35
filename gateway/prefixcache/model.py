"""One replica's prefix cache as the engine keeps it: the chain keys of the token blocks it holds
(a block's key names its whole prefix, gateway/kvevents/chain.py), least recently used first out.

vLLM hashes each full block with its parent's hash and frees the least recently used blocks when the
pool is full; SGLang's radix tree evicts least recently used leaves. Both keep a block only while its
prefix is kept, so the longest held prefix of a prompt is the run of its first keys found here.
Recency is a counter per block (a dict update per turn, at C speed); the oldest blocks leave in a
batch once the pool is a tenth over its size, so a turn costs O(its blocks) and eviction is amortised.

A block also keeps when it was first there: a prompt's blocks once its prefill is done (its first
token), the output's once the answer ends. A request finds only blocks that were there when it reached
the engine: sessions that start together each prefill their shared system prompt, and a turn judged
after another turn that ended later must not be credited that turn's blocks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import islice, repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.config import Lane

# Block keys are made of at least this many tokens: an engine that caches token by token (SGLang) is
# modelled in 16-token blocks (a prediction at most 15 tokens short), not a key per token. A lane with
# KV events keys its blocks as the engine does, whatever their size.
MODEL_BLOCK_MIN = 16
_CHUNK = 8192  # entries read per call while evicting


def key_block(lane: "Lane") -> int:
    """The block size of a lane's render keys."""
    block = lane.cache.block_size
    return block if lane.kv_events is not None else max(block, MODEL_BLOCK_MIN)


class ReplicaBlocks:
    __slots__ = ("capacity", "_used", "_since", "_clock", "evicted")

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity = capacity_blocks  # None: a pool larger than anything sent (nothing is evicted)
        self._used: dict[int, int] = {}  # block key -> the turn counter when a prompt last used it
        self._since: dict[int, float] = {}  # block key -> when it was first there (a monotonic clock)
        self._clock = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._used)

    def held(self, keys: Sequence[int], at: float = math.inf) -> int:
        """How many of the first `keys` the pool held, in a row, at time `at`."""
        since = self._since
        n = 0
        for k in keys:
            t = since.get(k)
            if t is None or t > at:
                break
            n += 1
        return n

    def store(self, keys: Sequence[int], prompt_blocks: int | None = None, ready: float = -math.inf,
              done: float = -math.inf) -> None:
        """A prompt (and the output it produced) was served: its blocks are held and the most recent;
        the first `prompt_blocks` (all: None) are there since `ready`, the others since `done`."""
        self._clock += 1
        used = self._used
        before = len(used)
        used.update(zip(keys, repeat(self._clock)))  # (key, clock) pairs straight in: no dict built between
        added = len(used) - before
        if added:
            # The blocks not held before are the last `added` keys of `used` (a dict keeps insertion
            # order; `update` appends new keys in the prompt's order): only they get a first time, so a
            # turn costs O(its new blocks) here, not O(its prompt). (`used` and `_since` hold the same keys.)
            n = len(keys) if prompt_blocks is None else min(prompt_blocks, len(keys))
            output = set(keys[n:])  # a chain's keys are distinct: each names its whole prefix
            self._since.update((k, done if k in output else ready) for k in islice(reversed(used), added))
        cap = self.capacity
        if cap is not None and self.may_evict(0):
            self._evict(cap)

    def may_evict(self, n_keys: int) -> bool:
        """Whether storing `n_keys` blocks could start an eviction batch (O(the pool), not the turn)."""
        cap = self.capacity
        return cap is not None and len(self._used) + n_keys > cap + max(1, cap // 10)

    def clear(self) -> None:
        self._used.clear()
        self._since.clear()

    def _evict(self, cap: int) -> None:
        """The least recently used blocks leave until the pool fits (among blocks of the same turn, in
        the order they were first held). Read in chunks, each a short call: a thread running this lets
        the event loop in between (shared.py runs long turns on one)."""
        used = self._used
        drop = len(used) - cap
        ages: Counter[int] = Counter()
        values = iter(used.values())
        for chunk in iter(lambda: list(islice(values, _CHUNK)), []):
            ages.update(chunk)
        oldest, n = 0, 0
        for oldest in sorted(ages):
            n += ages[oldest]
            if n >= drop:
                break
        victims: list[int] = []
        last: list[int] = []  # of the turn at the boundary: as many as are still to go
        items = iter(used.items())
        for pairs in iter(lambda: list(islice(items, _CHUNK)), []):
            victims.extend([k for k, c in pairs if c < oldest])
            last.extend([k for k, c in pairs if c == oldest])
        victims += last[:max(0, drop - len(victims))]
        since = self._since
        for k in victims:
            del used[k]
            del since[k]
        self.evicted += len(victims)
