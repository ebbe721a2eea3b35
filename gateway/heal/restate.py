"""Responses input items that OpenAI accepts and vLLM refuses, restated in the form vLLM accepts.

The AI SDK's `@ai-sdk/openai` (OpenCode through it) sends earlier assistant text as
`{"role": "assistant", "content": [{"type": "output_text", "text": ...}]}` with no `type`: OpenAI
reads it as a message; vLLM 0.32's `ResponsesRequest` refuses it (400: neither an easy input message,
whose parts are input parts, nor an output message, which needs `type`). With `type: "message"` vLLM
accepts it and renders exactly what it would have (the message's first text part), so the gateway adds
that field on vLLM lanes and says so: `X-Gateway-Healed: restated_item@<input index>`, and the
record's `healed`. A restatement changes no token of the prompt, so it saves none.
"""

from __future__ import annotations

from typing import Any

from ..core.exchange import Exchange, Healed
from ..core.runtime import LaneRuntime
from ..pipeline.responses_chat import PATH
from .policy import HEALED_HEADER, header_value

KIND = "restated_item"


def refused_by_vllm(item: Any) -> bool:
    """A role-bearing item without `type` whose content parts include output text."""
    return (isinstance(item, dict) and "type" not in item and "role" in item and isinstance(item.get("content"), list)
            and any(isinstance(p, dict) and p.get("type") == "output_text" for p in item["content"]))


def restate(body: dict[str, Any]) -> list[int]:
    """Restate the refused items of a Responses body in place; their input indices."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    out = []
    for i, item in enumerate(items):
        if refused_by_vllm(item):
            item["type"] = "message"
            out.append(i)
    return out


class RestatePolicy:
    name = "restate"
    per_lane = True

    async def apply(self, ex: Exchange, lane: LaneRuntime, body: dict[str, Any]) -> None:
        if ex.path != PATH or lane.config.engine != "vllm":
            return
        indices = restate(body)
        if indices:
            ex.healed = [*ex.healed, Healed(KIND, indices, repairs_prefix=False)]
            ex.response_headers[HEALED_HEADER] = header_value(ex.healed)
