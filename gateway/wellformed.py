"""Is an upstream's answer shaped like OpenAI's? The fields clients read must have the right types.

The openai client builds its objects without validating them (`construct`), so a chunk with
`"content": 5` or `"choices": [1]` reaches the application as is and breaks it far from the cause.
The gateway checks what clients and the gateway itself read, and lets unknown fields through:
an engine's extras (vLLM's `prompt_logprobs`, SGLang's `matched_stop`) are not errors.

Each function returns None when the value is fine, else a short reason (for the error and the
record). Cost: ~1 µs per stream chunk (a dict and a few type checks), measured with timeit.
"""

from __future__ import annotations

from typing import Any

_OPT_STR_DELTA = ("content", "reasoning_content", "reasoning", "refusal", "role")
_OPT_STR_CHOICE = ("finish_reason",)


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
        if type(choice) is not dict:
            return "a choice of a stream event is not an object"
        delta = choice.get("delta")
        if delta is not None:
            if type(delta) is not dict:
                return "'delta' of a stream event is not an object"
            problem = _message_problem(delta, "delta")
            if problem:
                return problem
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
        if type(choice) is not dict:
            return "a choice is not an object"
        message = choice.get("message")
        if message is not None:
            if type(message) is not dict:
                return "'message' is not an object"
            problem = _message_problem(message, "message")
            if problem:
                return problem
        problem = _choice_problem(choice)
        if problem:
            return problem
    usage = body.get("usage")
    if usage is not None:
        if type(usage) is not dict:
            return "'usage' is not an object"
        return _usage_problem(usage)
    return None


def _choice_problem(choice: dict) -> str | None:
    for name in _OPT_STR_CHOICE:
        v = choice.get(name)
        if v is not None and type(v) is not str:
            return f"'{name}' is not a string"
    text = choice.get("text")  # /v1/completions
    if text is not None and type(text) is not str:
        return "'text' is not a string"
    index = choice.get("index")
    if index is not None and type(index) is not int:
        return "'index' is not an integer"
    logprobs = choice.get("logprobs")
    if logprobs is not None and type(logprobs) is not dict:
        return "'logprobs' is not an object"
    return None


def _message_problem(message: dict, where: str) -> str | None:
    for name in _OPT_STR_DELTA:
        v = message.get(name)
        if v is not None and type(v) is not str:
            return f"'{where}.{name}' is not a string"
    calls = message.get("tool_calls")
    if calls is None:
        return None
    if type(calls) is not list:
        return f"'{where}.tool_calls' is not an array"
    for call in calls:
        if type(call) is not dict:
            return f"a tool call in '{where}' is not an object"
        index = call.get("index")
        if index is not None and type(index) is not int:
            return "a tool call's 'index' is not an integer"
        cid = call.get("id")
        if cid is not None and type(cid) is not str:
            return "a tool call's 'id' is not a string"
        fn = call.get("function")
        if fn is None:
            continue
        if type(fn) is not dict:
            return "a tool call's 'function' is not an object"
        for name in ("name", "arguments"):
            v = fn.get(name)
            if v is not None and type(v) is not str:
                return f"a tool call's 'function.{name}' is not a string"
    return None


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
