"""Cheap structural checks of a chat request, on the hot path: wrong input is a clear 400, never a 500.

Only what can go wrong in shape is checked here; the engine (and the renderer, off the hot path)
knows the rest. Every error names the place (`messages[3].content[1].type`).
"""

from __future__ import annotations

from typing import Any

import orjson

from .errors import invalid_request

ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
PART_TYPES = frozenset({"text", "image_url", "image", "input_image", "input_text", "input_audio", "video_url", "file"})

_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs", "top_k", "min_tokens")
_BOOL_FIELDS = ("stream", "ignore_eos", "skip_special_tokens", "parallel_tool_calls")


def check_common(body: dict[str, Any]) -> None:
    for name in _BOOL_FIELDS:
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise invalid_request(f"'{name}' must be a boolean", param=name, code="invalid_type")
    for name in _INT_FIELDS:
        v = body.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise invalid_request(f"'{name}' must be an integer", param=name, code="invalid_type")
    for name in _NUMBER_FIELDS:
        v = body.get(name)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise invalid_request(f"'{name}' must be a number", param=name, code="invalid_type")
    for name in ("max_tokens", "max_completion_tokens", "n"):
        v = body.get(name)
        if isinstance(v, int) and v < 1:
            raise invalid_request(f"'{name}' must be at least 1", param=name, code="invalid_value")
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise invalid_request("'stream_options' must be an object", param="stream_options", code="invalid_type")
        if not body.get("stream"):
            raise invalid_request("'stream_options' is only allowed when 'stream' is true",
                                  param="stream_options", code="invalid_value")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
        isinstance(stop, list) and all(isinstance(s, str) for s in stop)
    ):
        raise invalid_request("'stop' must be a string or a list of strings", param="stop", code="invalid_type")


def check_chat(body: dict[str, Any]) -> None:
    check_common(body)
    if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        raise invalid_request("'logprobs' must be a boolean", param="logprobs", code="invalid_type")
    messages = body.get("messages")
    if messages is None:
        raise invalid_request("'messages' is required", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid_request("'messages' must be an array", param="messages", code="invalid_type")
    if not messages:
        raise invalid_request("'messages' must contain at least one message", param="messages", code="invalid_value")
    for i, msg in enumerate(messages):
        _check_message(i, msg)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid_request("'tools' must be an array", param="tools", code="invalid_type")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict) \
                    or not isinstance(tool["function"].get("name"), str):
                raise invalid_request("each tool must be {'type': 'function', 'function': {'name': ...}}",
                                      param=f"tools[{i}]", code="invalid_type")
    effort = body.get("reasoning_effort")
    if effort is not None and (isinstance(effort, bool) or not isinstance(effort, (str, int))):
        raise invalid_request("'reasoning_effort' must be a string or an integer", param="reasoning_effort",
                              code="invalid_type")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise invalid_request("'chat_template_kwargs' must be an object", param="chat_template_kwargs",
                              code="invalid_type")


def check_completion(body: dict[str, Any]) -> None:
    check_common(body)
    lp = body.get("logprobs")  # an integer on /v1/completions
    if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or lp < 0):
        raise invalid_request("'logprobs' must be a non-negative integer", param="logprobs", code="invalid_type")
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid_request("'prompt' is required", param="prompt", code="missing_required_parameter")
    if not isinstance(prompt, (str, list)):
        raise invalid_request("'prompt' must be a string or an array", param="prompt", code="invalid_type")


def _check_message(i: int, msg: Any) -> None:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise invalid_request(f"{where} must be an object", param=where, code="invalid_type")
    role = msg.get("role")
    if not isinstance(role, str):
        raise invalid_request(f"{where}.role is required and must be a string", param=f"{where}.role",
                              code="invalid_type")
    if role not in ROLES:
        raise invalid_request(f"{where}.role {role[:40]!r} is not one of {sorted(ROLES)}", param=f"{where}.role",
                              code="invalid_value")
    content = msg.get("content")
    if content is None:
        if role not in ("assistant",):
            raise invalid_request(f"{where}.content is required for role {role!r}", param=f"{where}.content",
                                  code="missing_required_parameter")
    elif isinstance(content, list):
        for j, part in enumerate(content):
            _check_part(f"{where}.content[{j}]", part)
    elif not isinstance(content, str):
        raise invalid_request(f"{where}.content must be a string or an array of content parts",
                              param=f"{where}.content", code="invalid_type")
    for name in ("reasoning_content", "reasoning", "name", "tool_call_id"):
        v = msg.get(name)
        if v is not None and not isinstance(v, str):
            raise invalid_request(f"{where}.{name} must be a string", param=f"{where}.{name}", code="invalid_type")
    calls = msg.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise invalid_request(f"{where}.tool_calls must be an array on an assistant message",
                                  param=f"{where}.tool_calls", code="invalid_type")
        for j, call in enumerate(calls):
            _check_tool_call(f"{where}.tool_calls[{j}]", call)


def _check_part(where: str, part: Any) -> None:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise invalid_request(f"{where} must be an object with a 'type'", param=where, code="invalid_type")
    kind = part["type"]
    if kind not in PART_TYPES:
        raise invalid_request(f"{where}.type {kind[:40]!r} is not a known content part type", param=f"{where}.type",
                              code="invalid_value")
    if kind in ("text", "input_text") and not isinstance(part.get("text"), str):
        raise invalid_request(f"{where}.text must be a string", param=f"{where}.text", code="invalid_type")
    if kind == "image_url":
        url = part.get("image_url")
        if isinstance(url, dict):
            url = url.get("url")
        if not isinstance(url, str):
            raise invalid_request(f"{where}.image_url.url must be a string", param=f"{where}.image_url",
                                  code="invalid_type")


def _check_tool_call(where: str, call: Any) -> None:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise invalid_request(f"{where} must be an object with a 'function'", param=where, code="invalid_type")
    fn = call["function"]
    if not isinstance(fn.get("name"), str):
        raise invalid_request(f"{where}.function.name must be a string", param=f"{where}.function.name",
                              code="invalid_type")
    args = fn.get("arguments")
    if isinstance(args, dict):
        return
    if not isinstance(args, str):
        raise invalid_request(f"{where}.function.arguments must be a JSON string", param=f"{where}.function.arguments",
                              code="invalid_type")
    try:
        parsed = orjson.loads(args) if args.strip() else {}
    except orjson.JSONDecodeError:
        raise invalid_request(f"{where}.function.arguments is not valid JSON",
                              param=f"{where}.function.arguments", code="invalid_value") from None
    if not isinstance(parsed, dict):
        raise invalid_request(f"{where}.function.arguments must encode a JSON object",
                              param=f"{where}.function.arguments", code="invalid_value")
