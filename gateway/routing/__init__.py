"""Replica routing policies: one module per policy behind one small interface (base.py)."""

from __future__ import annotations

from .base import RoutingPolicy, healthy_first
from .conversation_affinity import ConversationAffinity
from .least_inflight import LeastInflight
from .round_robin import RoundRobin

POLICIES: dict[str, type[RoutingPolicy]] = {
    "round_robin": RoundRobin,
    "least_inflight": LeastInflight,
    "conversation_affinity": ConversationAffinity,
}


def make_policy(name: str) -> RoutingPolicy:
    return POLICIES[name]()


__all__ = ["RoutingPolicy", "POLICIES", "make_policy", "healthy_first", "ConversationAffinity"]
