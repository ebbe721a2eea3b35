"""What the gateway says about itself to anyone and to admins: liveness, readiness, the model list.

`/healthz` and the bare `/readyz` status are public (load balancers and orchestrators poll them
without keys); what `/readyz` knows beyond ready / not ready (replica URLs, the routes.yaml path, the
last reload error, which may quote the file) is given only with the admin key.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response

from .models import ModelCatalog

if TYPE_CHECKING:
    from ..core.runtime import Runtime
    from ..server.security import Caller, Security
    from ..core.settings import Settings

READY_CACHE_S = 2.0  # probing every replica on each poll would turn an orchestrator into load


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


class Status:
    def __init__(self, runtime: "Runtime", settings: "Settings", security: "Security") -> None:
        self.runtime = runtime
        self.settings = settings
        self.security = security
        self.started_at = time.time()
        self.catalog = ModelCatalog(runtime, self.started_at)
        self._ready_cache: tuple[float, dict[str, Any]] | None = None

    # -- client routes (a client key) --------------------------------------------------------------

    async def models(self, request: Request, caller: "Caller") -> Response:
        return _json(await self.catalog.list())  # root, max_model_len, the lane's state: models_api.py

    async def model(self, request: Request, caller: "Caller") -> Response:
        return _json(await self.catalog.one(request.path_params["model"]))

    # -- public routes -----------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        now = time.monotonic()
        if self._ready_cache is None or now - self._ready_cache[0] > READY_CACHE_S:
            self._ready_cache = (now, await self.probe_lanes())
        lanes = self._ready_cache[1]["lanes"]
        ready = any(lane["reachable"] for lane in lanes.values())
        status = 200 if ready else 503
        if not (self.security.demo or self.security.is_admin(request)):
            return _json({"status": "ready" if ready else "not_ready"}, status)
        report = {"status": "ready" if ready else "not_ready", "lanes": lanes, "config": self.config_state()}
        return _json(report, status)

    def config_state(self) -> dict[str, Any]:
        snap = self.runtime.snapshot
        return {
            "version": snap.version,
            "loaded_at": snap.loaded_at,
            "path": str(self.settings.routes_path),
            "last_reload_error": self.runtime.last_reload_error,
            "last_reload_at": self.runtime.last_reload_at,
            "keys_error": self.security.key_error,
        }

    async def probe_lanes(self) -> dict[str, Any]:
        snap = self.runtime.snapshot

        async def probe(session: aiohttp.ClientSession, url: str, key: str | None) -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            t0 = time.perf_counter()
            try:
                async with session.get(url + "/v1/models", headers=headers) as resp:
                    await resp.read()
                    return {"url": url, "reachable": resp.status < 500, "status": resp.status,
                            "ms": round((time.perf_counter() - t0) * 1000, 2)}
            except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
                return {"url": url, "reachable": False, "error": type(exc).__name__}

        lanes: dict[str, Any] = {}
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for name, lane in snap.lanes.items():
                key = lane.upstream.api_key
                results = await asyncio.gather(*(probe(session, r.url, key) for r in lane.upstream.replicas))
                lanes[name] = {
                    "engine": lane.config.engine,
                    "reachable": any(r["reachable"] for r in results),
                    "replicas": results,
                    **({"qualification": lane.qualification} if lane.qualification is not None else {}),
                }
        return {"lanes": lanes}
