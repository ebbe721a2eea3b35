"""Is an upstream's answer shaped like OpenAI's? The fields clients read must have the right types.

The openai client builds its objects without validating them (`construct`), so a chunk with
`"content": 5` or `"choices": [1]` reaches the application as is and breaks it far from the cause.
The gateway checks what clients and the gateway itself read, and lets unknown fields through:
an engine's extras (vLLM's `prompt_logprobs`, SGLang's `matched_stop`) are not errors.

Each function returns None when the value is fine, else a short reason (for the error and the
record). Per stream chunk it costs about what parsing the chunk with orjson does.
"""

from __future__ import annotations

from typing import Any

# Fields clients read, by the type they must have when present and not null. One pass over the
# fields an object has (a chunk's delta usually has one) is cheaper than probing every name.
_MESSAGE_TYPES = {"content": str, "reasoning_content": str, "reasoning": str, "refusal": str, "role": str,
                  "tool_calls": list}
_CHOICE_TYPES = {"finish_reason": str, "text": str, "index": int, "logprobs": dict, "delta": dict, "message": dict}
_CALL_TYPES = {"index": int, "id": str, "function": dict}


def chunk_problem(chunk: Any) -> str | None:
    """A streamed chat or text completion chunk (not an error, not [DONE])."""
    if type(chunk) is not dict:
        return "a stream event is not a JSON object"
    choices = chunk.get("choices")
    if choices is None:
        if type(chunk.get("usage")) is dict:
            return _usage_problem(chunk["usage"])
        return "a stream event has no 'choices'"
    if type(choices) is not list:
        return "'choices' of a stream event is not an array"
    for choice in choices:
        problem = _choice_problem(choice)
        if problem:
            return problem
    usage = chunk.get("usage")
    if usage is not None:
        if type(usage) is not dict:
            return "'usage' is not an object"
        return _usage_problem(usage)
    return None


def completion_problem(body: Any) -> str | None:
    """A whole (non-streamed) chat or text completion."""
    if type(body) is not dict:
        return "the answer is not a JSON object"
    choices = body.get("choices")
    if type(choices) is not list:
        return "the answer has no 'choices' array"
    for choice in choices:
        problem = _choice_problem(choice)
        if problem:
            return problem
    usage = body.get("usage")
    if usage is not None:
        if type(usage) is not dict:
            return "'usage' is not an object"
        return _usage_problem(usage)
    return None


def _choice_problem(choice: Any) -> str | None:
    if type(choice) is not dict:
        return "a choice is not an object"
    for name, value in choice.items():
        if value is None:
            continue
        kind = _CHOICE_TYPES.get(name)
        if kind is not None and type(value) is not kind:
            return f"a choice's '{name}' is not {_A[kind]}"
        if kind is dict and name in ("delta", "message"):
            problem = _message_problem(value, name)
            if problem:
                return problem
    return None


def _message_problem(message: dict, where: str) -> str | None:
    for name, value in message.items():
        if value is None:
            continue
        kind = _MESSAGE_TYPES.get(name)
        if kind is not None and type(value) is not kind:
            return f"'{where}.{name}' is not {_A[kind]}"
        if kind is list:
            for call in value:
                if type(call) is not dict:
                    return f"a tool call in '{where}' is not an object"
                for key, v in call.items():
                    if v is None:
                        continue
                    k = _CALL_TYPES.get(key)
                    if k is not None and type(v) is not k:
                        return f"a tool call's '{key}' is not {_A[k]}"
                    if k is dict:
                        for fname in ("name", "arguments"):
                            fv = v.get(fname)
                            if fv is not None and type(fv) is not str:
                                return f"a tool call's 'function.{fname}' is not a string"
    return None


_A = {str: "a string", int: "an integer", dict: "an object", list: "an array"}


def _usage_problem(usage: dict) -> str | None:
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        v = usage.get(name)
        if v is not None and (type(v) is not int or v < 0):
            return f"'usage.{name}' is not a count"
    details = usage.get("prompt_tokens_details")
    if details is not None:
        if type(details) is not dict:
            return "'usage.prompt_tokens_details' is not an object"
        cached = details.get("cached_tokens")
        if cached is not None and (type(cached) is not int or cached < 0):
            return "'usage.prompt_tokens_details.cached_tokens' is not a count"
    return None
