"""The conversations active on each lane and the tokens each holds in the engine's pool.

A conversation is active while a turn of it is in flight or its last turn ended less than the lane's
`idle_after_s` ago. What it holds is its last prompt plus its answer (the engines keep both), from the
engine's usage; the KV-event index's figure replaces it where the lane publishes events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(slots=True)
class Session:
    tokens: int
    last_t: float
    inflight: int = 0


@dataclass(frozen=True, slots=True)
class Load:
    tokens: int
    conversations: int


class ActiveSessions:
    def __init__(self) -> None:
        self._lanes: dict[str, dict[str, Session]] = {}

    def begin(self, lane: str, conversation: str, tokens: int, now: float) -> None:
        """A turn of `conversation` is in flight (a new one counts `tokens` until its usage is known)."""
        sessions = self._lanes.setdefault(lane, {})
        s = sessions.get(conversation)
        if s is None:
            s = sessions[conversation] = Session(tokens, now)
        s.inflight += 1

    def end(self, lane: str, conversation: str, tokens: int | None, now: float) -> None:
        s = self._lanes.get(lane, {}).get(conversation)
        if s is None:
            return
        s.inflight = max(0, s.inflight - 1)
        s.last_t = now
        if tokens is not None:
            s.tokens = tokens

    def drop(self, lane: str, conversation: str) -> None:
        """A new conversation that was refused: it holds nothing."""
        self._lanes.get(lane, {}).pop(conversation, None)

    def load(self, lane: str, idle_after_s: float, now: float,
             held: Callable[[str], int | None] | None = None) -> Load:
        """The lane's active working set; conversations idle longer are forgotten. `held`: the engine's own
        figure per conversation, where KV events give one."""
        sessions = self._lanes.get(lane)
        if not sessions:
            return Load(0, 0)
        total = count = 0
        for cid in list(sessions):
            s = sessions[cid]
            if s.inflight == 0 and now - s.last_t > idle_after_s:
                del sessions[cid]
                continue
            engine = held(cid) if held is not None else None
            total += s.tokens if engine is None else engine
            count += 1
        return Load(total, count)

    def next_idle_in(self, lane: str, idle_after_s: float, now: float) -> float | None:
        """Seconds until the next conversation of `lane` leaves the working set by going idle (None: every
        active conversation has a turn in flight)."""
        waits = [idle_after_s - (now - s.last_t) for s in self._lanes.get(lane, {}).values() if s.inflight == 0]
        return max(0.0, min(waits)) if waits else None
