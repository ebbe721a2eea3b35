"""Who may call a route: declared once per route, checked in one place, admin by default.

Every route the gateway serves is an `Endpoint` in the one table the composition root builds
(compose.py). An endpoint that does not say otherwise needs the admin key, so a route added
without thought is closed, not open. The check wraps the handler when the app is built
(`Security.protect`); no handler checks keys itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Awaitable, Callable, Union

from starlette.requests import Request
from starlette.responses import Response

from ..core.answer import Answer
from ..core.errors import GatewayError

# What a route answers: a Starlette Response, or the pipeline's Answer (the proxy routes), which the
# front end writes and closes (core/answer.py; under ASGI through server/asgi_answer.py).
Reply = Union[Response, Answer]
Handler = Callable[[Request], Awaitable[Reply]]


class Access(enum.Enum):
    PUBLIC = "public"  # anyone: process liveness, the minimal readiness status, the admin page shell
    CLIENT = "client"  # a client key (or none configured: demo); the caller's tenant is known after it
    QUALIFY = "qualify"  # the qualify token (X-Gateway-Qualify) or the admin key
    ADMIN = "admin"  # the admin key (demo mode without any key: open, said loudly at start)


@dataclass(frozen=True)
class Endpoint:
    path: str
    handler: Handler
    methods: tuple[str, ...] = ("GET",)
    access: Access = Access.ADMIN
    why_public: str | None = None  # required for PUBLIC: what makes it safe to serve to anyone
    # How the route's API shapes an error raised before its handler runs (the key check); None: OpenAI's.
    errors: Callable[[GatewayError], GatewayError] | None = None

    def __post_init__(self) -> None:
        if self.access is Access.PUBLIC and not self.why_public:
            raise ValueError(f"public endpoint {self.path} must say why it is safe to serve to anyone")
