"""A /v1/responses request as the chat request the engine renders, and its output as the assistant
message the client sends back: so that a Responses conversation gets the same analysis as a chat one.

vLLM renders a Responses request through its chat template (entrypoints/openai/responses/utils.py
`construct_input_messages`, `construct_tool_dicts`; protocol.py `build_chat_params`), and this module
reads a request the same way:

- `instructions` (a non-empty string) -> a system message first;
- `input` as a string -> one user message;
- message items: user / system / developer go as they are (input_text / output_text parts are text
  parts, input_image an image_url part); an assistant message keeps its first part's text only;
- `function_call` -> an assistant `tool_calls` entry (id = call_id; a call in a `namespace` is named
  `<namespace>__<name>`), `custom_tool_call` -> one whose arguments are `{"input": <its input>}`,
  `function_call_output` / `custom_tool_call_output` -> a tool message, `reasoning` -> the assistant's
  `reasoning` (its first content text, else its first summary); a reasoning, message or call that
  follows an assistant message still missing that field is merged into it, so turn 1's output items
  sent back make one assistant message;
- tools, in request order (vLLM's `get_function_tools`): a function tool as a chat tool; a `namespace`
  tool's function tools as `<namespace>__<name>`; a `custom` (freeform) tool as a function taking one
  string, `input`; other types (web_search, mcp, ...) are never shown to the model;
- `reasoning.effort` -> the template's `reasoning_effort`.

A request that does not map onto messages alone gets no chat view, with the reason (it is recorded,
not analysed): `previous_response_id` / `previous_response` / `conversation` (the earlier turns live
in the engine or the provider), an item type with no chat form, an encrypted reasoning item, a
partial assistant message to continue, a part the gateway cannot render (a file, audio), or items
whose mapping a chat request could not carry (e.g. a user message whose content is a number).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..core.errors import GatewayError
from ..core.exchange import GeneratedOutput
from .validate import check_chat

PATH = "/v1/responses"

_STATE_FIELDS = (
    ("previous_response_id", "previous_response_id: the earlier turns are kept by the engine"),
    ("previous_response", "previous_response: the earlier turns are carried in encrypted state"),
    ("conversation", "conversation: the earlier turns are kept server-side"),
    ("prompt", "prompt: a stored prompt template"),
)
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_CARRIED = ("chat_template_kwargs", "prompt_cache_key", "user")  # what the template or identity reads


@dataclass(frozen=True)
class ChatView:
    """The chat request a Responses request maps onto, or why it does not (exactly one is set)."""

    body: dict[str, Any] | None
    unmapped: str | None = None


class _Unmapped(Exception):
    pass


def chat_view(body: dict[str, Any]) -> ChatView:
    """`body` (a /v1/responses request, shape-checked) as the chat request the engine renders. A body
    the mapping cannot read (a field of a shape the checks let through) is recorded, never a 500."""
    try:
        return _chat_view(body)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        return ChatView(None, f"the request could not be read as chat messages ({type(exc).__name__})")


def _chat_view(body: dict[str, Any]) -> ChatView:
    for name, why in _STATE_FIELDS:
        if body.get(name) is not None:
            return ChatView(None, why)
    try:
        messages = _messages(body)
    except _Unmapped as exc:
        return ChatView(None, str(exc))
    if not messages:
        return ChatView(None, "input: no messages")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if isinstance(body.get("max_output_tokens"), int):
        chat["max_tokens"] = body["max_output_tokens"]
    for name in _CARRIED:
        if name in body:
            chat[name] = body[name]
    try:
        # The shapes the hot path relies on, as for a chat request (a malformed item is the engine's
        # to refuse: the request passes through, recorded, not analysed).
        check_chat(chat)
    except GatewayError as exc:
        return ChatView(None, "as chat messages: " + exc.message[:200])
    return ChatView(chat)


def render_inputs(body: dict[str, Any]) -> dict[str, Any]:
    """What a Responses request says of how to render it (effort, template kwargs), as a chat body
    without messages: for a request whose items cannot be read, so that the lane's render inputs are
    still stated (and told back with `tell_back`)."""
    stub: dict[str, Any] = {name: body[name] for name in ("chat_template_kwargs",) if name in body}
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        stub["reasoning_effort"] = reasoning["effort"]
    return stub


def tell_back(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """What the conversation policy told the chat view (effort pin, thinking), into the Responses body:
    the template kwargs as they are, and `reasoning.effort` only while the view still has a top-level
    word (told.py drops it when the number goes in the kwargs: a word would override the number)."""
    if "chat_template_kwargs" in chat:
        body["chat_template_kwargs"] = chat["chat_template_kwargs"]
    reasoning = body.get("reasoning")
    reasoning = dict(reasoning) if isinstance(reasoning, dict) else {}
    effort = chat.get("reasoning_effort")
    if isinstance(effort, str) and effort in ("low", "medium", "high", "minimal", "none", "xhigh"):
        reasoning["effort"] = effort  # OpenAI's Reasoning.effort literal: the engine validates it
    else:
        reasoning.pop("effort", None)
    if reasoning or "reasoning" in body:
        body["reasoning"] = reasoning or None


def take_output(gen: GeneratedOutput, output: Any) -> bool:
    """The Response's output items as what was generated, read the way the next request's input items
    will be (first text part of a message, first reasoning text, function calls as tool calls).
    False when there are no items (then what the stream's deltas gathered stands)."""
    if not isinstance(output, list) or not output:
        return False
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            text = _first_text(item.get("content"))
            if text:
                content.append(text)
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                reasoning.append(text)
        elif kind in ("function_call", "custom_tool_call"):
            call = _call(item)
            calls[len(calls)] = {"id": call["id"], "type": "function",
                                 "function": {"name": str(call["function"]["name"] or ""),
                                              "arguments": str(call["function"]["arguments"] or "")}}
    gen.content, gen.reasoning, gen.tool_calls = content, reasoning, calls
    return True


# -- the mapping -------------------------------------------------------------------------------------


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    inp = body.get("input")
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
        return messages
    items = inp if isinstance(inp, list) else []
    if items and isinstance(items[-1], dict) and items[-1].get("type", "message") in ("message", "reasoning") \
            and items[-1].get("status") in ("in_progress", "incomplete"):
        raise _Unmapped("input: a partial assistant message to continue")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _Unmapped(f"input[{i}]: not an object")
        prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        msg = _item(item, i, prev)
        if msg is not None:
            messages.append(msg)
    return messages


def _item(item: dict[str, Any], i: int, prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """One input item as a new message, or None when it was merged into `prev` (an assistant message)."""
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call"):
        call = _call(item)
        if prev is not None:
            calls = prev.get("tool_calls")
            if calls is None:
                prev["tool_calls"] = [call]
                return None
            if isinstance(calls, list):
                calls.append(call)
                return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        out = item.get("output")
        return {"role": "tool", "content": _parts(out, i) if isinstance(out, list) else out,
                "tool_call_id": item.get("call_id")}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise _Unmapped(f"input[{i}]: encrypted reasoning")
        text = _reasoning_text(item) or ""
        if prev is not None and prev.get("reasoning") is None:
            prev["reasoning"] = text
            return None
        return {"role": "assistant", "reasoning": text}
    if kind not in (None, "message"):
        raise _Unmapped(f"input[{i}]: item type {str(kind)[:40]!r} has no chat form")
    role = item.get("role")
    content = item.get("content")
    if role == "assistant":
        text = content if isinstance(content, str) else (_first_text(content) or "")
        if prev is not None and prev.get("content") is None:
            prev["content"] = text
            return None
        return {"role": "assistant", "content": text}
    if role not in ("user", "system", "developer"):
        raise _Unmapped(f"input[{i}]: role {str(role)[:40]!r} has no chat form")
    return {"role": role, "content": _parts(content, i) if isinstance(content, list) else content}


def _parts(parts: list[Any], i: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, dict):
            raise _Unmapped(f"input[{i}]: a content part that is not an object")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            out.append({"type": "text", "text": part.get("text")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            out.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise _Unmapped(f"input[{i}]: content part {str(kind)[:40]!r} the gateway does not render")
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """The Responses tools as the chat tools the template shows the model (see the module docstring)."""
    if tools is not None and not isinstance(tools, list):
        raise TypeError("tools: not a list")
    out: list[dict[str, Any]] = []
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind == "function":
            out.append(_tool(tool))
        elif kind == "namespace" and isinstance(tool.get("tools"), list):
            out.extend(_tool({**inner, "name": _flat(tool.get("name"), inner.get("name"))})
                       for inner in tool["tools"] if isinstance(inner, dict) and inner.get("type") == "function")
        elif kind == "custom":
            out.append(_tool({"name": tool.get("name"), "description": tool.get("description"),
                              "parameters": CUSTOM_TOOL_PARAMETERS}))
    return out


# vLLM's shim for a custom (freeform) tool (tool_parsers/utils.py custom_tool_parameters).
CUSTOM_TOOL_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
    "required": ["input"],
    "additionalProperties": False,
}


def _flat(namespace: Any, name: Any) -> str:
    return f"{namespace}__{name}"


def _call(item: dict[str, Any]) -> dict[str, Any]:
    """A function or custom tool call item as a chat tool call, named and encoded as vLLM does."""
    if item.get("type") == "custom_tool_call":
        args = json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
        return {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": args}}
    name = _flat(item["namespace"], item.get("name")) if item.get("namespace") else item.get("name")
    return {"id": item.get("call_id"), "type": "function",
            "function": {"name": name, "arguments": item.get("arguments")}}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _first_text(content: Any) -> str | None:
    if isinstance(content, list) and content:
        first = content[0]
        text = first.get("text") if isinstance(first, dict) else first
        return text if isinstance(text, str) else None
    return None


def _reasoning_text(item: dict[str, Any]) -> str | None:
    return _first_text(item.get("content")) or _first_text(item.get("summary"))
