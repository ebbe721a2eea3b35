"""Install routing: routers share one store and load board per process; a hot-path step does their lookups.

The step runs after the conversation policy (it needs the conversation and the applied effort) and
before forwarding: a router with `prepare` gets one store round trip there, so `order` stays plain
arithmetic. GET /admin/routing shows each lane's replicas, loads, homes and the decisions made.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..exchange import Exchange
from .load import LoadBoard
from .shared import RoutingShared

if TYPE_CHECKING:
    from ..app import Gateway
    from ..runtime import LaneRuntime


class RoutingStep:
    """The hot-path policy that lets a lane's router read the store before `order` is called."""

    name = "routing"

    async def apply(self, ex: Exchange, lane: "LaneRuntime", body: dict[str, Any]) -> None:
        prepare = getattr(lane.router, "prepare", None)
        if prepare is not None:
            await prepare(ex, lane, body)


def install(gw: "Gateway") -> None:
    from ..app import JSONResponse

    store = gw.services.get("store")
    shared = RoutingShared(store, LoadBoard(store))
    gw.services["routing"] = shared

    def bind(lane: "LaneRuntime") -> None:
        bind_router = getattr(lane.router, "bind", None)
        if bind_router is not None:
            bind_router(shared, lane.name, lane.config.affinity)

    gw.runtime.lane_hooks.append(bind)
    for lane in gw.runtime.snapshot.lanes.values():
        bind(lane)
    gw.runtime.policies.append(RoutingStep())

    def affine_lanes() -> dict[str, list]:
        return {name: lane.upstream.replicas for name, lane in gw.runtime.snapshot.lanes.items()
                if lane.config.routing == "conversation_affinity"}

    gw.startup.append(lambda: shared.board.start(affine_lanes))
    gw.shutdown.append(shared.board.stop)
    gw.shutdown.append(shared.drain)

    async def routing(request: Request) -> Response:
        guard = gw.services.get("admin_guard")
        if guard is not None:
            await guard(request)
        now = time.monotonic()
        board = shared.board
        lanes = {}
        for name, lane in gw.runtime.snapshot.lanes.items():
            lanes[name] = {
                "policy": lane.config.routing,
                "affinity": lane.config.affinity.model_dump(),
                "decisions": shared.decisions.get(name, {}),
                "replicas": [{
                    "url": r.url,
                    "inflight": r.inflight,
                    "inflight_all_processes": board.inflight(name, r.url, r.inflight),
                    "homes": round(board.home_count(name, r.url), 2),
                    "breaker": r.state(now) if hasattr(r, "state") else ("closed" if r.available(now) else "open"),
                } for r in lane.upstream.replicas],
            }
        return JSONResponse({"lanes": lanes, "process": shared.describe()})

    gw.routes.append(Route("/admin/routing", routing, methods=["GET"]))
