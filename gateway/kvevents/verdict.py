"""Why a turn's cached prefix was shorter than predicted, from the engine's own KV events.

`explain(index, question)` is a pure function of the replica's index and typed inputs; the analyzer
calls it for every turn of a lane with KV events (conversations/analyzer.py, the marked hook).

Causes (for the first block of the prefix that was not held when the turn was sent; that block
decides the hit):
* held: the index says the predicted prefix was held (a shortfall then means the index and the
  engine disagree: reported as `index_disagrees`);
* pool_pressure: the block was evicted (BlockRemoved) after the conversation's previous turn; the
  answer names the conversations whose turns stored blocks on that replica in between, by tokens;
* cache_cleared: AllBlocksCleared (a reset of the prefix cache) removed it;
* engine_restarted: the engine process changed (its event sequence restarted) since it was stored;
* never_stored: no event ever stored this block (e.g. the previous turn failed mid-prefill, ran on
  another replica, or rendered differently than predicted);
* unknown: the stream was lost or had unfilled gaps in between, or the index forgot the block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from .index import Moment, ReplicaIndex

Cause = Literal["held", "pool_pressure", "cache_cleared", "engine_restarted", "never_stored", "unknown"]
_BY_REMOVAL = {"evicted": "pool_pressure", "cleared": "cache_cleared", "restarted": "engine_restarted"}
MAX_DISPLACERS = 8


@dataclass(frozen=True, slots=True)
class Question:
    conversation: str
    keys: Sequence[int]  # block keys of this turn's render (chain.keys), in order
    prompt_tokens: int  # of this turn (the engine never serves the last prompt token from cache)
    predicted_tokens: int  # what the gateway predicted from the conversation's history
    reported_tokens: int | None  # what the engine said (usage.prompt_tokens_details.cached_tokens)
    asked_at: float  # wall time the turn was sent
    since: float | None  # wall time the conversation's previous turn ended (its blocks last used)
    stream_ok: bool = True  # the replica's stream was live without unfilled gaps over (since, asked_at]


@dataclass(frozen=True, slots=True)
class Displacer:
    conversation: str | None  # None: traffic the gateway did not attribute (another client, other lanes)
    tokens: int


@dataclass(frozen=True, slots=True)
class Verdict:
    cause: Cause
    held_tokens: int  # what the index says the engine held of this prompt when the turn was sent
    predicted_tokens: int
    reported_tokens: int | None
    agrees: bool | None  # held_tokens == reported_tokens (None when nothing was reported)
    first_missing_block: int | None  # index of the first predicted block not held
    missing_blocks: int  # predicted blocks not held
    removed_at: float | None  # when the first missing block left the pool
    removed_span: tuple[float, float] | None  # first and last removal time of the missing blocks
    removed: tuple[tuple[int, int, str, float, float], ...] = field(default=())  # runs of missing blocks:
    # (first block, last block, evicted | cleared | restarted | never_stored, first removal t, last removal t)
    displaced_by: tuple[Displacer, ...] = field(default=())
    displacing_tokens: int = 0  # tokens stored on the replica between the previous turn and the removal
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"cause": self.cause, "held_tokens": self.held_tokens, "agrees": self.agrees,
                "first_missing_block": self.first_missing_block, "missing_blocks": self.missing_blocks,
                "removed_at": self.removed_at,
                "removed_span": list(self.removed_span) if self.removed_span else None,
                "removed": [{"blocks": [a, b], "how": how, "at": [t0, t1]} for a, b, how, t0, t1 in self.removed],
                "displaced_by": [{"conversation": d.conversation, "tokens": d.tokens} for d in self.displaced_by],
                "displacing_tokens": self.displacing_tokens, "note": self.note}


def cap(tokens: int, prompt_tokens: int, block: int) -> int:
    """The engine serves at most prompt_tokens - 1 from cache, in whole blocks."""
    return max(0, min(tokens, prompt_tokens - 1)) // block * block


def explain(index: ReplicaIndex, q: Question) -> Verdict:
    block = index.block_size or 1
    keys = q.keys
    at = index.moment(keys, q.asked_at)
    held_blocks = index.held_prefix(keys, at)
    held = cap(held_blocks * block, q.prompt_tokens, block)
    agrees = None if q.reported_tokens is None else held == q.reported_tokens
    predicted_blocks = min(len(keys), q.predicted_tokens // block)
    if held_blocks >= predicted_blocks:
        note = "" if agrees is not False else "the index held the prefix, the engine reported less"
        return Verdict("held", held, q.predicted_tokens, q.reported_tokens, agrees, None, 0, None, None, note=note)

    missing = range(held_blocks, predicted_blocks)
    removals = [index.removed.get(keys[i]) for i in missing]
    first = removals[0]
    # A removal before the conversation's previous turn was undone by that turn (it stored the block
    # again), unless that store never happened: then the block was never stored for this prefix.
    if first is not None and q.since is not None and first.t <= q.since and at.after(first.t, first.n):
        recent = None
    else:
        recent = first if first is not None and at.after(first.t, first.n) else None
    times = [r.t for r in removals if r is not None and at.after(r.t, r.n) and (q.since is None or r.t > q.since)]
    runs = _runs(held_blocks, removals, at)
    span = (min(times), max(times)) if times else None
    n_missing = len(missing)

    if recent is None:
        seen = keys[held_blocks] in index.owners
        if not q.stream_ok:
            cause: Cause = "unknown"
            note = "the replica's event stream was lost or had gaps since the previous turn"
        elif first is not None:
            cause, note = "unknown", (f"removed at {first.t:.3f} ({first.cause}), before the previous turn, "
                                      "which did not store it again")
        elif seen:
            cause, note = "unknown", "the block was stored once, but its removal is no longer in the index"
        else:
            cause, note = "never_stored", "no event ever stored this block of the prefix"
        return Verdict(cause, held, q.predicted_tokens, q.reported_tokens, agrees, held_blocks, n_missing,
                       None, span, runs, note=note)

    cause = _BY_REMOVAL.get(recent.cause, "unknown")  # type: ignore[assignment]
    displacers: tuple[Displacer, ...] = ()
    displacing = 0
    note = ""
    if cause == "pool_pressure":
        since = q.since if q.since is not None else recent.stored_t
        until = span[1] if span else recent.t
        by, _ = index.stores_between(since, until, frozenset(keys))
        displacing = sum(by.values())
        ranked = sorted(by.items(), key=lambda kv: (-kv[1], kv[0] or ""))
        displacers = tuple(Displacer(c, n) for c, n in ranked[:MAX_DISPLACERS])
        names = [d.conversation or "unattributed traffic" for d in displacers]
        note = f"evicted by {displacing} tokens stored since the previous turn: " + ", ".join(names)
        if not q.stream_ok:
            note += " (the stream had gaps: the list may be short)"
    elif cause == "engine_restarted":
        note = "the engine process restarted since the prefix was stored"
    elif cause == "cache_cleared":
        note = "the engine's prefix cache was reset (AllBlocksCleared)"
    return Verdict(cause, held, q.predicted_tokens, q.reported_tokens, agrees, held_blocks, n_missing,
                   recent.t, span, runs, displacers, displacing, note)


def _runs(start: int, removals: list, at: Moment) -> tuple[tuple[int, int, str, float, float], ...]:
    """Consecutive missing blocks grouped by how they left (at most 16 runs)."""
    out: list[list] = []
    for i, r in enumerate(removals):
        before = r is not None and at.after(r.t, r.n)
        how = r.cause if before else "never_stored"
        t = r.t if before else 0.0
        if out and out[-1][2] == how and len(out) <= 16:
            out[-1][1] = start + i
            out[-1][3] = min(out[-1][3], t) if t else out[-1][3]
            out[-1][4] = max(out[-1][4], t)
        else:
            out.append([start + i, start + i, how, t, t])
    return tuple(tuple(x) for x in out[:16])
