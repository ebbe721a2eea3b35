"""least_inflight: the replica with the fewest requests in flight first (ties keep list order)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.exchange import Exchange
from ..upstream.replicas import Replica
from .base import healthy_first, moved_note, served_note

if TYPE_CHECKING:
    from ..core.config import Affinity
    from .shared import RoutingShared


class LeastInflight:
    name = "least_inflight"

    def bind(self, shared: "RoutingShared", lane: str, settings: "Affinity") -> None:
        return None  # blind to conversations and to other processes: nothing to share

    async def prepare(self, ex: Exchange, lane: Any, body: dict[str, Any]) -> None:
        return None  # nothing to look up

    def order(self, replicas: list[Replica], ex: Exchange) -> list[Replica]:
        ordered = sorted(healthy_first(replicas), key=lambda r: r.inflight)
        if ordered:
            moved_note(ex, self.name, ordered[0], replicas)
        return ordered

    def served(self, replica: Replica, ex: Exchange) -> None:
        served_note(ex, replica)
