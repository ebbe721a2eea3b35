"""Routing as one part: routers share one store and load board per process; a hot-path step does
their lookups.

The step runs after the conversation policy (it needs the conversation and the applied effort) and
before forwarding: a router with `prepare` gets one store round trip there, so `order` stays plain
arithmetic. GET /admin/routing shows each lane's replicas, loads, homes and the decisions made.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..core.exchange import Exchange
from .load import LoadBoard
from .shared import RoutingShared

if TYPE_CHECKING:
    from ..core.runtime import LaneRuntime, Runtime


class RoutingStep:
    """The hot-path policy that lets a lane's router read the store before `order` is called."""

    name = "routing"
    per_lane = True

    async def apply(self, ex: Exchange, lane: "LaneRuntime", body: dict[str, Any]) -> None:
        await lane.router.prepare(ex, lane, body)


class Routing:
    def __init__(self, store: Any, runtime: "Runtime", kv_events: Any = None) -> None:
        self.runtime = runtime
        self.shared = RoutingShared(store, LoadBoard(store))
        self.shared.kv = kv_events  # what the pools hold (affinity prefix_source: kv_events)
        self.step = RoutingStep()

    def bind(self, lane: "LaneRuntime") -> None:
        """Lane hook: a router that shares state gets the process's store and load board."""
        lane.router.bind(self.shared, lane.name, lane.config.affinity)

    def _affine_lanes(self) -> dict[str, list]:
        return {name: lane.upstream.replicas for name, lane in self.runtime.snapshot.lanes.items()
                if lane.config.routing == "conversation_affinity"}

    async def start(self) -> None:
        self.shared.board.start(self._affine_lanes)

    async def stop(self) -> None:
        await self.shared.board.stop()
        await self.shared.drain()

    async def route(self, request: Request) -> Response:
        shared = self.shared
        now = time.monotonic()
        board = shared.board
        lanes = {}
        for name, lane in self.runtime.snapshot.lanes.items():
            lanes[name] = {
                "policy": lane.config.routing,
                "affinity": lane.config.affinity.model_dump(),
                "decisions": shared.decisions.get(name, {}),
                "replicas": [{
                    "url": r.url,
                    "inflight": r.inflight,
                    "inflight_all_processes": board.inflight(name, r.url, r.inflight),
                    "homes": round(board.home_count(name, r.url), 2),
                    "breaker": r.state(now),
                } for r in lane.upstream.replicas],
            }
        return Response(orjson.dumps({"lanes": lanes, "process": shared.describe()}),
                        media_type="application/json")
