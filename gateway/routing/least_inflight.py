"""least_inflight: the replica with the fewest requests in flight first (ties keep list order)."""

from __future__ import annotations

from ..core.exchange import Exchange
from ..upstream.replicas import Replica
from .base import healthy_first, moved_note, served_note


class LeastInflight:
    name = "least_inflight"

    def order(self, replicas: list[Replica], ex: Exchange) -> list[Replica]:
        ordered = sorted(healthy_first(replicas), key=lambda r: r.inflight)
        if ordered:
            moved_note(ex, self.name, ordered[0], replicas)
        return ordered

    def served(self, replica: Replica, ex: Exchange) -> None:
        served_note(ex, replica)
