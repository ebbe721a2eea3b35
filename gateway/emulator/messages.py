"""The Anthropic Messages API as vLLM serves it (entrypoints/anthropic): a Message object, or its
stream of events, made from the same plan as a chat answer."""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

from .generation import Plan

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def usage(prompt: int, cached: int, output: int) -> dict[str, Any]:
    return {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0,
            "output_tokens": output}


def _blocks(plan: Plan) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if plan.reasoning:
        blocks.append({"type": "thinking", "thinking": plan.reasoning_text, "signature": ""})
    if plan.content_text or plan.tool_call is None:
        blocks.append({"type": "text", "text": plan.content_text})
    if plan.tool_call is not None:
        blocks.append({"type": "tool_use", "id": plan.tool_call.stream_id, "name": plan.tool_call.name,
                       "input": json.loads(plan.tool_call.arguments)})
    return blocks


def message(model: str, plan: Plan, use: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
            "content": _blocks(plan), "stop_reason": _STOP.get(plan.finish_reason, "end_turn"),
            "stop_sequence": None, "usage": use}


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def head(model: str, use: dict[str, Any]) -> bytes:
    start: dict[str, Any] = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                             "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
                             "usage": {**use, "output_tokens": 0}}
    return _event("message_start", {"message": start})


def block_events(plan: Plan) -> list[list[bytes]]:
    """Per content block: its start, its deltas (one per token), its stop."""
    out = []
    for index, block in enumerate(_blocks(plan)):
        kind = block["type"]
        if kind == "thinking":
            start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in plan.reasoning]
        elif kind == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in plan.content]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": f} for f in plan.tool_call.fragments]  # type: ignore[union-attr]
        events = [_event("content_block_start", {"index": index, "content_block": start})]
        events += [_event("content_block_delta", {"index": index, "delta": d}) for d in deltas]
        events.append(_event("content_block_stop", {"index": index}))
        out.append(events)
    return out


def tail(plan: Plan, use: dict[str, Any]) -> bytes:
    return (_event("message_delta", {"delta": {"stop_reason": _STOP.get(plan.finish_reason, "end_turn"),
                                               "stop_sequence": None},
                                     "usage": {"output_tokens": use["output_tokens"]}})
            + _event("message_stop", {}))


def sent_back(plan: Plan) -> dict[str, Any]:
    """The answer as the translation reads it when a Messages client sends its blocks back."""
    return plan.assistant_message()
