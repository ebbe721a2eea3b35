"""max_messages: a cap on the number of messages in one chat request."""

from __future__ import annotations

from .base import Context, Limit


class MessageCount(Limit):
    name = "max_messages"

    def active(self, limits) -> bool:
        return limits.max_messages is not None

    async def enforce(self, ctx: Context) -> None:
        cap = ctx.limits.max_messages
        messages = ctx.body.get("messages")
        if cap is not None and isinstance(messages, list) and len(messages) > cap:
            ctx.reject(self.name, f"Too many messages: {len(messages)} were provided, but this model accepts at most "
                       f"{cap} messages per request.", param="messages", code="too_many_messages")
