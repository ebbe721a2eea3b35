"""Install conversation tracking: the pinning policy (hot path), the analyzer, the drift API."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import invalid_request
from .alerts import AlertBook
from .analyzer import Analyzer, TurnEnd
from .lookup import candidate_ids
from .policy import ConversationPolicy
from .worker import AnalysisProcess

if TYPE_CHECKING:
    from ..app import Gateway

TTL_S = 6 * 3600.0


def install(gw: "Gateway") -> None:
    from ..app import JSONResponse

    store = gw.services["store"]
    header = gw.runtime.snapshot.config.gateway.conversation_header
    alerts = AlertBook(store)
    process = AnalysisProcess() if gw.settings.analysis != "thread" else None
    analyzer = Analyzer(store, alerts, TTL_S, threads=gw.settings.analysis_threads, process=process)
    if process is not None:
        def start() -> None:
            lanes = gw.runtime.snapshot.lanes.values()
            process.start([lane.extras["renderer"].defaults for lane in lanes if "renderer" in lane.extras])

        gw.startup.append(start)
        gw.shutdown.append(process.stop)
    gw.runtime.policies.append(ConversationPolicy(store, header, TTL_S))
    gw.runtime.finishers.insert(0, TurnEnd(store, TTL_S))  # before the aftermath queue
    gw.aftermath.analyzers.append(analyzer)
    gw.services["alerts"] = alerts
    gw.services["analyzer"] = analyzer

    async def drift(request: Request) -> Response:
        guard = gw.services.get("admin_guard")
        if guard is not None:
            await guard(request)
        q = request.query_params
        try:
            since = float(q["since"]) if "since" in q else None
            if since is not None and since < 0:  # negative: seconds ago
                since = time.time() + since
            min_lost = int(q.get("min_tokens_lost", 0))
            limit = max(1, min(int(q.get("limit", 100)), 1000))
        except ValueError:
            raise invalid_request("since, min_tokens_lost and limit must be numbers") from None
        items = await alerts.list(lane=q.get("lane"), cause=q.get("cause"), since=since,
                                  min_tokens_lost=min_lost, limit=limit)
        return JSONResponse({"alerts": items})

    async def conversation(request: Request) -> Response:
        guard = gw.services.get("admin_guard")
        if guard is not None:
            await guard(request)
        from .state import ConversationState

        raw = cid = None
        for cid in candidate_ids(request.path_params["cid"]):  # the gateway's id, or the client's own key
            raw = await store.get("conv:" + cid)
            if raw is not None:
                break
        if raw is None:
            return JSONResponse({"error": {"message": "no such conversation", "type": "invalid_request_error",
                                           "param": "cid", "code": "not_found"}}, status_code=404)
        st = ConversationState.from_bytes(raw)
        return JSONResponse({"id": st.id, "looked_up_as": request.path_params["cid"] if cid != request.path_params["cid"]
                             else None, "source": st.source, "lane": st.lane, "turn": st.turn,
                             "pinned_effort": st.pinned_effort, "pinned_thinking": st.pinned_thinking,
                             "parent": st.parent, "replica": st.replica, "created": st.created,
                             "updated": st.updated, "state_bytes": len(raw),
                             "prompt_tokens": st.last.prompt_tokens if st.last else None,
                             "last_cache": st.last_cache})

    gw.routes.append(Route("/admin/drift", drift, methods=["GET"]))
    gw.routes.append(Route("/admin/conversations/{cid:path}", conversation, methods=["GET"]))
