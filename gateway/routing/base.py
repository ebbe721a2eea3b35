"""The routing interface: given a lane's replicas and a request, the order to try them in.

Every policy also writes what it decided to ``ex.routing`` (a core.exchange.RouteDecision):
`reason` is one of home | prefix | least_loaded | rehomed_overload | rehomed_unhealthy (affinity) or
the policy's name (round_robin, least_inflight). `expected_cold` says the conversation's KV cache is
not where this turn runs (it moved, or its prefix drifted at the head): the analyzer judges a miss
on such a turn `cold` (cause `rehomed`), not `eviction`. The response carries the same decision in
``X-Gateway-Route: <reason>; replica=<index in the lane>[; cold]``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from ..core.exchange import Exchange, RouteDecision
from ..upstream.replicas import Replica

if TYPE_CHECKING:
    from ..core.config import Affinity
    from .shared import RoutingShared

ROUTE_HEADER = "X-Gateway-Route"


class RoutingPolicy(Protocol):
    name: str

    def bind(self, shared: "RoutingShared", lane: str, settings: "Affinity") -> None:
        """Lane hook, at each (re)load: the process's store and load board, the lane's name and settings."""
        ...

    async def prepare(self, ex: Exchange, lane: Any, body: dict[str, Any]) -> None:
        """On the hot path before `order`: the lookups the decision needs (store reads), if any. `lane`
        is the LaneRuntime (core.runtime builds routers: it imports this module)."""
        ...

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


def previous_replica(ex: Exchange) -> str | None:
    """Where the conversation's last turn ran (its KV cache lives there), when known."""
    found = ex.conversation
    return found.state.replica if found is not None else None


def note(ex: Exchange, decision: RouteDecision, replicas: list[Replica]) -> RouteDecision:
    """Record a routing decision on the exchange (annotation and response header)."""
    ex.routing = decision
    _header(ex, decision, replicas)
    return decision


def _header(ex: Exchange, decision: RouteDecision, replicas: list[Replica] | None = None) -> None:
    if replicas is not None:
        ex.routing_urls = [r.url for r in replicas]
    urls = ex.routing_urls or []
    index = urls.index(decision.replica) if decision.replica in urls else -1
    value = f"{decision.reason}; replica={index}"
    if decision.expected_cold:
        value += "; cold"
    ex.response_headers[ROUTE_HEADER] = value


def moved_note(ex: Exchange, policy: str, chosen: Replica, replicas: list[Replica]) -> None:
    """For policies blind to conversations: say when a turn lands away from its previous replica."""
    prev = previous_replica(ex)
    note(ex, RouteDecision(policy, chosen.url, policy, prev is not None and prev != chosen.url, previous=prev),
         replicas)


def served_note(ex: Exchange, replica: Replica) -> RouteDecision | None:
    """After failover the serving replica may differ from the planned one: update the decision."""
    decision = ex.routing
    if decision is None or decision.replica == replica.url:
        return decision
    decision.planned = decision.replica
    decision.replica = replica.url
    decision.failover = True
    prev = decision.previous
    decision.expected_cold = prev is not None and prev != replica.url
    _header(ex, decision)
    return decision
