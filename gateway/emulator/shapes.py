"""Wire shapes of each engine, copied from the fixtures in shared/fixtures/upstream.

vLLM streams compact `model_dump(exclude_unset=True)` chunks; SGLang mixes msgspec chunks (role and
reasoning: no nulls beyond `reasoning_content`) with pydantic ones (content and tools: every field,
`"usage":null`). Token chunks are built from pre-encoded byte templates: they are the hot path.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
import xxhash

from .generation import Plan, ToolCallPlan

_dumps = orjson.dumps
DONE = b"data: [DONE]\n\n"


def _event(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


# -- errors -------------------------------------------------------------------------------------------
def error_body(flavour: str, message: str, *, type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM wraps errors in {"error": {...}} with an int code; SGLang sends a flat object."""
    if flavour == "sglang":
        return {"object": "error", "message": message, "type": type, "param": param, "code": code}
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_event(flavour: str, message: str) -> bytes:
    # Both engines' streaming generators turn an exception into a 400 BadRequestError event.
    inner: dict[str, Any] = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    if flavour == "sglang":
        inner = {"object": "error", **inner}
    return _event({"error": inner})


# -- usage --------------------------------------------------------------------------------------------
def usage(
    flavour: str, prompt: int, completion: int, cached: int, reasoning: int | None, *, report: bool, full: bool
) -> dict[str, Any]:
    """`full` = the non-streaming model_dump (vLLM adds its null detail fields there)."""
    out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                           "completion_tokens": completion}
    if flavour == "sglang":
        # SGLang's _details_if_cached: null unless something was cached.
        out["prompt_tokens_details"] = {"cached_tokens": cached} if report and cached > 0 else None
        if reasoning is not None:
            out["reasoning_tokens"] = reasoning
        return out
    if report:
        details: dict[str, Any] = {"cached_tokens": cached}
        if full:
            details.update(created_cache_tokens=None, multimodal_tokens=None)
        out["prompt_tokens_details"] = details
    elif full:
        out["prompt_tokens_details"] = None
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


# -- ids ----------------------------------------------------------------------------------------------
def response_id(flavour: str, kind: str, request_id: str | None) -> str:
    if flavour == "sglang":
        return request_id or uuid.uuid4().hex
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return prefix + (request_id or uuid.uuid4().hex)  # vLLM builds the id from X-Request-Id


