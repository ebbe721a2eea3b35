"""Cheap structural checks of a chat request, on the hot path: wrong input is a clear 400, never a 500.

Only what can go wrong in shape is checked here; the engine (and the renderer, off the hot path)
knows the rest. Every error names the place (`messages[3].content[1].type`).
"""

from __future__ import annotations

from typing import Any

import orjson

from ..core.errors import invalid_request

# The roles every lane's renderer knows (render/checks.py ROLES: the DeepSeek-V4.1 template, and
# the estimator of template-less lanes). OpenAI's deprecated "function" role is not among them: it
# would pass here and then fail the analysis with a traceback per request.
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
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


def no_stream(body: dict[str, Any]) -> None:
    """Embeddings, tokenizer and token-count answers are one JSON body: a stream asked for would relay
    some other stream."""
    if body.get("stream") not in (None, False):
        raise invalid_request("'stream' is not supported on this endpoint", param="stream",
                              code="unsupported_parameter")


def check_chat(body: dict[str, Any], known: int = 0) -> None:
    """`known`: leading messages already checked in an earlier body with the same bytes (history_memo.py)."""
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
    for i in range(known, len(messages)):
        m = messages[i]
        # The common shapes pass without a call: {role, content} and a tool's answer
        # {role, content, tool_call_id}, every value a string (most of a long agent history).
        if m.__class__ is dict and m.get("content").__class__ is str:
            role = m.get("role")
            if role.__class__ is str and role in ROLES:
                n = len(m)
                if n == 2 or (n == 3 and m.get("tool_call_id").__class__ is str):
                    continue
        _check_message(i, m)
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


_STR_FIELDS = frozenset({"reasoning_content", "reasoning", "name", "tool_call_id"})


def _check_message(i: int, msg: Any) -> None:
    # Runs for every message of every request (1,600 in a long agent session): one pass over the
    # message's own keys, and the error text is only built when there is an error.
    if type(msg) is not dict:
        raise invalid_request(f"messages[{i}] must be an object", param=f"messages[{i}]", code="invalid_type")
    role = msg.get("role")
    if type(role) is not str:
        raise invalid_request(f"messages[{i}].role is required and must be a string", param=f"messages[{i}].role",
                              code="invalid_type")
    if role not in ROLES:
        raise invalid_request(f"messages[{i}].role {role[:40]!r} is not one of {sorted(ROLES)} (the roles this "
                              "gateway's chat templates render)",
                              param=f"messages[{i}].role", code="invalid_value")
    content: Any = msg.get("content")  # JSON: its type is checked below
    kind = type(content)
    if kind is list:
        for j, part in enumerate(content):
            _check_part(f"messages[{i}].content[{j}]", part)
    elif content is None:
        if role != "assistant":
            raise invalid_request(f"messages[{i}].content is required for role {role!r}",
                                  param=f"messages[{i}].content", code="missing_required_parameter")
    elif kind is not str:
        raise invalid_request(f"messages[{i}].content must be a string or an array of content parts",
                              param=f"messages[{i}].content", code="invalid_type")
    for key, value in msg.items():
        if key in _STR_FIELDS:
            if value is not None and type(value) is not str:
                raise invalid_request(f"messages[{i}].{key} must be a string", param=f"messages[{i}].{key}",
                                      code="invalid_type")
        elif key == "tool_calls" and value is not None:
            if role != "assistant" or type(value) is not list:
                raise invalid_request(f"messages[{i}].tool_calls must be an array on an assistant message",
                                      param=f"messages[{i}].tool_calls", code="invalid_type")
            for j, call in enumerate(value):
                _check_tool_call(i, j, call)


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


def _check_tool_call(i: int, j: int, call: Any) -> None:
    fn = call.get("function") if type(call) is dict else None
    if type(fn) is not dict:
        where = f"messages[{i}].tool_calls[{j}]"
        raise invalid_request(f"{where} must be an object with a 'function'", param=where, code="invalid_type")
    if type(fn.get("name")) is not str:
        where = f"messages[{i}].tool_calls[{j}].function.name"
        raise invalid_request(f"{where} must be a string", param=where, code="invalid_type")
    args = fn.get("arguments")
    if type(args) is str:
        if args[:1] == "{" and args[-1:] == "}":  # the common case: parse it to be sure
            try:
                if type(orjson.loads(args)) is dict:
                    return
            except orjson.JSONDecodeError:
                pass
        elif not args or args.isspace():
            return
    elif type(args) is dict:
        return
    where = f"messages[{i}].tool_calls[{j}].function.arguments"
    if type(args) is not str:
        raise invalid_request(f"{where} must be a JSON string", param=where, code="invalid_type")
    try:
        parsed = orjson.loads(args)
    except orjson.JSONDecodeError:
        raise invalid_request(f"{where} is not valid JSON", param=where, code="invalid_value") from None
    if type(parsed) is not dict:
        raise invalid_request(f"{where} must encode a JSON object", param=where, code="invalid_value")
