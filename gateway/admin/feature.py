"""GET /admin (a static page, no build step) and the JSON it reads under /admin/api/.

  /admin/api/overview   lanes: engine, aliases, replicas and their health, in-flight, qualification
  /admin/api/records    recent request records (?limit, lane, since, conversation)
  /admin/api/stats      the per-lane summary `gateway stats` prints (?window_s, lane)
  /admin/api/charts     summary + chart series (?window_s, buckets)

Drift alerts come from `GET /admin/drift`, owned by the conversations part. Which key each route
needs is declared in the route table (compose.py); the page shell and its static files carry no data.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from ..errors import GatewayError, invalid_request

if TYPE_CHECKING:
    from ..aftermath import Aftermath
    from ..conversations.analyzer import Analyzer
    from ..records.feature import Records
    from ..runtime import Runtime
    from ..status import Status

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
PROBE_TTL_S = 5.0


def _json(data: Any, status: int = 200) -> Response:
    body = orjson.dumps(data, default=_fallback, option=orjson.OPT_NON_STR_KEYS)
    return Response(body, status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def _fallback(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
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
                 analyzer: "Analyzer") -> None:
        self.runtime = runtime
        self.status = status
        self.aftermath = aftermath
        self.records_ = records
        self.analyzer = analyzer
        self._probe: tuple[float, dict[str, Any]] | None = None

    def _records(self) -> "Records":
        return self.records_

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        path = STATIC / name
        # Only plain files directly inside static/: no traversal, no directories.
        if "/" in name or name.startswith(".") or not path.is_file() or path.suffix not in _TYPES:
            raise GatewayError(404, f"no admin file {name[:100]!r}", code="not_found")
        return FileResponse(path, media_type=_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})

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
                    "degraded" if rep.consecutive_failures else ("up" if p.get("reachable") or rep.last_ok else "unknown"))
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
                          **_analysis(self.analyzer)},
            "records": self.records_.counters(),
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
        q = request.query_params
        limit = int(_num(request, "limit", 100, 1, 5000))
        since = q.get("since")
        rows = await self._records().recent(limit, q.get("lane") or None,
                                            _num(request, "since", 0, 0, 1e12) if since else None,
                                            q.get("conversation") or None)
        return _json({"records": rows})

    async def stats(self, request: Request) -> Response:
        window = _num(request, "window_s", 3600, 1, 90 * 86400)
        return _json(await self._records().stats(window, request.query_params.get("lane") or None))

    async def charts(self, request: Request) -> Response:
        window = _num(request, "window_s", 3600, 60, 90 * 86400)
        buckets = int(_num(request, "buckets", 60, 1, 720))
        return _json(await self._records().charts(window, buckets))


def _analysis(analyzer: "Analyzer") -> dict[str, Any]:
    process = analyzer.process
    return {"analysis_failures": analyzer.failures, "analysis_last_ms": round(analyzer.last_ms, 1),
            "analysis_in": "process" if process is not None else "thread",
            "analysis_worker_pid": process.pid() if process is not None else None,
            "analysis_worker_deaths": process.deaths if process is not None else 0}


def _lane_health(states: list[str]) -> str:
    if states and all(s == "down" for s in states):
        return "down"
    if any(s in ("down", "degraded") for s in states):
        return "degraded"
    if any(s == "up" for s in states):
        return "up"
    return "unknown"
