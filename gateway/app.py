"""The ASGI application: routes, lifespan (reload watcher, SIGHUP), and the error shape for everything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from typing import Any, AsyncIterator, Callable

import aiohttp
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import gc_tuning
from .aftermath import Aftermath
from .config import ConfigError, load_routes
from .cors import CorsGate
from .errors import GatewayError, error_body
from .features import install_all
from .pipeline import Pipeline
from .runtime import Runtime, watch_routes
from .settings import Settings

log = logging.getLogger("gateway")



class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class Gateway:
    """Everything one gateway process holds: settings, live routes, the hot path, features."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            config = load_routes(settings.routes_path)
        except ConfigError:
            raise
        self.runtime = Runtime(config, settings.routes_path)
        self.pipeline = Pipeline(self.runtime, config.gateway.max_request_bytes)
        self.aftermath = Aftermath()
        self.runtime.finishers.append(self.aftermath)
        self.routes: list[Route] = []
        self.startup: list[Callable[[], Any]] = []
        self.shutdown: list[Callable[[], Any]] = []
        self.services: dict[str, Any] = {}
        self.started_at = time.time()
        self._ready_cache: tuple[float, dict[str, Any]] | None = None

    # -- public endpoints ---------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        config = self.runtime.snapshot.config
        created = int(self.started_at)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "gateway"} for name in config.models]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name not in self.runtime.snapshot.config.models:
            raise GatewayError(404, f"The model '{name[:200]}' does not exist", param="model", code="model_not_found")
        return JSONResponse({"id": name, "object": "model", "created": int(self.started_at), "owned_by": "gateway"})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        now = time.monotonic()
        if self._ready_cache is None or now - self._ready_cache[0] > 2.0:
            self._ready_cache = (now, await self._probe_lanes())
        report = dict(self._ready_cache[1])
        report["config"] = self.config_state()
        ready = any(l["reachable"] for l in report["lanes"].values())
        report["status"] = "ready" if ready else "not_ready"
        return JSONResponse(report, status_code=200 if ready else 503)

    def config_state(self) -> dict[str, Any]:
        snap = self.runtime.snapshot
        return {
            "version": snap.version,
            "loaded_at": snap.loaded_at,
            "path": str(self.settings.routes_path),
            "last_reload_error": self.runtime.last_reload_error,
            "last_reload_at": self.runtime.last_reload_at,
        }

    async def _probe_lanes(self) -> dict[str, Any]:
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
                    **{k: v for k, v in lane.extras.items() if k in ("qualification",)},
                }
        return {"lanes": lanes}


def _error_response(status: int, message: str, code: str | None = None) -> Response:
    body = error_body(message, type="invalid_request_error" if status < 500 else "api_error", code=code)
    return JSONResponse(body, status_code=status)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return Response(exc.json_bytes(), status_code=exc.status, media_type="application/json", headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    path = request.url.path
    message = f"{request.method} {path[:200]}: {exc.detail}"
    if exc.status_code == 404 and len(path) > 1 and path.endswith("/"):
        message += f" (no trailing slash: {path.rstrip('/')[:200]})"  # instead of an empty 307
    return _error_response(exc.status_code, message, code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return _error_response(500, "internal gateway error; it has been logged", "internal_error")


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own arena (up to 8 per core); the analysis and
    records threads then hold freed memory apart from the event loop's, and RSS creeps up."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings()
    # Other threads of this process (records, limits' counting near the window, analysis with
    # GATEWAY_ANALYSIS=thread) run Python loops; by default a thread keeps the GIL for 5 ms at a
    # time, which would stall the event loop (and every stream) that long.
    sys.setswitchinterval(0.0005)
    _limit_malloc_arenas()
    gw = Gateway(settings)
    install_all(gw)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        stop = asyncio.Event()
        tasks = []
        loop = asyncio.get_running_loop()
        if settings.watch_routes:
            tasks.append(asyncio.create_task(watch_routes(gw.runtime, stop)))
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, gw.runtime.reload_from_disk)
        gw.aftermath.start()
        for fn in gw.startup:
            result = fn()
            if asyncio.iscoroutine(result):
                await result
        gc_tuning.settle()
        try:
            yield
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await gw.aftermath.stop()
            for fn in gw.shutdown:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            await gw.runtime.close()

    routes = [
        Route("/v1/chat/completions", gw.pipeline.chat, methods=["POST"]),
        Route("/v1/completions", gw.pipeline.completions, methods=["POST"]),
        Route("/v1/models", gw.models, methods=["GET"]),
        Route("/v1/models/{model:path}", gw.model, methods=["GET"]),
        Route("/healthz", gw.healthz, methods=["GET"]),
        Route("/readyz", gw.readyz, methods=["GET"]),
        *gw.routes,
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={GatewayError: _gateway_error, HTTPException: _http_error, Exception: _unexpected},
    )
    app.state.gateway = gw
    app.router.redirect_slashes = False  # a trailing slash answered an empty 307; now a JSON 404
    return CorsGate(FastPath(app, {"/v1/chat/completions": lambda r: gw.pipeline.chat(r),
                                   "/v1/completions": lambda r: gw.pipeline.completions(r)}), gw.runtime)


class FastPath:
    """The two proxy endpoints go straight to the pipeline; everything else through Starlette.

    Starlette's middleware wraps `send` in a closure per layer, and a stream calls `send` once per
    chunk; the pipeline already answers every error itself in OpenAI's shape, so it needs none of it.
    """

    def __init__(self, app: Starlette, handlers: dict[str, Callable[[Request], Any]]) -> None:
        self.app = app
        self.state = app.state
        self.handlers = handlers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handler = self.handlers.get(scope.get("path", "")) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(Request(scope, receive))
        except GatewayError as exc:  # e.g. the client-key check, before the pipeline
            response = Response(exc.json_bytes(), status_code=exc.status, media_type="application/json",
                                headers=exc.headers)
        except Exception as exc:  # the pipeline catches its own; this is the last resort
            response = await _unexpected(Request(scope, receive), exc)
        await response(scope, receive, send)
