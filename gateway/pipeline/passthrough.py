"""The pass-through endpoints: /v1/responses, /v1/embeddings, /tokenize, /detokenize.

They go the way of /v1/chat/completions (client key, model mapping, lane gates and fallbacks,
forwarding with failover, records, metrics, access log) with their own shape checks. Only
/v1/responses is policed by the hot-path policies (limits that apply to its body); embeddings and
(de)tokenize are not generations: no conversation, no effort pinning.

The Responses API streams typed events (`event: response.output_text.delta` + `data: {...}`) and
ends with `response.completed` (or `.failed`, `.incomplete`), not `[DONE]`; its usage is
`input_tokens / output_tokens / input_tokens_details.cached_tokens`, which is read into the chat
shape the records and metrics know.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ..core.errors import invalid_request
from ..core.exchange import Exchange
from ..relay.scrub import Scrubber
from ..relay.sse import data_of, typed_event
from . import messages_chat
from .responses_chat import take_output
from .validate import no_stream

RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
MESSAGES = "/v1/messages"  # Anthropic's Messages API (messages_chat.py)
COUNT_TOKENS = "/v1/messages/count_tokens"
POLICED = frozenset({"/v1/chat/completions", "/v1/completions", RESPONSES, MESSAGES})
STREAM_OPTIONS = frozenset({"/v1/chat/completions", "/v1/completions"})  # where the gateway asks for usage


# -- shape checks (hot path: cheap, a clear 400 naming the field) ------------------------------------


def check_responses(body: dict[str, Any]) -> None:
    for name in ("stream", "store", "background", "parallel_tool_calls"):
        v = body.get(name)
        if v is not None and not isinstance(v, bool):
            raise invalid_request(f"'{name}' must be a boolean", param=name, code="invalid_type")
    inp = body.get("input")
    if inp is None:
        raise invalid_request("'input' is required", param="input", code="missing_required_parameter")
    if not isinstance(inp, (str, list)):
        raise invalid_request("'input' must be a string or an array of input items", param="input",
                              code="invalid_type")
    if isinstance(inp, list):
        for i, item in enumerate(inp):
            if not isinstance(item, dict):
                raise invalid_request(f"input[{i}] must be an object", param=f"input[{i}]", code="invalid_type")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise invalid_request("'instructions' must be a string", param="instructions", code="invalid_type")
    v = body.get("max_output_tokens")
    if v is not None and (type(v) is not int or v < 1):
        raise invalid_request("'max_output_tokens' must be a positive integer", param="max_output_tokens",
                              code="invalid_type")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise invalid_request("'reasoning' must be an object", param="reasoning", code="invalid_type")
        effort = reasoning.get("effort")
        if effort is not None and (isinstance(effort, bool) or not isinstance(effort, (str, int))):
            raise invalid_request("'reasoning.effort' must be a string or an integer", param="reasoning.effort",
                                  code="invalid_type")
    for name in ("temperature", "top_p"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise invalid_request(f"'{name}' must be a number", param=name, code="invalid_type")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid_request("'tools' must be an array", param="tools", code="invalid_type")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise invalid_request(f"tools[{i}] must be an object", param=f"tools[{i}]", code="invalid_type")


def check_embeddings(body: dict[str, Any]) -> None:
    no_stream(body)
    inp = body.get("input")
    if inp is None:
        raise invalid_request("'input' is required", param="input", code="missing_required_parameter")
    ok = isinstance(inp, str) or (isinstance(inp, list) and inp and (
        all(isinstance(x, str) for x in inp) or all(type(x) is int for x in inp)
        or all(isinstance(x, list) and all(type(t) is int for t in x) for x in inp)))
    if not ok:
        raise invalid_request("'input' must be a string, an array of strings, or token arrays (non-empty)",
                              param="input", code="invalid_type")
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        raise invalid_request("'encoding_format' must be 'float' or 'base64'", param="encoding_format",
                              code="invalid_value")
    dims = body.get("dimensions")
    if dims is not None and (type(dims) is not int or dims < 1):
        raise invalid_request("'dimensions' must be a positive integer", param="dimensions", code="invalid_type")


def check_tokenize(body: dict[str, Any]) -> None:
    no_stream(body)
    prompt, messages = body.get("prompt"), body.get("messages")
    if prompt is None and messages is None:
        raise invalid_request("'prompt' (a string) or 'messages' (a chat) is required", param="prompt",
                              code="missing_required_parameter")
    if prompt is not None and not isinstance(prompt, str):
        raise invalid_request("'prompt' must be a string", param="prompt", code="invalid_type")
    if messages is not None and not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
        raise invalid_request("'messages' must be an array of messages", param="messages", code="invalid_type")
    for name in ("add_special_tokens", "add_generation_prompt", "return_token_strs"):
        v = body.get(name)
        if v is not None and not isinstance(v, bool):
            raise invalid_request(f"'{name}' must be a boolean", param=name, code="invalid_type")


def check_detokenize(body: dict[str, Any]) -> None:
    no_stream(body)
    tokens = body.get("tokens")
    if tokens is None:
        raise invalid_request("'tokens' is required", param="tokens", code="missing_required_parameter")
    if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
        raise invalid_request("'tokens' must be an array of token ids", param="tokens", code="invalid_type")


# -- what comes back ---------------------------------------------------------------------------------


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """Responses usage -> the chat shape (prompt/completion tokens, cached and reasoning details)."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:
        return usage
    out: dict[str, Any] = {"prompt_tokens": usage.get("input_tokens"),
                           "completion_tokens": usage.get("output_tokens"),
                           "total_tokens": usage.get("total_tokens")}
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        out["prompt_tokens_details"] = {"cached_tokens": details["cached_tokens"]}
    odetails = usage.get("output_tokens_details")
    if isinstance(odetails, dict) and odetails.get("reasoning_tokens") is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": odetails["reasoning_tokens"]}
    return out