# -- chat streams -------------------------------------------------------------------------------------
class ChatChunks:
    """Builds one chat stream's SSE events as bytes."""

    def __init__(self, flavour: str, rid: str, created: int, model: str, reasoning_field: str) -> None:
        self.flavour = flavour
        self.sglang = flavour == "sglang"
        self._head = (
            b'data: {"id":' + _dumps(rid) + b',"object":"chat.completion.chunk","created":'
            + str(created).encode() + b',"model":' + _dumps(model) + b',"choices":['
        )
        self._rfields = ["reasoning", "reasoning_content"] if reasoning_field == "both" else [reasoning_field]
        if self.sglang:
            self._tail = b'},"logprobs":null,"finish_reason":null,"matched_stop":null}]'
            nulls = b"".join(b'"' + f.encode() + b'":null,' for f in self._rfields)
            self._content_head = b'{"index":0,"delta":{"role":null,"content":'
            self._content_tail = b"," + nulls[:-1] + b',"tool_calls":null' + self._tail + b',"usage":null}\n\n'
            self._nulls = nulls
        else:
            self._tail = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]'
        self.usage_suffix: bytes = b""  # vLLM continuous_usage_stats: set per chunk by the caller

    def _end(self) -> bytes:
        return (b',"usage":' + self.usage_suffix if self.usage_suffix else b"") + b"}\n\n"

    def role(self) -> bytes:
        if self.sglang:
            return (
                self._head + b'{"index":0,"delta":{' + self._nulls + b'"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
            )
        return (
            self._head + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}],"prompt_token_ids":null' + self._end()
        )

    def reasoning(self, text: str) -> bytes:
        t = _dumps(text)
        delta = b",".join(b'"' + f.encode() + b'":' + t for f in self._rfields)
        if self.sglang:
            return self._head + b'{"index":0,"delta":{' + delta + self._tail + b"}\n\n"
        return self._head + b'{"index":0,"delta":{' + delta + self._tail + self._end()

    def content(self, text: str) -> bytes:
        if self.sglang:
            return self._head + self._content_head + _dumps(text) + self._content_tail
        return self._head + b'{"index":0,"delta":{"content":' + _dumps(text) + self._tail + self._end()

    def reasoning_many(self, texts: list[str]) -> list[bytes]:
        if self.usage_suffix or len(self._rfields) > 1:
            return [self.reasoning(t) for t in texts]
        tail = b"}\n\n" if self.sglang else self._end()
        pre = self._head + b'{"index":0,"delta":{"' + self._rfields[0].encode() + b'":'
        suf = self._tail + tail
        return [pre + _dumps(t) + suf for t in texts]

    def content_many(self, texts: list[str]) -> list[bytes]:
        """Same bytes as content() per text, with the constant parts joined once (the hot path)."""
        if self.usage_suffix:
            return [self.content(t) for t in texts]
        if self.sglang:
            pre, suf = self._head + self._content_head, self._content_tail
        else:
            pre, suf = self._head + b'{"index":0,"delta":{"content":', self._tail + self._end()
        return [pre + _dumps(t) + suf for t in texts]

    def tool_call(self, tc: ToolCallPlan) -> list[bytes]:
        """vLLM: header then argument fragments. SGLang: name chunk then the whole arguments."""
        if self.sglang:
            calls: list[dict[str, Any]] = [
                {"id": tc.stream_id, "index": 0, "type": "function", "function": {"name": tc.name, "arguments": ""}},
                {"id": None, "index": 0, "type": "function", "function": {"name": None, "arguments": tc.arguments}},
            ]
            return [self._sglang_tool(c) for c in calls]
        head = {"id": tc.stream_id, "type": "function", "index": 0, "function": {"name": tc.name, "arguments": ""}}
        out = [self._vllm_tool(head)]
        out += [self._vllm_tool({"index": 0, "function": {"arguments": frag}}) for frag in tc.fragments]
        return out

    def _vllm_tool(self, call: dict[str, Any]) -> bytes:
        return self._head + b'{"index":0,"delta":{"tool_calls":' + _dumps([call]) + self._tail + self._end()

    def _sglang_tool(self, call: dict[str, Any]) -> bytes:
        return (
            self._head + b'{"index":0,"delta":{"role":null,"content":null,' + self._nulls
            + b'"tool_calls":' + _dumps([call]) + self._tail + b',"usage":null}\n\n'
        )

    def finish(self, reason: str) -> bytes:
        if self.sglang:
            matched = b"null" if reason == "length" else b"1"  # 1 = DeepSeek's EOS id
            return (
                self._head + b'{"index":0,"delta":{' + self._nulls[:-1] + b'},"logprobs":null,"finish_reason":'
                + _dumps(reason) + b',"matched_stop":' + matched + b"}]}\n\n"
            )
        return (
            self._head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":' + _dumps(reason)
            + b',"stop_reason":null,"token_ids":null}]' + self._end()
        )

    def usage(self, usage_obj: dict[str, Any]) -> bytes:
        return self._head + b'],"usage":' + _dumps(usage_obj) + b"}\n\n"


# -- completions streams ------------------------------------------------------------------------------
class CompletionChunks:
    def __init__(self, flavour: str, rid: str, created: int, model: str) -> None:
        self.sglang = flavour == "sglang"
        self._head = (
            b'data: {"id":' + _dumps(rid) + b',"object":"text_completion","created":'
            + str(created).encode() + b',"model":' + _dumps(model) + b',"choices":['
        )
        self._extra = b',"matched_stop":null' if self.sglang else b',"stop_reason":null'
        self._close = b'],"usage":null}\n\n' if self.sglang else b"]}\n\n"

    def text(self, text: str) -> bytes:
        return (
            self._head + b'{"index":0,"text":' + _dumps(text) + b',"logprobs":null,"finish_reason":null'
            + self._extra + b"}" + self._close
        )

    def finish(self, reason: str) -> bytes:
        extra = self._extra
        if self.sglang and reason != "length":
            extra = b',"matched_stop":1'
        return (
            self._head + b'{"index":0,"text":"","logprobs":null,"finish_reason":' + _dumps(reason)
            + extra + b"}" + self._close
        )

    def usage(self, usage_obj: dict[str, Any]) -> bytes:
        return self._head + b'],"usage":' + _dumps(usage_obj) + b"}\n\n"


# -- non-streaming bodies -----------------------------------------------------------------------------
def chat_response(
    flavour: str, rid: str, created: int, model: str, plan: Plan, reasoning_field: str, usage_obj: dict[str, Any]
) -> dict[str, Any]:
    text = plan.content_text
    reasoning = plan.reasoning_text or None
    tc = plan.tool_call
    fields = ["reasoning", "reasoning_content"] if reasoning_field == "both" else [reasoning_field]
    if flavour == "sglang":
        message: dict[str, Any] = {"role": "assistant", "content": (text.strip() or None) if tc else text}
        for f in fields:
            message[f] = reasoning
        message["tool_calls"] = (
            [{"id": tc.stream_id, "index": 0, "type": "function",
              "function": {"name": tc.name, "arguments": tc.arguments}}]
            if tc
            else None
        )
        matched = 1 if plan.finish_reason == "stop" else None
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason,
                  "matched_stop": matched}
        return {
            "id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
            "usage": usage_obj, "metadata": {"weight_version": "default"},
        }
    message = {
        "role": "assistant", "content": (text or None) if tc else text, "refusal": None, "annotations": None,
        "audio": None, "function_call": None,
        "tool_calls": [{"id": tc.final_id, "type": "function",
                        "function": {"name": tc.name, "arguments": tc.arguments}}]
        if tc
        else [],
    }
    for f in fields:
        message[f] = reasoning
    choice = {
        "index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason,
        "stop_reason": None, "token_ids": None,
    }
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
        "service_tier": None, "system_fingerprint": None, "usage": usage_obj, "prompt_logprobs": None,
        "prompt_token_ids": None, "kv_transfer_params": None,
    }


