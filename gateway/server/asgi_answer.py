"""An Answer written under ASGI (Starlette's routes, the proxy path under plain uvicorn or with CORS).

Starlette's responses write it: a whole answer as a Response, a stream as a StreamingResponse (which
stops relaying when the client disconnects). Then the answer is closed, whatever happened.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..core.answer import Answer


class AsgiAnswer:
    __slots__ = ("answer",)

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self.answer
        try:
            response: Response
            if answer.stream is None:
                response = Response(answer.body, status_code=answer.status)
                response.raw_headers = [*answer.headers, (b"content-length", b"%d" % len(answer.body))]
            else:
                response = StreamingResponse(answer.stream, status_code=answer.status)
                response.raw_headers = list(answer.headers)
            await response(scope, receive, send)
        finally:
            await answer.close()


def asgi_endpoint(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
    """A Starlette endpoint of a handler that may return an Answer (the proxy endpoints) or a Response."""

    async def endpoint(request: Request) -> Any:
        result = await handler(request)
        return AsgiAnswer(result) if isinstance(result, Answer) else result

    endpoint.__name__ = getattr(handler, "__name__", "endpoint")
    endpoint.__doc__ = handler.__doc__
    return endpoint
