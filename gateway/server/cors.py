"""CORS for browsers calling the API: an allow-list from routes.yaml (`gateway.cors`), or nothing.

Without `gateway.cors` no CORS header is ever sent (browsers on other origins cannot read answers;
server-side clients do not care). With it, Starlette's CORSMiddleware answers preflights and adds
the headers; credentials (cookies) are never allowed: the API authenticates with a bearer key.
The allow-list follows reloads of routes.yaml: one middleware per distinct `cors` section, made on
first use. Cost without CORS: one attribute read per request.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.middleware.cors import CORSMiddleware
from starlette.types import Receive, Scope, Send

from ..core.config import Cors


class GatewayApp(Protocol):
    """The application CORS wraps (app.FastPath): ASGI, with the Starlette app's state and the gateway."""

    state: Any

    @property
    def gateway(self) -> Any: ...

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


class CorsGate:
    def __init__(self, app: GatewayApp, runtime: Any) -> None:
        self.app = app
        self.runtime = runtime
        self.state = app.state
        self._made: tuple[Cors, CORSMiddleware] | None = None

    @property
    def gateway(self) -> Any:
        return self.app.gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cors = self.runtime.snapshot.config.gateway.cors if scope["type"] == "http" else None
        if cors is None:
            await self.app(scope, receive, send)
            return
        await self._middleware(cors)(scope, receive, send)

    def _middleware(self, cors: Cors) -> CORSMiddleware:
        made = self._made
        if made is None or made[0] is not cors:
            made = (cors, CORSMiddleware(
                self.app,
                allow_origins=cors.allow_origins,
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=cors.allow_headers,
                allow_credentials=False,
                expose_headers=cors.expose_headers,
                max_age=cors.max_age_s,
            ))
            self._made = made
        return made[1]
