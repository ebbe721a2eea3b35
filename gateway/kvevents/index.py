"""One replica's KV pool as its event stream describes it: which blocks are held, since when, which
left and why, and who stored what (for "who pushed it out").

Blocks are named by content keys (chain.py); the engine's own hashes are kept only to apply
BlockRemoved and to chain a child to its parent. All times are this gateway's wall clock when the
event arrived (the engine's `ts` may come from another host's clock); each event also has its place in
the stream, the engine's own batch and event order, which decides what a turn found (`Moment`).

Memory is bounded by `max_blocks` held blocks (+ as many removal records, 2x as many owner entries
and a store log of `max_blocks` entries); past that the oldest entries are forgotten and counted.
`approx_bytes` estimates what is held from the sizes of the objects (the bytes per block are in
docs/performance.md).
"""

from __future__ import annotations

import sys
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Sequence

from . import chain
from .events import Batch, Cleared, Hash, Removed, Stored


class Block:
    __slots__ = ("key", "tokens", "stored_t", "stored_n")

    def __init__(self, key: int, tokens: int, stored_t: float, stored_n: int) -> None:
        self.key = key
        self.tokens = tokens
        self.stored_t = stored_t
        self.stored_n = stored_n  # the event's place in the replica's stream (the engine's own order)


@dataclass(slots=True, frozen=True)
class Removal:
    t: float  # when the block left
    cause: str  # evicted | cleared | restarted
    stored_t: float  # when it had been stored
    n: int = 0  # the removal's place in the stream
    stored_n: int = 0  # the store's


@dataclass(slots=True, frozen=True)
class Moment:
    """A point in a replica's event stream that a turn is judged at: just before the turn's own first
    store, in the engine's batch and event order, when the index saw it (a reset of the cache published
    in the very step that scheduled the turn comes before it, though it arrived after the turn was
    sent); else the wall time the turn was sent."""

    t: float
    n: int | None = None

    def after(self, t: float, n: int) -> bool:
        """Did the event at (arrival time t, place n) happen before this moment?"""
        return n < self.n if self.n is not None else t <= self.t


