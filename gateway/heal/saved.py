"""Tokens each repair saved: the cached prefix it kept beyond what the client's own bytes would have kept.

Without repair k (and those after it), the prefix would have broken at the start of the message it
repaired; with them all, the engine keeps `predicted` tokens. So repair k saved the tokens from its
message's start to the next repaired message's start, within the predicted prefix: the shares add up to
what all the repairs saved together. A message repaired by two kinds counts once, under the first.
Measured at message starts (segment precision): the client's bytes would usually have kept a few
tokens more, into the repaired message.
"""

from __future__ import annotations

from typing import Sequence


def tokens_saved(segments: Sequence[tuple[int, int]], predicted: int,
                 healed: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Tokens saved by kind. `segments`: (message index, tokens) of the render, in order; `healed`:
    (kind, message index) of every repair."""
    starts: dict[int, int] = {}
    pos = 0
    for index, n in segments:
        starts.setdefault(index, pos)
        pos += n

    def start(index: int) -> int:
        if index in starts:
            return starts[index]
        later = [s for i, s in starts.items() if i >= index]  # a message rendered with its group
        return min(later) if later else pos

    order = sorted(range(len(healed)), key=lambda k: healed[k][1])
    out = [0] * len(healed)
    seen: set[int] = set()
    for rank, k in enumerate(order):
        index = healed[k][1]
        if index in seen:
            continue
        seen.add(index)
        nxt = next((healed[order[r]][1] for r in range(rank + 1, len(order)) if healed[order[r]][1] != index), None)
        begin = min(start(index), predicted)
        end = min(start(nxt) if nxt is not None else predicted, predicted)
        out[k] = max(0, end - begin)
    by_kind: dict[str, int] = {}
    for (kind, _), n in zip(healed, out):
        by_kind[kind] = by_kind.get(kind, 0) + n
    return by_kind
