"""max_request_bytes per lane: a smaller body cap than the gateway-wide one (which answers 413 while reading)."""

from __future__ import annotations

from .base import Context, Limit


class RequestBytes(Limit):
    name = "max_request_bytes"

    def active(self, limits) -> bool:
        return limits.max_request_bytes is not None

    async def enforce(self, ctx: Context) -> None:
        cap = ctx.limits.max_request_bytes
        size = ctx.ex.body_bytes
        if cap is not None and size > cap:
            ctx.reject(self.name, f"The request body is {size} bytes; this model accepts at most {cap} bytes "
                       "per request. Shorten the conversation or send fewer or smaller attachments.",
                       param=None, code="request_too_large", status=413)
