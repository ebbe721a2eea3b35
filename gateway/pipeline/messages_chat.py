"""An Anthropic Messages request (`POST /v1/messages`) as the chat request the engine renders, and its
answer as what was generated: so that a Messages conversation gets the same analysis as a chat one.

vLLM serves the Messages API by translating each request to a chat completion
(`vllm/entrypoints/anthropic`): `system` (a string, or its text blocks joined) becomes a system message;
a message's text blocks become text parts, image blocks image_url parts (a data URL), `tool_use` blocks
the assistant's tool calls (arguments: the input as JSON), `thinking` blocks its reasoning,
`tool_result` blocks tool messages ahead of the rest of their user message; `tools` become function
tools with `input_schema` as parameters; `tool_choice` (auto, any, none, a named tool) and
`output_config` (effort, a JSON schema format) their chat counterparts; `thinking: disabled` a
reasoning_effort of "none"; `chat_template_kwargs` as is. This module reads a request the same way, and
the emulator serves the API with it.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.errors import invalid_request
from ..core.exchange import GeneratedOutput
from .responses_chat import ChatView
from .validate import no_stream

PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
PATHS = frozenset({PATH, COUNT_PATH})
_ROLES = ("user", "assistant", "system")  # Claude Code sends reminders as system messages among the turns


def check_messages(body: dict[str, Any], count_only: bool = False) -> None:
    """The shapes the gateway reads, each a clear 400 naming the field."""
    if count_only:
        no_stream(body)
    else:
        v = body.get("max_tokens")
        if type(v) is not int or v < 1:
            raise invalid_request("'max_tokens' is required and must be a positive integer", param="max_tokens",
                                  code="invalid_type")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid_request("'messages' must be a non-empty array", param="messages", code="invalid_type")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise invalid_request(f"messages[{i}] must be an object with role 'user', 'assistant' or 'system'",
                                  param=f"messages[{i}]", code="invalid_value")
        content = m.get("content")
        if not isinstance(content, str) and not (isinstance(content, list)
                                                 and all(isinstance(b, dict) for b in content)):
            raise invalid_request(f"messages[{i}].content must be a string or an array of content blocks",
                                  param=f"messages[{i}].content", code="invalid_type")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise invalid_request("'system' must be a string or an array of text blocks", param="system",
                              code="invalid_type")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise invalid_request("'stream' must be a boolean", param="stream", code="invalid_type")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                                  for t in tools)):
        raise invalid_request("'tools' must be an array of tools with a name", param="tools", code="invalid_type")


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request vLLM makes of a Messages request. Raises ValueError/TypeError on
    a block it cannot read."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    elif isinstance(system, list):
        text = "".join(b.get("text") or "" for b in system if isinstance(b, dict) and b.get("type") == "text")
        messages.append({"role": "system", "content": text})
    for m in body.get("messages") or ():
        role, content = m["role"], m.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        thinking: list[str] = []
        for block in content or ():
            kind = block.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": str(block.get("text") or "")})
            elif kind == "image":
                src = block.get("source") or {}
                url = src.get("url") if src.get("type") == "url" else \
                    f"data:{src.get('media_type')};base64,{src.get('data')}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            elif kind == "tool_use":
                calls.append({"id": block.get("id"), "type": "function",
                              "function": {"name": block.get("name"),
                                           "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
            elif kind == "tool_result":
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                 "content": _result_text(block.get("content"))})
            elif kind == "thinking":
                thinking.append(str(block.get("thinking") or ""))  # the answer's reasoning, sent back
            elif kind == "redacted_thinking":
                continue  # encrypted: nothing the template can render
            else:
                raise ValueError(f"content block {str(kind)[:40]!r} has no chat form")
        if not parts and not calls and not thinking:
            continue
        msg: dict[str, Any] = {"role": role, "content": parts[0]["text"] if len(parts) == 1 and
                               parts[0]["type"] == "text" else (parts or "")}
        if calls:
            msg["tool_calls"] = calls
        if thinking and role == "assistant":
            msg["reasoning_content"] = "".join(thinking)
        messages.append(msg)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                            "max_tokens": body.get("max_tokens")}
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                               "parameters": t.get("input_schema") or {"type": "object"}}}
             for t in body.get("tools") or ()]
    if tools:
        chat["tools"] = tools
    for name in ("temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if isinstance(body.get("chat_template_kwargs"), dict):
        chat["chat_template_kwargs"] = dict(body["chat_template_kwargs"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use", False)
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice["type"]) or \
            {"type": "function", "function": {"name": choice.get("name")}}
    config = body.get("output_config")
    if isinstance(config, dict):
        if config.get("effort") is not None:
            chat["reasoning_effort"] = config["effort"]
        fmt = config.get("format")
        if isinstance(fmt, dict) and fmt.get("json_schema"):
            chat["response_format"] = {"type": fmt.get("type"),
                                       "json_schema": {"schema": fmt["json_schema"], "name": fmt.get("type")}}
    if _thinking_disabled(body):
        # vLLM's _handle_thinking, after the output config: "none" (or "low" where the template refuses
        # "none"; the gateway states the render itself on template lanes: see tell_back).
        chat["reasoning_effort"] = "none"
    return chat


def _thinking_disabled(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") == "disabled"


def tell_back(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """What the conversation policy told the chat view (thinking, the effort pin) into the Messages body
    the engine gets: vLLM hands its `chat_template_kwargs` to the template as it does a chat request's.
    When the pin took the view's top-level effort away (it states the number in chat_template_kwargs),
    the Messages body loses what vLLM would make that top-level effort of (`output_config.effort`,
    `thinking: disabled`): it would override the stated number and the engine would render another
    effort at the head of the prompt."""
    if "chat_template_kwargs" in chat:
        body["chat_template_kwargs"] = chat["chat_template_kwargs"]
    if "reasoning_effort" in chat:
        return
    if _thinking_disabled(body):
        del body["thinking"]
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("effort") is not None:
        body["output_config"] = {k: v for k, v in config.items() if k != "effort"}


def chat_view(body: dict[str, Any]) -> ChatView:
    try:
        return ChatView(chat_body(body))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        return ChatView(None, f"the request could not be read as chat messages: {exc}"[:200])


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return "" if content is None else str(content)


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """Anthropic usage as chat usage: input_tokens count the uncached prompt, the cache fields the rest."""
    if not isinstance(usage, dict):
        return None
    fresh = n if isinstance(n := usage.get("input_tokens"), int) else 0
    read = n if isinstance(n := usage.get("cache_read_input_tokens"), int) else 0
    made = n if isinstance(n := usage.get("cache_creation_input_tokens"), int) else 0
    out = n if isinstance(n := usage.get("output_tokens"), int) else 0
    prompt = fresh + read + made
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": read}}


def take_message(gen: GeneratedOutput, message: Any) -> None:
    """A whole Message's content blocks as what was generated."""
    if not isinstance(message, dict):
        return
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for block in message.get("content") or ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            content.append(str(block.get("text") or ""))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
        elif kind == "tool_use":
            calls[len(calls)] = {"id": block.get("id"), "type": "function",
                                 "function": {"name": str(block.get("name") or ""),
                                              "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}}
    gen.content, gen.reasoning, gen.tool_calls = content, reasoning, calls
    if isinstance(message.get("stop_reason"), str):
        gen.finish_reason = message["stop_reason"]