_END_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete"})
_DELTA_EVENTS = frozenset({"response.output_text.delta", "response.reasoning_text.delta",
                           "response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
                           "response.refusal.delta"})


class ResponsesObserver:
    """The relay's observer (relay.sse.EventObserver) for Responses API streams.

    Events pass byte for byte, but for two documented rewrites: an upstream error's message is
    scrubbed (`error` events and a failed response's `error`), and an event whose data is not a JSON
    object with a `type` is not relayed: the stream ends with a Responses `error` event instead."""

    __slots__ = ("ex", "done", "error", "scrubber", "sequence")

    def __init__(self, ex: Exchange, scrubber: Scrubber | None = None) -> None:
        self.ex = ex
        self.done = False
        self.error: dict[str, Any] | None = None
        self.scrubber = scrubber or Scrubber()
        self.sequence = 0  # the last sequence_number seen: a failure event follows it

    def failure_event(self, message: str, code: str) -> bytes:
        body = {"type": "error", "code": code, "message": message, "param": None,
                "sequence_number": self.sequence + 1}
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"

    def relay(self, event: bytes) -> bytes | None:
        """The bytes the client gets for this event (None: nothing). Raises BadStream."""
        payload = data_of(event)
        if payload is None:
            return b":\n\n" if event.strip() else None  # a comment (keep-alive), without the upstream's text
        if payload == b"[DONE]":
            self.done = True
            return event
        if not payload:
            return None
        obj = typed_event(payload)
        seq = obj.get("sequence_number")
        if type(seq) is int:
            self.sequence = seq
        if self._observe(obj):
            return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"
        return event

    def _observe(self, obj: dict[str, Any]) -> bool:
        """Record what the event says; True when it was rewritten (a scrubbed error)."""
        kind = obj["type"]
        ex = self.ex
        if kind in _DELTA_EVENTS:
            now = time.perf_counter()
            if ex.t_first_token is None:
                ex.t_first_token = now
            ex.t_last_token = now
            ex.token_chunk_times.append(now)
            delta = obj.get("delta")
            if isinstance(delta, str) and kind != "response.function_call_arguments.delta":
                (ex.generated.reasoning if "reasoning" in kind else ex.generated.content).append(delta)
            return False
        if kind in _END_EVENTS:
            self.done = True
            resp = r if isinstance(r := obj.get("response"), dict) else {}
            # The output items, as the client sends them back next turn, replace what the deltas gathered.
            take_output(ex.generated, resp.get("output"))
            usage = chat_usage(resp.get("usage"))
            if usage:
                ex.usage = usage
            ex.generated.finish_reason = resp.get("status")
            if kind == "response.failed" and isinstance(resp.get("error"), dict):
                self.error = self._scrubbed(resp["error"])
                return True
            return False
        if kind == "error":  # terminal in the Responses API: nothing after it is for the client
            self.done = True
            inner = obj.get("error")
            self.error = self._scrubbed(inner if isinstance(inner, dict) else obj)
            if isinstance(inner, dict):
                self._scrubbed(obj)
            return True
        return False

    def _scrubbed(self, err: dict[str, Any]) -> dict[str, Any]:
        """Scrub an error object's message in place; the error as recorded."""
        err["message"] = self.scrubber.text(str(err.get("message") or ""))
        err["code"] = self.scrubber.code(err.get("code"))
        return {"message": err["message"], "code": err["code"]}


def observe_response_body(ex: Exchange, body: bytes | dict[str, Any]) -> None:
    """A whole (non-streamed) Response object, an Anthropic Message, or an embeddings / tokenize answer
    (bytes or parsed)."""
    try:
        data = orjson.loads(body) if isinstance(body, (bytes, str)) else body
    except orjson.JSONDecodeError:
        return
    if not isinstance(data, dict):
        return
    if ex.path == MESSAGES:
        usage = messages_chat.chat_usage(data.get("usage"))
        if usage:
            ex.usage = usage
        messages_chat.take_message(ex.generated, data)
        return
    usage = chat_usage(data.get("usage"))
    if usage:
        ex.usage = usage
    take_output(ex.generated, data.get("output"))
    if isinstance(data.get("status"), str):
        ex.generated.finish_reason = data["status"]


def map_responses_effort(body: dict[str, Any], lane: Any) -> None:
    """`reasoning.effort` of a Responses request, in the lane's vocabulary (as for chat: an invalid
    word is a 400 listing the accepted ones). On a template lane the engine gets a word it knows, or
    the number through chat_template_kwargs; `none` turns thinking off."""
    from ..conversations import effort as effort_mod

    reasoning = body.get("reasoning")
    if not isinstance(reasoning, dict) or reasoning.get("effort") is None:
        return
    value = reasoning["effort"]
    choice = effort_mod.resolve({"reasoning_effort": value}, lane)
    if lane.render.template is None:
        return
    new_reasoning = {k: v for k, v in reasoning.items() if k != "effort"}
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if not choice.thinking:
        kwargs["thinking"] = kwargs["enable_thinking"] = False
    else:
        word = effort_mod._word_for(lane, choice.effort)
        if word is not None and word in ("low", "high"):  # OpenAI's Reasoning.effort literal
            new_reasoning["effort"] = word
        kwargs["reasoning_effort"] = word or choice.effort
    body["reasoning"] = new_reasoning
    body["chat_template_kwargs"] = kwargs
