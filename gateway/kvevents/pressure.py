"""Pool pressure per replica, before it bites: occupancy, the working set of live conversations, and a
forecast of which of them the pool will have evicted by their next turn.

The engines evict least-recently-used blocks. A conversation's prefix survives until the blocks used
after its last turn, plus its own, no longer fit the pool. So, for each live conversation c on a
replica:

    ahead(c)    = prefix tokens of the other conversations whose last turn came after c's
                  + tokens stored since c's last turn that no known conversation owns
    at_next(c)  = ahead(c) + rate x (c's expected next turn - now)     (rate: new tokens per second
                  stored on the replica over the last `rate_window_s`)
    evicted     when at_next(c) + tokens(c) > pool

and the working set is the sum of live prefixes weighted by recency (`0.5 ** (idle / half_life)`). An
alert fires when the working set exceeds the pool: then some conversation will re-prefill whatever
the order of turns, and the operator's choices are the ones the alert lists (more pool, fewer
concurrent long sessions, or moving conversations to a replica with room).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .index import ReplicaIndex


@dataclass(slots=True)
class Live:
    conversation: str
    tokens: int  # its prefix as the engine holds it after the last turn (prompt + cached output blocks)
    last_t: float  # wall time its last turn ended
    gaps: list[float] = field(default_factory=list)  # recent seconds between turns
    turns: int = 1

    def expected_gap(self, default: float | None) -> float | None:
        return statistics.median(self.gaps) if self.gaps else default


@dataclass(frozen=True, slots=True)
class Forecast:
    conversation: str
    tokens: int
    idle_s: float
    ahead_tokens: int  # used more recently than this conversation
    next_turn_in_s: float | None  # expected (None: no history of gaps on this replica yet)
    margin_tokens: int  # pool - tokens - ahead now (negative: already evicted, at least in part)
    evicted_in_s: float | None  # at the current rate of new tokens (0: already; None: rate is zero)
    will_be_evicted: bool

    def as_dict(self) -> dict[str, object]:
        return {"conversation": self.conversation, "tokens": self.tokens, "idle_s": round(self.idle_s, 1),
                "ahead_tokens": self.ahead_tokens,
                "next_turn_in_s": None if self.next_turn_in_s is None else round(self.next_turn_in_s, 1),
                "margin_tokens": self.margin_tokens,
                "evicted_in_s": None if self.evicted_in_s is None else round(self.evicted_in_s, 1),
                "will_be_evicted": self.will_be_evicted}


class Pressure:
    """Live conversations of one replica (bounded; the least recently used are dropped first)."""

    def __init__(self, half_life_s: float = 900.0, live_for_s: float = 3600.0, rate_window_s: float = 300.0,
                 max_conversations: int = 10_000) -> None:
        self.half_life_s = half_life_s
        self.live_for_s = live_for_s
        self.rate_window_s = rate_window_s
        self.max_conversations = max_conversations
        self.live: OrderedDict[str, Live] = OrderedDict()
        self.first_alert_at: float | None = None
        self.alerting_since: float | None = None
        self.alerts = 0

    def turn(self, conversation: str, tokens: int, t: float) -> None:
        c = self.live.get(conversation)
        if c is None:
            self.live[conversation] = Live(conversation, tokens, t)
        else:
            if t > c.last_t:
                c.gaps = (c.gaps + [t - c.last_t])[-8:]
            c.tokens, c.last_t, c.turns = tokens, max(t, c.last_t), c.turns + 1
            self.live.move_to_end(conversation)
        while len(self.live) > self.max_conversations:
            self.live.popitem(last=False)

    def forget(self, conversation: str) -> None:
        self.live.pop(conversation, None)

    def _alive(self, now: float) -> list[Live]:
        return [c for c in self.live.values() if now - c.last_t <= self.live_for_s]

    def rate(self, index: ReplicaIndex, now: float) -> float:
        window = self.rate_window_s
        return index.stored_tokens_since(now - window) / window if window > 0 else 0.0

    def forecast(self, index: ReplicaIndex, pool: int | None, now: float) -> list[Forecast]:
        alive = sorted(self._alive(now), key=lambda c: c.last_t)
        if pool is None:
            return []
        rate = self.rate(index, now)
        gaps = [g for c in alive for g in c.gaps]
        default_gap = statistics.median(gaps) if gaps else None
        stray = self._stray_since([c.last_t for c in alive], {c.conversation for c in alive}, index)
        newer_tokens = 0
        ahead_of: list[int] = [0] * len(alive)
        for i in range(len(alive) - 1, -1, -1):  # prefixes of conversations used after each one
            ahead_of[i] = newer_tokens
            newer_tokens += alive[i].tokens
        out = []
        for i, c in enumerate(alive):
            ahead = ahead_of[i] + stray[i]
            margin = pool - c.tokens - ahead
            gap = c.expected_gap(default_gap)
            next_in = None if gap is None else max(0.0, c.last_t + gap - now)
            growth = rate * next_in if next_in is not None else 0.0
            if margin <= 0:
                evicted_in: float | None = 0.0
            else:
                evicted_in = margin / rate if rate > 0 else None
            out.append(Forecast(c.conversation, c.tokens, now - c.last_t, ahead, next_in, margin, evicted_in,
                                margin - growth < 0))
        return out

    @staticmethod
    def _stray_since(times: list[float], live: set[str], index: ReplicaIndex) -> list[int]:
        """For each time (ascending): tokens stored since then that no live conversation owns. One pass
        over the store log, newest first, back to the oldest time."""
        out = [0] * len(times)
        if not times:
            return out
        owners = index.owners
        acc = 0
        i = len(times) - 1
        for t, tokens, key in reversed(index.log):
            while i >= 0 and t <= times[i]:
                out[i] = acc
                i -= 1
            if i < 0:
                break
            if owners.get(key) not in live:
                acc += tokens
        while i >= 0:
            out[i] = acc
            i -= 1
        return out

    def working_set(self, now: float) -> tuple[float, int, int]:
        """(recency-weighted tokens, unweighted tokens, conversations) of the live conversations."""
        alive = self._alive(now)
        weighted = sum(c.tokens * 0.5 ** (max(0.0, now - c.last_t) / self.half_life_s) for c in alive)
        return weighted, sum(c.tokens for c in alive), len(alive)

    def summary(self, index: ReplicaIndex, pool: int | None, now: float) -> dict[str, Any]:
        weighted, total, n = self.working_set(now)
        forecasts = self.forecast(index, pool, now)
        over = pool is not None and weighted > pool
        if over:
            if self.alerting_since is None:
                self.alerting_since = now
                self.alerts += 1
                if self.first_alert_at is None:
                    self.first_alert_at = now
        else:
            self.alerting_since = None
        doomed = [f for f in forecasts if f.will_be_evicted]
        alert = None
        if over and pool is not None:
            biggest = sorted(self._alive(now), key=lambda c: -c.tokens)[:5]
            alert = {
                "since": self.alerting_since,
                "message": (f"working set {int(weighted)} tokens > pool {pool} tokens: "
                            f"{len(doomed)} of {n} live conversations will re-prefill before their next turn"),
                "overflow_tokens": int(weighted) - pool,
                "options": {
                    "add_capacity_tokens": int(weighted) - pool,
                    "cap_concurrent_long_sessions": _fit(sorted((c.tokens for c in self._alive(now)),
                                                                 reverse=True), pool),
                    "move_conversations": [c.conversation for c in biggest],
                },
                "largest": [{"conversation": c.conversation, "tokens": c.tokens} for c in biggest],
            }
        return {
            "pool_tokens": pool,
            "held_tokens": index.held_tokens,
            "occupancy": round(index.held_tokens / pool, 4) if pool else None,
            "working_set_tokens": int(weighted),
            "live_tokens": total,
            "live_conversations": n,
            "new_tokens_per_s": round(self.rate(index, now), 1),
            "forecast_evictions": len(doomed),
            "forecast": [f.as_dict() for f in forecasts],
            "alert": alert,
            "first_alert_at": self.first_alert_at,
            "alerts": self.alerts,
        }


def _fit(sizes: list[int], pool: int) -> int:
    """How many of the largest live conversations fit the pool together."""
    total = 0
    for i, s in enumerate(sizes):
        total += s
        if total > pool:
            return i
    return len(sizes)
