"""GET /admin (a static page, no build step) and the JSON it reads under /admin/api/.

  /admin/api/overview   lanes: engine, aliases, replicas and their health, in-flight, qualification
  /admin/api/records    recent request records (?limit, lane, since, conversation)
  /admin/api/stats      the per-lane summary `gateway stats` prints (?window_s, lane)
  /admin/api/charts     summary + chart series + prefill costs (?window_s, buckets, filters)
  /admin/api/alerts     drift alerts graded and triaged, fleet-wide with PostgreSQL (filters below)
  /admin/api/triage     GET active acknowledgements/mutes, POST one; DELETE /admin/api/triage/<id>
  /admin/api/conversations/<id or client key>   one conversation's turns as a timeline (?tenant)

Filters (records, stats, charts, alerts): lane, tenant, client, user_agent, cause, verdict,
conversation, gateway, since, until (epoch seconds, negative = seconds ago).

Drift alerts come from `GET /admin/drift`, owned by the conversations part. Which key each route
needs is declared in the route table (compose.py); the page shell and its static files carry no data.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from ..conversations.alerts import ALERT_COLUMNS, GROUPS, SEVERITIES, review
from ..conversations.identity import DEFAULT_TENANT
from ..conversations.lookup import candidate_ids
from ..conversations.remedies import remedy_for
from ..core.errors import GatewayError, invalid_request
from ..records.query import Filters

if TYPE_CHECKING:
    from ..observe.aftermath import Aftermath
    from ..conversations.analyzer import Analyzer
    from ..records.feature import Records
    from ..core.runtime import Runtime
    from ..api.status import Status
    from ..store import StateStore

STATIC = Path(__file__).parent / "static"
# The files the page may load, by name: nothing else under /admin/static/ is ever opened (a name
# from the URL never reaches the filesystem; a 300-character name was a 500 from open()).
_FILES = {
    "admin.js": "text/javascript",
    "charts.js": "text/javascript",
    "admin.css": "text/css",
}
PROBE_TTL_S = 5.0

# The page is static files of its own plus fetch() to /admin/api: nothing else may load or frame it.
# Inline style attributes (bar widths, lane colours) are set by the page's own script: 'unsafe-inline'
# for styles only; scripts only from this origin.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_API_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}


def _json(data: Any, status: int = 200) -> Response:
    body = orjson.dumps(data, default=_fallback, option=orjson.OPT_NON_STR_KEYS)
    return Response(body, status_code=status, media_type="application/json", headers=dict(_API_HEADERS))


def _fallback(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _num(request: Request, name: str, default: float, lo: float, hi: float) -> float:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise invalid_request(f"{name} must be a number", param=name) from None
    return min(hi, max(lo, value))


class AdminAPI:
    def __init__(self, runtime: "Runtime", status: "Status", aftermath: "Aftermath", records: "Records",
                 analyzer: "Analyzer", store: "StateStore | None" = None) -> None:
        self.runtime = runtime
        self.store = store  # the live conversation state, beside the records on the conversation page
        self.status = status
        self.aftermath = aftermath
        self.records_ = records
        self.analyzer = analyzer
        self._probe: tuple[float, dict[str, Any]] | None = None

    def _records(self) -> "Records":
        return self.records_

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=dict(PAGE_HEADERS))

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        media_type = _FILES.get(name)
        if media_type is None:
            raise GatewayError(404, f"no admin file {name[:100]!r}", code="not_found")
        return FileResponse(STATIC / name, media_type=media_type, headers=dict(PAGE_HEADERS))

    async def overview(self, request: Request) -> Response:
        snap = self.runtime.snapshot
        probe = await self._probed() if request.query_params.get("probe", "1") != "0" else {}
        now = time.monotonic()
        aliases: dict[str, list[str]] = {}
        for alias, lane_name in snap.config.models.items():
            aliases.setdefault(lane_name, []).append(alias)
        lanes = []
        for name, lane in snap.lanes.items():
            probed = {r["url"]: r for r in probe.get(name, {}).get("replicas", [])}
            replicas = []
            for rep in lane.upstream.replicas:
                p = probed.get(rep.url, {})
                open_ = not rep.available(now)
                health = "down" if open_ or p.get("reachable") is False else (
                    "degraded" if rep.consecutive_failures
                    else ("up" if p.get("reachable") or rep.last_ok else "unknown"))
                replicas.append({
                    "url": rep.url, "health": health, "inflight": rep.inflight, "requests": rep.requests,
                    "failures": rep.failures, "consecutive_failures": rep.consecutive_failures,
                    "breaker_open": open_, "last_error": rep.last_error, "last_ok": rep.last_ok,
                    "probe_ms": p.get("ms"), "probe_status": p.get("status"), "probe_error": p.get("error"),
                })
            cfg = lane.config
            lanes.append({
                "name": name,
                "engine": cfg.engine,
                "upstream_model": cfg.upstream_model,
                "models": sorted(aliases.get(name, [])),
                "inflight": lane.inflight,
                "routing": cfg.routing,
                "effort_policy": cfg.effort_policy,
                "qualification": {
                    "required": cfg.qualification == "required",
                    "override": cfg.override.reason if cfg.override else None,
                    "state": lane.qualification,
                },
                "health": _lane_health([r["health"] for r in replicas]),
                "replicas": replicas,
            })
        return _json({
            "now": time.time(),
            "started_at": self.status.started_at,
            "config": self.status.config_state(),
            "aftermath": {"processed": self.aftermath.processed, "skipped_analysis": self.aftermath.skipped_analysis,
                          "shed_superseded": self.aftermath.shed_superseded,
                          "shed_queue_full": self.aftermath.shed_queue_full, "queued": self.aftermath.queued,
                          **_analysis(self.analyzer)},
            "records": {**self.records_.counters(), "source": self.records_.source()},
            "lanes": lanes,
        })

    async def _probed(self) -> dict[str, Any]:
        """Replica reachability, probed at most every few seconds however many pages are open."""
        probe = self.status.probe_lanes
        now = time.monotonic()
        if self._probe is None or now - self._probe[0] > PROBE_TTL_S:
            try:
                self._probe = (now, (await probe()).get("lanes", {}))
            except Exception:  # noqa: BLE001 - probing is a nicety; breaker state still shows
                self._probe = (now, {})
        return self._probe[1]

    async def records(self, request: Request) -> Response:
        limit = int(_num(request, "limit", 100, 1, 5000))
        rows = await _db(self._records().recent(limit, filters=filters_from(request)))
        return _json({"records": rows})

    async def stats(self, request: Request) -> Response:
        window = _num(request, "window_s", 3600, 1, 90 * 86400)
        return _json(await _db(self._records().stats(window, filters=filters_from(request))))

    async def charts(self, request: Request) -> Response:
        window = _num(request, "window_s", 3600, 60, 90 * 86400)
        buckets = int(_num(request, "buckets", 60, 1, 720))
        return _json(await _db(self._records().charts(window, buckets, filters=filters_from(request))))

    # -- the reviewers' workflow ----------------------------------------------------------------

    async def alerts(self, request: Request) -> Response:
        """Drift alerts of the whole fleet (records in PostgreSQL) or this host (SQLite), graded and
        triaged: ?window_s, lane, cause, severity, group, tenant, client, user_agent, since, until,
        conversation_key (the client's own key for its session), show=open|all, limit."""
        q = request.query_params
        window = _num(request, "window_s", 86400, 60, 90 * 86400)
        limit = int(_num(request, "limit", 200, 1, 2000))
        severity, group, show = q.get("severity") or None, q.get("group") or None, q.get("show") or "open"
        if severity and severity not in SEVERITIES:
            raise invalid_request(f"severity must be one of {', '.join(SEVERITIES)}", param="severity")
        if group and group not in GROUPS:
            raise invalid_request(f"group must be one of {', '.join(GROUPS)}", param="group")
        if show not in ("open", "all"):
            raise invalid_request("show must be open or all", param="show")
        records = self._records()
        f = filters_from(request).with_(verdict="drift")
        now = time.time()
        found: Sequence[str | None] = [None]
        if q.get("conversation_key"):
            found = candidate_ids(q["conversation_key"], f.tenant or DEFAULT_TENANT)
        rows: list[dict[str, Any]] = []
        for cid in found:
            rows = await _db(records.rows(window, filters=f.with_(conversation=cid) if cid else f,
                                          columns=ALERT_COLUMNS, now=now))
            if rows:
                break
        rules = await _db(records.triage())
        # Grouping and grading is pure Python over every drift record of the window: in a thread,
        # so the event loop keeps relaying streams meanwhile.
        out = await asyncio.to_thread(review, rows, rules, now, severity, group, show, limit)
        out["window_s"] = window
        out["filters"] = {**f.as_dict(), "severity": severity, "group": group, "show": show}
        out["source"] = records.source()
        return _json(out)

    async def triage(self, request: Request) -> Response:
        """GET: active acknowledgements and mutes. POST {kind: ack|mute, lane, cause, client,
        expires_in_s | until, note, author}: "*" or a missing field matches anything."""
        records = self._records()
        if request.method == "GET":
            return _json({"rules": await _db(records.triage())})
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise invalid_request("the body must be a JSON object") from None
        rule = parse_rule(body)
        if records.db is None:
            raise GatewayError(503, "acknowledge and mute need a records database", code="records_disabled")
        return _json(await _db(records.triage_add(rule)), status=201)

    async def triage_delete(self, request: Request) -> Response:
        ok = await _db(self._records().triage_delete(request.path_params["rule_id"]))
        if not ok:
            raise GatewayError(404, "no such acknowledgement or mute", code="not_found")
        return _json({"deleted": request.path_params["rule_id"]})

    async def conversation(self, request: Request) -> Response:
        """One conversation's turns as a timeline, found by the gateway's id or the client's own key
        (?tenant= narrows it to one tenant)."""
        key = request.path_params["key"]
        tenant = (request.query_params.get("tenant") or "").strip() or None
        records = self._records()
        for cid in candidate_ids(key, tenant or DEFAULT_TENANT):
            rows = await _db(records.conversation(cid))
            if tenant:
                rows = [r for r in rows if (r.get("tenant") or "default") == tenant]
            if rows:
                return _json(await self._timeline(cid, key, rows))
        raise GatewayError(404, f"no conversation {key[:100]!r}" + (f" in tenant {tenant!r}" if tenant else "") +
                           " in the records (tried the gateway's id and the client's key, hashed)",
                           code="not_found", param="key")

    async def _timeline(self, cid: str, key: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        turns = []
        for r in rows:
            rem = remedy_for(r.get("cause"), r.get("effort_action") == "repinned", r.get("path")) \
                if r.get("verdict") in ("drift", "eviction") or r.get("cause") else None
            if r.get("verdict") == "eviction":
                rem = remedy_for("eviction")
            turns.append({k: r.get(k) for k in TIMELINE_COLUMNS} | ({
                "title": rem.title, "fixable_by": rem.fixable_by, "remedy": rem.remedy} if rem else {}))
        state = None
        store = self.store
        if store is not None:
            try:
                raw = await store.get("conv:" + cid)
            except Exception:  # noqa: BLE001 - the live state is a nicety beside the records
                raw = None
            if raw is not None:
                from ..conversations.state import ConversationState

                st = ConversationState.from_bytes(raw)
                state = {"turn": st.turn, "pinned_effort": st.pinned_effort, "pinned_thinking": st.pinned_thinking,
                         "replica": st.replica, "parent": st.parent, "updated": st.updated, "state_bytes": len(raw)}
        last = rows[-1]
        lost = [t for t in turns if t.get("tokens_lost")]
        return {
            "conversation": cid,
            "looked_up_as": key if key != cid else None,
            "source": last.get("conversation_source"),
            "tenant": last.get("tenant") or "default",
            "client": last.get("client"),
            "user_agent": last.get("user_agent"),
            "lane": last.get("lane"),
            "model": last.get("model"),
            "first_seen": rows[0].get("ts"),
            "last_seen": last.get("ts"),
            "totals": {"turns": len(turns), "prompt_tokens": sum(t.get("prompt_tokens") or 0 for t in turns),
                       "cached_tokens": sum(t.get("cached_tokens") or 0 for t in turns),
                       "tokens_lost": sum(t.get("tokens_lost") or 0 for t in turns),
                       "seconds_lost": round(sum(t.get("seconds_lost") or 0.0 for t in turns), 3),
                       "drifts": sum(1 for t in turns if t.get("verdict") == "drift"),
                       "turns_with_loss": len(lost)},
            "state": state,
            "turns": turns,
        }


TIMELINE_COLUMNS = (
    "ts", "request_id", "gateway", "turn", "status", "error_code", "cancelled", "model", "lane", "replica",
    "stream", "prompt_tokens", "cached_tokens", "predicted_cached_tokens", "verdict", "cause",
    "divergence_message_index", "divergence_field", "diff_before", "diff_after", "tokens_lost", "seconds_lost",
    "effort_requested", "effort_applied", "effort_action", "thinking_applied", "ttft_s", "decode_tps",
    "total_s", "completion_tokens", "reasoning_tokens", "messages", "finish_reason", "limits_fired", "render",
)


def parse_rule(body: Any) -> dict[str, Any]:
    """A triage rule from a JSON body, every field checked; a bad one is a clear 400."""
    if not isinstance(body, dict):
        raise invalid_request("the body must be a JSON object")
    unknown = set(body) - {"kind", "lane", "cause", "client", "expires_in_s", "until", "note", "author"}
    if unknown:
        raise invalid_request(f"unknown field {sorted(unknown)[0]!r}", param=sorted(unknown)[0])
    kind = body.get("kind")
    if kind not in ("ack", "mute"):
        raise invalid_request("kind must be 'ack' or 'mute'", param="kind")
    rule: dict[str, Any] = {"kind": kind}
    for name in ("lane", "cause", "client"):
        v = body.get(name, "*")
        if v is None:
            v = "*"
        if not isinstance(v, str) or not v.strip() or len(v) > 200:
            raise invalid_request(f"{name} must be a non-empty string (\"*\" for any)", param=name)
        rule[name] = v.strip()
    if kind == "mute" and rule["lane"] == rule["cause"] == rule["client"] == "*":
        raise invalid_request("a mute must name at least one of lane, cause, client", param="cause")
    now = time.time()
    if "until" in body and "expires_in_s" in body:
        raise invalid_request("give until or expires_in_s, not both", param="until")
    raw_until = body.get("until")
    raw_in = body.get("expires_in_s", 86400)  # read only when `until` is not given
    try:
        until = float(raw_until) if raw_until is not None else now + float(raw_in)
    except (TypeError, ValueError):
        raise invalid_request("until (epoch seconds) or expires_in_s must be a number", param="until") from None
    if not now < until <= now + 90 * 86400:
        raise invalid_request("the expiry must lie in the next 90 days", param="until")
    rule["until"] = until
    for name in ("note", "author"):
        v = body.get(name)
        if v is not None and not isinstance(v, str):
            raise invalid_request(f"{name} must be a string", param=name)
        rule[name] = (v or "")[:500] or None
    return rule


def filters_from(request: Request) -> Filters:
    """?lane, tenant, client, user_agent, cause, verdict, conversation, gateway, since, until.

    `since` and `until` are epoch seconds; a negative number means that many seconds ago.
    """
    q = request.query_params
    now = time.time()

    def when(name: str) -> float | None:
        raw = q.get(name)
        if raw is None or raw == "":
            return None
        try:
            v = float(raw)
        except ValueError:
            raise invalid_request(f"{name} must be epoch seconds, or negative seconds ago", param=name) from None
        return now + v if v < 0 else v

    def text(name: str) -> str | None:
        return (q.get(name) or "").strip()[:200] or None

    return Filters(lane=text("lane"), tenant=text("tenant"), client=text("client"), user_agent=text("user_agent"),
                   cause=text("cause"), verdict=text("verdict"), conversation=text("conversation"),
                   gateway=text("gateway"), since=when("since"), until=when("until"))


async def _db(awaitable: Any) -> Any:
    """A records query; a database that is down is a clear 503, never a 500."""
    try:
        return await awaitable
    except GatewayError:
        raise
    except Exception as exc:  # noqa: BLE001 - sqlite3.Error, psycopg.Error, OSError...
        raise GatewayError(503, f"the records database is unavailable: {type(exc).__name__}: {str(exc)[:200]}",
                           code="records_unavailable") from None


def _analysis(analyzer: "Analyzer") -> dict[str, Any]:
    process = analyzer.process
    return {"analysed": analyzer.analysed, "analysis_failures": analyzer.failures,
            "analysis_last_ms": round(analyzer.last_ms, 1),
            "analysis_in": "process" if process is not None else "thread",
            "analysis_inline": analyzer.inline,
            "analysis_worker_pid": process.pid() if process is not None else None,
            "analysis_worker_deaths": process.deaths if process is not None else 0,
            "analysis_batches": process.batches if process is not None else 0,
            "analysis_batches_behind": process.behind_batches if process is not None else 0}


def _lane_health(states: list[str]) -> str:
    if states and all(s == "down" for s in states):
        return "down"
    if any(s in ("down", "degraded") for s in states):
        return "degraded"
    if any(s == "up" for s in states):
        return "up"
    return "unknown"
