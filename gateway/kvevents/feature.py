"""Install the KV-event part: subscribers in step with routes.yaml, the analyzer's hook, metrics and
GET /admin/api/kv (admin key): per replica the stream, the index, the pool pressure and forecast."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .service import KVEventsService

if TYPE_CHECKING:
    from ..app import Gateway


class _Collector:
    def __init__(self, service: KVEventsService) -> None:
        self.service = service

    def collect(self):
        return self.service.collect()


def install(gw: "Gateway") -> None:
    from ..app import JSONResponse

    service = KVEventsService(gw.runtime)
    gw.runtime.lane_hooks.append(service.lane_changed)
    gw.startup.append(service.start)
    gw.shutdown.append(service.stop)
    analyzer = gw.services.get("analyzer")
    if analyzer is not None:
        analyzer.kv_events = service
    routing = gw.services.get("routing")
    if routing is not None:
        routing.kv = service  # conversation_affinity with prefix_source: kv_events
    metrics = gw.services.get("metrics")
    registry = getattr(metrics, "registry", None)
    if registry is not None:
        registry.register(_Collector(service))
    gw.kv_events = service  # type: ignore[attr-defined]  # for the composition root (issue 14) to take over

    async def kv(request: Request) -> Response:
        guard = gw.services.get("admin_guard")
        if guard is not None:
            await guard(request)
        return JSONResponse(service.overview(request.query_params.get("lane") or None))

    gw.routes.append(Route("/admin/api/kv", kv, methods=["GET"]))
