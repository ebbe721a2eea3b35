"""Conversation tracking as one part: the pinning policy (hot path), the turn-end bookkeeping,
the analyzer (after the response, in a worker process by default) and the drift API."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import GatewayError, invalid_request
from ..store import StateStore
from .alerts import AlertBook
from ..prefixcache import SharedPrefixes
from .analyzer import Analyzer
from .turn_end import TurnEnd
from .identity import DEFAULT_TENANT
from .lookup import candidate_ids
from .policy import ConversationPolicy
from .worker import AnalysisProcess

if TYPE_CHECKING:
    from ..core.runtime import Runtime
    from ..core.settings import Settings

TTL_S = 6 * 3600.0


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


class Conversations:
    def __init__(self, store: StateStore, runtime: "Runtime", settings: "Settings", kv_events: Any = None) -> None:
        self.store = store
        self.runtime = runtime
        header = runtime.snapshot.config.gateway.conversation_header
        self.alerts = AlertBook(store)
        self.process = AnalysisProcess(settings=settings) if settings.analysis != "thread" else None
        self.analyzer = Analyzer(store, self.alerts, TTL_S, threads=settings.analysis_threads, process=self.process,
                                 kv_events=kv_events,  # the KV-event verdicts (gateway/kvevents)
                                 inline_max_bytes=settings.analysis_inline_bytes,
                                 shared=SharedPrefixes())  # what each replica holds, from every conversation
        self.turn_end = TurnEnd(store, TTL_S)
        self.policy = ConversationPolicy(store, header, TTL_S, arm_turn_end=self.turn_end.arm)

    async def start(self) -> None:
        if self.process is not None:
            lanes = self.runtime.snapshot.lanes.values()
            self.process.start([lane.renderer.defaults for lane in lanes if lane.renderer is not None])

    async def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    # -- admin routes ----------------------------------------------------------------------------

    async def drift(self, request: Request) -> Response:
        q = request.query_params
        try:
            since = float(q["since"]) if "since" in q else None
            if since is not None and since < 0:  # negative: seconds ago
                since = time.time() + since
            min_lost = int(q.get("min_tokens_lost", 0))
            limit = max(1, min(int(q.get("limit", 100)), 1000))
        except ValueError:
            raise invalid_request("since, min_tokens_lost and limit must be numbers") from None
        items = await self.alerts.list(lane=q.get("lane"), cause=q.get("cause"), since=since,
                                       min_tokens_lost=min_lost, limit=limit)
        return _json({"alerts": items})

    async def conversation(self, request: Request) -> Response:
        from .state import ConversationState

        asked = request.path_params["cid"]
        raw = cid = None
        # The gateway's id, or the client's own key hashed within the tenant (?tenant=, default "default").
        for cid in candidate_ids(asked, request.query_params.get("tenant") or DEFAULT_TENANT):
            raw = await self.store.get("conv:" + cid)
            if raw is not None:
                break
        if raw is None:
            raise GatewayError(404, "no such conversation", param="cid", code="not_found")
        st = ConversationState.from_bytes(raw)
        return _json({"id": st.id, "looked_up_as": asked if cid != asked else None, "source": st.source,
                      "lane": st.lane, "turn": st.turn,
                      "pinned_effort": st.pinned_effort, "pinned_thinking": st.pinned_thinking,
                      "parent": st.parent, "replica": st.replica, "created": st.created,
                      "updated": st.updated, "state_bytes": len(raw),
                      "prompt_tokens": st.last.prompt_tokens if st.last else None,
                      "last_cache": st.last_cache.to_json() if st.last_cache is not None else None})
