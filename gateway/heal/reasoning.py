"""Reasoning stripped by the client where the lane's template keeps it: the relayed reasoning.

The DeepSeek-V4.1 template renders an earlier assistant message's reasoning when tools are present or
drop_thinking is off (thinking mode); a client that drops it changes the prompt from that message on.
Applies only when the client sent no reasoning at all for the message (a different text is a history
edit) and, per request, only when the template keeps it (`keeps_reasoning`): where the template drops
it, the repair would change nothing the model reads, so nothing is touched. The text goes back under
the name the template reads (TEMPLATE_FIELD).
"""

from __future__ import annotations

from typing import Any

from .base import POP, REASONING_FIELDS, TEMPLATE_FIELD, Relayed, Updates, client_reasoning


class Reasoning:
    name = "reasoning"

    def plan(self, msg: dict[str, Any], relayed: Relayed) -> Updates | None:
        if not relayed.reasoning or client_reasoning(msg)[0] is not None:
            return None
        updates: Updates = {TEMPLATE_FIELD: relayed.reasoning}
        for other in REASONING_FIELDS:
            if other != TEMPLATE_FIELD and other in msg:
                updates[other] = POP  # an empty or null twin would only confuse the engine
        return updates


def keeps_reasoning(template: str | None, thinking: bool | None, drop_thinking: bool,
                    body: dict[str, Any]) -> bool:
    """Whether the lane's template renders earlier assistants' reasoning for this request."""
    if template is None or not thinking:
        return False
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("drop_thinking"), bool):
        drop_thinking = kwargs["drop_thinking"]
    return bool(body.get("tools")) or not drop_thinking
