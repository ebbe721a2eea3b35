"""The routing interface: given a lane's replicas and a request, the order to try them in."""

from __future__ import annotations

import time
from typing import Protocol

from ..exchange import Exchange
from ..upstream import Replica


class RoutingPolicy(Protocol):
    name: str

    def order(self, replicas: list[Replica], ex: Exchange) -> list[Replica]:
        """Replicas to try, best first. Failover walks this list before the first byte."""
        ...

    def served(self, replica: Replica, ex: Exchange) -> None:
        """Told which replica actually served the request (after failover)."""
        ...


def healthy_first(replicas: list[Replica]) -> list[Replica]:
    """Replicas whose circuit is closed (or cooling down to a probe), in the given order."""
    now = time.monotonic()
    return [r for r in replicas if r.available(now)]
