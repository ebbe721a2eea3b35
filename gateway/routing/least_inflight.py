"""least_inflight: the replica with the fewest requests in flight first (ties keep list order)."""

from __future__ import annotations

from ..exchange import Exchange
from ..upstream import Replica
from .base import healthy_first


class LeastInflight:
    name = "least_inflight"

    def order(self, replicas: list[Replica], ex: Exchange) -> list[Replica]:
        return sorted(healthy_first(replicas), key=lambda r: r.inflight)

    def served(self, replica: Replica, ex: Exchange) -> None:
        pass
