"""Fallback lanes: a model's request goes to the next lane of its `fallbacks` when its lane cannot serve.

    models:
      deepseek-v4-flash: {lane: dsv41-vllm, fallbacks: [dsv41-sglang, dsv41-backup]}

A lane cannot serve when a gate refuses it (qualification: `lane_not_qualified`) or when none of
its replicas is available (every circuit breaker open; see gateway.upstream.replicas and gateway.upstream.health).
The decision is made before anything is forwarded: the request is then policed and forwarded as
a request of the fallback lane (its limits, its template, its upstream model).

The client is told: `X-Gateway-Fallback: <lane>; from=<lane>; reason=<why>`, and when the two
lanes render prompts differently (another template, another effort map) `; cache=lost`: the
conversation's prefix cache lives on the first lane's engine and the fallback starts cold. The
exchange records it (`ex.fallback_from`), the records and access log carry it.

When no lane can serve, the answer is the first lane's own (its 503), as without fallbacks.

Cache-protecting admission with `policy: divert` hands a new conversation to another lane the same way
(reason=cache_admission), and each later turn of it (reason=diverted_conversation): gateway/admission/.
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable, Sequence

from ..core.errors import GatewayError
from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime, Snapshot

Gate = Callable[[Exchange, LaneRuntime], Awaitable[None]]

REFUSALS = frozenset({"lane_not_qualified"})  # gate error codes that mean "this lane, not the request"


def has_healthy_replica(lane: LaneRuntime, now: float | None = None) -> bool:
    now = time.monotonic() if now is None else now
    return any(r.available(now) for r in lane.upstream.replicas)


def same_render(a: LaneRuntime, b: LaneRuntime) -> bool:
    """Would both lanes' engines build the same prompt (so a cached prefix could carry over)?"""
    ra, rb = a.config.render, b.config.render
    return (ra.template is not None and ra.template == rb.template and ra.effort_map == rb.effort_map
            and ra.thinking == rb.thinking and ra.drop_thinking == rb.drop_thinking)


async def choose_lane(ex: Exchange, snapshot: Snapshot, primary: LaneRuntime, gates: Sequence[Gate]) -> LaneRuntime:
    """The lane that serves this request: `primary`, or the first of its model's fallbacks that can.

    Runs the gates (each candidate's, in order); raises the primary's refusal when nobody can serve.
    """
    names = snapshot.config.fallbacks.get(ex.public_model or "", ())
    if not names:
        for gate in gates:
            await gate(ex, primary)
        return primary
    first_error: GatewayError | None = None
    reasons: list[str] = []
    candidates = [primary, *(snapshot.lanes[n] for n in names if n in snapshot.lanes)]
    for lane in candidates:
        try:
            for gate in gates:
                await gate(ex, lane)
        except GatewayError as exc:
            if exc.code not in REFUSALS:
                raise
            first_error = first_error or exc
            reasons.append("refused")
            continue
        if not has_healthy_replica(lane):
            reasons.append("no_healthy_replica")
            continue
        if lane is not primary:
            announce(ex, primary, lane, reasons[0])
        return lane
    if first_error is not None and reasons[0] == "refused":
        raise first_error
    return primary  # nobody healthy: the primary answers its own 503, as without fallbacks


def announce(ex: Exchange, primary: LaneRuntime, lane: LaneRuntime, reason: str, moves_cache: bool = True) -> None:
    """Tells the client and the record that `lane` serves what `primary` was asked for, and why;
    `moves_cache`: the conversation's cached prefix may be on the primary (not for a newcomer, nor for a
    conversation that continues where its cache is)."""
    ex.fallback_from = primary.name
    value = f"{lane.name}; from={primary.name}; reason={reason}"
    if moves_cache and not same_render(primary, lane):
        value += "; cache=lost"
    ex.response_headers["X-Gateway-Fallback"] = value
