"""Chat bodies as agents send them, in the JSON styles clients write: for the tests of the readers that
must read every body exactly as orjson.loads does (the history memo, the messages span)."""

from __future__ import annotations

import json

import orjson

FILLER = "lorem ipsum dolor sit amet, é中文 \"quoted\" \\ back ] } [ { " * 40


def body_message(i: int) -> dict:
    """Message i of a session: a user turn, an assistant tool call, its result, by turns."""
    role = ("user", "assistant", "tool")[i % 3]
    m: dict = {"role": role, "content": f"[{i}] {FILLER}"}
    if role == "assistant":
        m["tool_calls"] = [{"id": f"c{i}", "type": "function",
                            "function": {"name": "read", "arguments": json.dumps({"path": f"/f{i}", "messages": [1]})}}]
    if role == "tool":
        m["tool_call_id"] = f"c{i - 1}"
    return m


def dump_styled(body: dict, style: int) -> bytes:
    """0: orjson's compact UTF-8; 1: json's spaced ASCII escapes; 2: indented UTF-8; 3: compact UTF-8."""
    if style == 0:
        return orjson.dumps(body)
    if style == 1:
        return json.dumps(body).encode()  # ", " and ": ", ASCII escapes
    if style == 2:
        return json.dumps(body, ensure_ascii=False, indent=1).encode()
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def agent_body(n: int, layout: int, extra: dict | None = None) -> dict:
    """A request of `n` messages; layout 0: messages first (the OpenAI SDK), 1: after the tools, 2: after a
    nested `messages` key."""
    messages = [{"role": "system", "content": "You are an agent. " + FILLER}] + [body_message(i) for i in range(1, n)]
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {
        "messages": {"type": "array"}}}}}]
    if layout == 0:  # the OpenAI SDK's order: messages first
        body = {"messages": messages, "model": "m", "max_tokens": 16, "tools": tools}
    elif layout == 1:
        body = {"model": "m", "tools": tools, "messages": messages}
    else:
        body = {"model": "m", "metadata": {"messages": [{"a": 1}]}, "messages": messages, "stream": False}
    body.update(extra or {})
    return body
