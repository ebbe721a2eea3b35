"""The ASGI application: the route table with its protection, the lifespan (parts, reload watcher,
SIGHUP), and the error shape for everything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any, AsyncIterator, Callable

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .core import memory
from .observe import gc_tuning
from .compose import Gateway, build
from .server.access import Access
from .server.asgi_answer import AsgiAnswer, asgi_endpoint
from .server.cors import CorsGate
from .core.errors import GatewayError, error_body
from .core.runtime import watch_routes
from .core.settings import Settings

log = logging.getLogger("gateway")


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


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


_PROTOCOL = "gateway.server.serving"


def create_app(settings: Settings | None = None) -> CorsGate:
    settings = settings or Settings()
    # Other threads of this process (records, limits' counting near the window, analysis with
    # GATEWAY_ANALYSIS=thread) run Python loops; by default a thread keeps the GIL for 5 ms at a
    # time, which would stall the event loop (and every stream) that long.
    sys.setswitchinterval(0.0005)
    memory.limit_arenas()
    gw = build(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        stop = asyncio.Event()
        tasks = []
        loop = asyncio.get_running_loop()
        if settings.watch_routes:
            tasks.append(asyncio.create_task(watch_routes(gw.runtime, stop, also=gw.security.key_file)))
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, gw.runtime.reload_from_disk)
        try:
            await gw.start()
        except Exception as exc:
            log.critical("the gateway cannot start: %s", exc)
            await gw.stop()
            raise
        gc_tuning.settle(settings.gc_thresholds)
        if _PROTOCOL not in sys.modules:  # uvicorn imports the configured protocol before the lifespan runs
            log.warning("serving without the gateway's HTTP protocol: no read deadlines (a slow client holds its "
                        "connection) and every request goes through ASGI; run `gateway serve`, or uvicorn with "
                        "--http %s:DeadlineHttpToolsProtocol", _PROTOCOL)
        try:
            yield
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await gw.stop()

    endpoints = gw.endpoints()
    protected = {ep.path: gw.security.protect(ep) for ep in endpoints}
    routes = [Route(ep.path, asgi_endpoint(protected[ep.path]), methods=list(ep.methods)) for ep in endpoints]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={GatewayError: _gateway_error, HTTPException: _http_error, Exception: _unexpected},
    )
    app.state.gateway = gw
    app.router.redirect_slashes = False  # a trailing slash answered an empty 307; now a JSON 404
    # The pipeline's routes: every client POST (each writes its own access line, from the aftermath).
    fast = {ep.path: protected[ep.path] for ep in endpoints if ep.access is Access.CLIENT and "POST" in ep.methods}
    return CorsGate(FastPath(app, fast, gw.access_log), gw.runtime)


class FastPath:
    """The pipeline's endpoints go straight to their (protected) handlers; everything else through Starlette.

    Starlette's middleware wraps `send` in a closure per layer, and a stream calls `send` once per
    chunk; the pipeline already answers every error itself in its API's shape, so it needs none of it.
    """

    def __init__(self, app: Starlette, handlers: dict[str, Callable[[Request], Any]], access_log: Any = None) -> None:
        self.app = app
        self.state = app.state
        self.handlers = handlers
        self.access_log = access_log  # lines for the other routes; the proxy path's come from the aftermath

    @property
    def gateway(self) -> Gateway:
        return self.app.state.gateway

    @property
    def settings(self) -> Settings:
        """What the HTTP protocol reads (gateway/server/serving.py): the deadlines, the wire path."""
        return self.gateway.settings

    def wire_handler(self, path: str) -> Callable[[Any], Any] | None:
        """The protected handler the HTTP protocol runs without ASGI (gateway/server/wire.py), if any: not
        while CORS is configured (its headers come from Starlette's middleware)."""
        if self.gateway.runtime.snapshot.config.gateway.cors is not None:
            return None
        return self.handlers.get(path)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handler = self.handlers.get(scope.get("path", "")) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            line = self.access_log.plain(scope) if self.access_log is not None and scope["type"] == "http" else None
            await self.app(scope, receive, line.wrap(send) if line is not None else send)
            return
        response: Any
        try:
            response = AsgiAnswer(await handler(Request(scope, receive)))
        except GatewayError as exc:  # e.g. the client-key check, before the pipeline
            response = Response(exc.json_bytes(), status_code=exc.status, media_type="application/json",
                                headers=exc.headers)
        except Exception as exc:  # the pipeline catches its own; this is the last resort
            response = await _unexpected(Request(scope, receive), exc)
        await response(scope, receive, send)