class ReplicaIndex:
    def __init__(self, max_blocks: int = 500_000) -> None:
        self.max_blocks = max_blocks
        self.blocks: dict[Hash, Block] = {}  # held, by engine hash (insertion order ~ store order)
        self.by_key: dict[int, Hash] = {}  # held, by content key
        self.removed: OrderedDict[int, Removal] = OrderedDict()  # the last removal of each key
        self.gone: OrderedDict[Hash, int] = OrderedDict()  # removed engine hash -> key (children still chain)
        self.owners: OrderedDict[int, str] = OrderedDict()  # key -> the conversation whose turn stored it
        self.log: deque[tuple[float, int, int]] = deque(maxlen=max_blocks)  # (t, tokens, key) per new block
        self.block_size: int | None = None
        self.held_tokens = 0
        self.epoch = 0
        self.clears: deque[tuple[float, str]] = deque(maxlen=32)  # (t, cause) of each reset
        self.n = 0  # events applied: each event's place in the stream
        self.stored_blocks = 0
        self.removed_blocks = 0
        self.reused_blocks = 0  # BlockStored for a block already held (vLLM's "full" reuse reports)
        self.orphans = 0  # stored blocks whose parent was never seen (stored before we subscribed)
        self.forgotten = 0  # entries dropped to stay within max_blocks
        self.unknown_removals = 0  # BlockRemoved for a hash we never saw stored

    # -- applying events -------------------------------------------------------------------------

    def apply(self, batch: Batch, t: float) -> None:
        for ev in batch.events:
            self.n += 1
            if isinstance(ev, Stored):
                self._stored(ev, t)
            elif isinstance(ev, Removed):
                self._removed(ev.block_hashes, t, "evicted")
            elif isinstance(ev, Cleared):
                self.reset("cleared", t)

    def _key_of(self, h: Hash | None) -> int | None:
        if h is None:
            return chain.ROOT
        blk = self.blocks.get(h)
        if blk is not None:
            return blk.key
        return self.gone.get(h)

    def _stored(self, ev: Stored, t: float) -> None:
        n = len(ev.block_hashes)
        if n == 0:
            return
        size = ev.block_size
        if self.block_size is None or n > 1 or len(ev.token_ids) == size:
            self.block_size = size
        parent = self._key_of(ev.parent)
        if parent is None:
            self.orphans += n
        raw = chain._as_bytes(ev.token_ids)  # one conversion for the event, sliced per block
        width = size * 4
        extras = ev.extra_keys or ()
        digest = chain.xxhash.xxh3_64_intdigest
        blocks, by_key, log = self.blocks, self.by_key, self.log
        for i, h in enumerate(ev.block_hashes):
            chunk = raw[i * width:(i + 1) * width]
            if parent is not None:
                extra = extras[i] if i < len(extras) else None
                key = digest(parent.to_bytes(8, "little") + chunk) if extra is None else \
                    chain.block_key(parent, chunk, extra)
                parent = key
            else:
                key = hash((id(self), h)) & ((1 << 64) - 1)  # unreachable from any prediction
            if h in blocks:
                self.reused_blocks += 1
                continue
            n = len(chunk) // 4
            blocks[h] = Block(key, n, t, self.n)
            by_key[key] = h
            self.held_tokens += n
            self.stored_blocks += 1
            log.append((t, n, key))
        if len(self.blocks) > self.max_blocks:
            self._forget()

    def _removed(self, hashes: Iterable[Hash], t: float, cause: str) -> None:
        for h in hashes:
            blk = self.blocks.pop(h, None)
            if blk is None:
                self.unknown_removals += 1
                continue
            self.held_tokens -= blk.tokens
            self.removed_blocks += 1
            if self.by_key.get(blk.key) == h:
                del self.by_key[blk.key]
            self._remember(blk, h, t, cause)

    def _remember(self, blk: Block, h: Hash, t: float, cause: str) -> None:
        self.removed[blk.key] = Removal(t, cause, blk.stored_t, self.n, blk.stored_n)
        self.removed.move_to_end(blk.key)
        self.gone[h] = blk.key
        cap = self.max_blocks
        while len(self.removed) > cap:
            self.removed.popitem(last=False)
            self.forgotten += 1
        while len(self.gone) > cap:
            self.gone.popitem(last=False)

    def _forget(self) -> None:
        """Over the bound: the oldest stored blocks are dropped (counted, not taken as removals)."""
        while len(self.blocks) > self.max_blocks:
            h, blk = next(iter(self.blocks.items()))
            del self.blocks[h]
            self.by_key.pop(blk.key, None)
            self.held_tokens -= blk.tokens
            self.forgotten += 1

    def reset(self, cause: str, t: float) -> None:
        """AllBlocksCleared (cause cleared) or a new engine process (restarted): everything held left."""
        if cause != "cleared":  # a restart is not an event of the stream: it takes its own place
            self.n += 1
        for h, blk in self.blocks.items():
            self._remember(blk, h, t, cause)
        self.blocks.clear()
        self.by_key.clear()
        self.held_tokens = 0
        self.epoch += 1
        self.clears.append((t, cause))

    # -- attribution ----------------------------------------------------------------------------

    def attribute(self, keys: Sequence[int], owner: str) -> None:
        """These blocks belong to `owner`'s prefix; the first conversation to store a block owns it."""
        owners = self.owners
        for k in keys:
            if k not in owners:
                owners[k] = owner
        cap = 2 * self.max_blocks
        while len(owners) > cap:
            owners.popitem(last=False)

    # -- questions ------------------------------------------------------------------------------

    def moment(self, keys: Sequence[int], asked_at: float) -> Moment:
        """Where a turn sent at `asked_at` with these block keys was scheduled in the stream: before the
        first of its blocks stored after it was sent (its own prefill), when one is held."""
        by_key, blocks = self.by_key, self.blocks
        for k in keys:
            h = by_key.get(k)
            if h is None:
                break
            blk = blocks[h]
            if blk.stored_t > asked_at:
                return Moment(asked_at, blk.stored_n)
        return Moment(asked_at)

    def held_at(self, key: int, at: Moment) -> bool:
        h = self.by_key.get(key)
        if h is not None:
            blk = self.blocks[h]
            if at.after(blk.stored_t, blk.stored_n):
                return True
        r = self.removed.get(key)
        return r is not None and at.after(r.stored_t, r.stored_n) and not at.after(r.t, r.n)

    def held_now(self, key: int) -> bool:
        return key in self.by_key

    def held_prefix(self, keys: Sequence[int], at: Moment | None = None) -> int:
        """How many leading blocks of `keys` were held at `at` (now when None)."""
        n = 0
        if at is None:
            by_key = self.by_key
            for k in keys:
                if k not in by_key:
                    break
                n += 1
            return n
        # held_at inlined for the common case, a block held since before `at` (a long prompt has tens of
        # thousands); anything else takes held_at itself.
        by_key, blocks, held_at = self.by_key, self.blocks, self.held_at
        at_t, at_n = at.t, at.n
        for k in keys:
            h = by_key.get(k)
            if h is not None:
                blk = blocks[h]
                if (blk.stored_n < at_n) if at_n is not None else (blk.stored_t <= at_t):
                    n += 1
                    continue
            if not held_at(k, at):
                break
            n += 1
        return n

    def stores_between(self, since: float, until: float,
                       prefix: Collection[int] = ()) -> tuple[dict[str | None, int], int]:
        """Tokens stored in (since, until], by owning conversation (None: not attributed), and how many
        blocks. Blocks of `prefix` (the prompt being judged) are left out: storing a block of that very
        prefix cannot have displaced it, and a turn's own stores may arrive after the turn was judged.
        The log is scanned from its newest end."""
        by: dict[str | None, int] = {}
        blocks = 0
        owners = self.owners
        for t, tokens, key in reversed(self.log):
            if t <= since:
                break
            if t > until or key in prefix:
                continue
            owner = owners.get(key)
            by[owner] = by.get(owner, 0) + tokens
            blocks += 1
        return by, blocks

    def stored_tokens_since(self, since: float) -> int:
        total = 0
        for t, tokens, _ in reversed(self.log):
            if t <= since:
                break
            total += tokens
        return total

    def approx_bytes(self) -> int:
        """Containers plus entries (sizes of the objects actually held; an estimate, cheap to compute)."""
        size = sys.getsizeof
        total = sum(size(c) for c in (self.blocks, self.by_key, self.removed, self.gone, self.owners, self.log))
        if self.blocks:
            h, blk = next(iter(self.blocks.items()))
            total += len(self.blocks) * (size(blk) + size(h) + size(blk.key) + size(blk.tokens) + size(blk.stored_t))
        total += len(self.removed) * (size(Removal(0.0, "", 0.0)) + 32 + 24)
        total += len(self.gone) * (33 + 32)
        total += len(self.owners) * 32
        total += len(self.log) * (64 + 24 + 32)
        return total

    def counters(self) -> dict[str, int | float | dict[str, Any] | None]:
        return {"held_blocks": len(self.blocks), "held_tokens": self.held_tokens, "block_size": self.block_size,
                "stored_blocks": self.stored_blocks, "removed_blocks": self.removed_blocks,
                "reused_blocks": self.reused_blocks, "orphan_blocks": self.orphans, "forgotten": self.forgotten,
                "unknown_removals": self.unknown_removals, "epoch": self.epoch,
                "last_clear": {"at": self.clears[-1][0], "cause": self.clears[-1][1]} if self.clears else None,
                "approx_bytes": self.approx_bytes()}
