"""Replica routing policies: one module per policy behind one small interface."""

from __future__ import annotations

from .base import RoutingPolicy, healthy_first
from .least_inflight import LeastInflight
from .round_robin import RoundRobin

POLICIES: dict[str, type[RoutingPolicy]] = {
    "round_robin": RoundRobin,
    "least_inflight": LeastInflight,
    # Until conversation affinity lands it degrades to least-inflight ordering.
    "conversation_affinity": LeastInflight,
}


def make_policy(name: str) -> RoutingPolicy:
    return POLICIES[name]()


__all__ = ["RoutingPolicy", "POLICIES", "make_policy", "healthy_first"]
