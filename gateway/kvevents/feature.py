"""The KV-event part's admin surface: GET /admin/api/kv (admin key) and its Prometheus collector.

Built and wired in compose.py: the service (service.py) goes to the analyzer (the verdict hook), to the
routers (prefix_source: kv_events), to the runtime's lane hooks (routes.yaml reloads) and to the
started services; this class to the route table and the metrics registry.
"""

from __future__ import annotations

from typing import Any, Iterator

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .service import KVEventsService


class KVEventsAdmin:
    def __init__(self, service: KVEventsService) -> None:
        self.service = service

    async def route(self, request: Request) -> Response:
        """Per replica: the stream, the index, the pool, the working set, the forecast and the alert."""
        body = orjson.dumps(self.service.overview(request.query_params.get("lane") or None),
                            option=orjson.OPT_NON_STR_KEYS)
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    def collect(self) -> Iterator[Any]:  # a prometheus_client collector
        return self.service.collect()
