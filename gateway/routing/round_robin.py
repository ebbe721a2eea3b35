"""round_robin: each request starts at the next replica; the rest follow as failover."""

from __future__ import annotations

from itertools import count

from ..exchange import Exchange
from ..upstream import Replica
from .base import healthy_first


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = count()

    def order(self, replicas: list[Replica], ex: Exchange) -> list[Replica]:
        live = healthy_first(replicas)
        if not live:
            return []
        start = next(self._next) % len(live)
        return live[start:] + live[:start]

    def served(self, replica: Replica, ex: Exchange) -> None:
        pass