def completion_response(
    flavour: str, rid: str, created: int, model: str, plan: Plan, usage_obj: dict[str, Any]
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": plan.content_text, "logprobs": None,
                              "finish_reason": plan.finish_reason}
    if flavour == "sglang":
        choice["matched_stop"] = 1 if plan.finish_reason == "stop" else None
        return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
                "usage": usage_obj}
    choice.update(stop_reason=None, prompt_logprobs=None)
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
        "service_tier": None, "system_fingerprint": None, "usage": usage_obj, "kv_transfer_params": None,
    }


def models_body(flavour: str, model: str, root: str, max_model_len: int) -> dict[str, Any]:
    now = int(time.time())
    card: dict[str, Any] = {
        "id": model, "object": "model", "created": now, "owned_by": flavour, "root": root, "parent": None,
        "max_model_len": max_model_len,
    }
    if flavour == "vllm":
        card["permission"] = [
            {
                "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }
        ]
    return {"object": "list", "data": [card]}


# -- logprobs -------------------------------------------------------------------------------------------
def logprob(token: str, top: int) -> dict[str, Any]:
    """A deterministic logprob entry for `token` with `top` alternatives (the token itself first)."""
    h = xxhash.xxh3_64_intdigest(token.encode())
    lp = -((h % 2000) / 1000.0)
    entry: dict[str, Any] = {"token": token, "logprob": lp, "bytes": list(token.encode())}
    alts = [{"token": token, "logprob": lp, "bytes": list(token.encode())}]
    for k in range(1, top):
        alt = f"{token.strip()}#{k}"
        alts.append({"token": alt, "logprob": round(lp - 0.5 * k - ((h >> k) % 100) / 1000.0, 4),
                     "bytes": list(alt.encode())})
    entry["top_logprobs"] = alts[:top]
    return entry


def with_logprobs(event: bytes, token: str, top: int) -> bytes:
    """A chat chunk with its `"logprobs":null` replaced by this token's entry."""
    return event.replace(b'"logprobs":null', b'"logprobs":' + _dumps({"content": [logprob(token, top)]}), 1)


# -- vLLM return_token_ids ----------------------------------------------------------------------------
def wants_token_ids(flavour: str, body: dict[str, Any]) -> bool:
    """vLLM (>= 0.10.2) honours `return_token_ids` on chat completions; SGLang's chat API (the version
    these shapes follow) has no such field and ignores it."""
    return flavour == "vllm" and body.get("return_token_ids") is True


def with_token_ids(events: list[bytes], slots: list[int], prompt: list[int], generated: list[int],
                   n_reasoning: int) -> tuple[list[bytes], list[int]]:
    """A one-choice vLLM chat stream as vLLM sends it with `return_token_ids`: the prompt's ids on the
    role chunk (`"prompt_token_ids"`), the ids of each delta in its chunk (`"token_ids"`, here one per
    delta chunk), and a chunk of its own, with an empty delta, for the token that ends the reasoning
    (`</think>` makes no delta: vLLM sends such a chunk only when asked for ids); the rest of the
    generated ids (the end-of-sentence token) come with the finish chunk."""
    out_e: list[bytes] = []
    out_s: list[int] = []
    pos = 0
    for i, (e, s) in enumerate(zip(events, slots)):
        if i == 0:
            e = e.replace(b'"prompt_token_ids":null', b'"prompt_token_ids":' + _dumps(prompt), 1)
        elif b'"token_ids":null' in e:
            finish = b'"finish_reason":null' not in e
            take = generated[pos:] if finish else generated[pos:pos + 1]
            pos += len(take)
            e = e.replace(b'"token_ids":null', b'"token_ids":' + _dumps(take), 1)
        out_e.append(e)
        out_s.append(s)
        if i == n_reasoning and n_reasoning > 0 and pos < len(generated):
            head = e[:e.index(b'"choices":[') + 11]
            out_e.append(head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":'
                         + _dumps(generated[pos:pos + 1]) + b"}]}\n\n")
            out_s.append(s)
            pos += 1
    return out_e, out_s
