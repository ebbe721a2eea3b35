"""round_robin: each request starts at the next replica; the rest follow as failover."""

from __future__ import annotations

from itertools import count

from typing import TYPE_CHECKING, Any

from ..core.exchange import Exchange
from ..upstream.replicas import Replica
from .base import healthy_first, moved_note, served_note

if TYPE_CHECKING:
    from ..core.config import Affinity
    from .shared import RoutingShared


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = count()

    def bind(self, shared: "RoutingShared", lane: str, settings: "Affinity") -> None:
        return None  # blind to conversations and to other processes: nothing to share

    async def prepare(self, ex: Exchange, lane: Any, body: dict[str, Any]) -> None:
        return None  # nothing to look up

    def order(self, replicas: list[Replica], ex: Exchange) -> list[Replica]:
        live = healthy_first(replicas)
        if not live:
            return []
        start = next(self._next) % len(live)
        ordered = live[start:] + live[:start]
        moved_note(ex, self.name, ordered[0], replicas)
        return ordered

    def served(self, replica: Replica, ex: Exchange) -> None:
        served_note(ex, replica)
