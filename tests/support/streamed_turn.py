"""An assistant turn read from the official client's stream, and the messages an agent adds after it."""

from __future__ import annotations

from typing import Any


def add_tool_call_deltas(calls: dict[int, dict[str, Any]], deltas: Any) -> None:
    """The streamed pieces of tool calls (`delta.tool_calls`) joined into whole calls, by index."""
    for tc in deltas or []:
        c = calls.setdefault(tc.index, {"id": tc.id, "type": "function", "function": {"name": "", "arguments": ""}})
        c["function"]["name"] += tc.function.name or ""
        c["function"]["arguments"] += tc.function.arguments or ""


def append_turn(messages: list[dict[str, Any]], content: str, reasoning: str, reasoning_field: str,
                calls: dict[int, dict[str, Any]], tool_result: str, next_user: str) -> dict[str, Any]:
    """The assistant message as an append-only agent sends it back, a tool result for each of its calls,
    and the next user message, appended to `messages`; returns the assistant message."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        msg[reasoning_field] = reasoning
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    messages.append(msg)
    for c in msg.get("tool_calls", []):
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": tool_result})
    messages.append({"role": "user", "content": next_user})
    return msg
