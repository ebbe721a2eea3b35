"""The emulator's /v1/responses, /v1/embeddings and /detokenize, shaped like vLLM's.

/v1/responses is served by the chat machinery: the request is read as the chat request it maps
onto (instructions -> system message, input items -> messages, max_output_tokens -> max_tokens,
reasoning.effort -> reasoning_effort), planned like a chat turn, and answered as a Response
object, or as the typed event stream the openai SDK reads (response.created ... response.completed).
Embeddings are deterministic unit vectors from a hash of each input (base64 or float).
"""

from __future__ import annotations

import base64
import math
import struct
import time
import uuid
from typing import Any

import orjson
import xxhash

from ..pipeline.responses_chat import chat_tools, chat_view


def chat_body_of(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request a Responses request maps onto: vLLM's reading (the gateway's, which the engine
    tests hold token for token to vLLM's own prompt); a request that reading leaves out (engine-side
    state, encrypted reasoning) is read leniently below, its state ignored."""
    view = chat_view(body)
    if view.body is not None:
        out = view.body
        for key in ("temperature", "top_p", "seed"):
            if key in body:
                out[key] = body[key]
        return out
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    inp = body.get("input")
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for item in inp:
            if not isinstance(item, dict):
                continue
            kind = item.get("type", "message")
            # vLLM merges a reasoning item, an assistant message and function calls that follow each
            # other into one assistant message (turn 1's output items sent back as they came).
            prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
            if kind == "message":
                content = item.get("content")
                role = item.get("role")
                if role == "assistant":
                    text = content if isinstance(content, str) else (
                        str(content[0].get("text", "")) if isinstance(content, list) and content
                        and isinstance(content[0], dict) else "")
                    if prev is not None and prev.get("content") is None:
                        prev["content"] = text
                    else:
                        messages.append({"role": "assistant", "content": text})
                    continue
                if isinstance(content, list):
                    text = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                else:
                    text = content if isinstance(content, str) else ""
                messages.append({"role": role if role in ("system", "developer", "user") else "user",
                                 "content": text})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.get("call_id", ""),
                                 "content": str(item.get("output", ""))})
            elif kind == "function_call":
                call = {"id": item.get("call_id", ""), "type": "function",
                        "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "{}")}}
                if prev is not None:
                    prev.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "reasoning":
                parts = item.get("content") or item.get("summary") or []
                text = str(parts[0].get("text", "")) if parts and isinstance(parts[0], dict) else ""
                if prev is not None and prev.get("reasoning") is None:
                    prev["reasoning"] = text
                else:
                    messages.append({"role": "assistant", "content": None, "reasoning": text})
    out = {"model": body.get("model"), "messages": messages or [{"role": "user", "content": ""}]}
    if isinstance(body.get("max_output_tokens"), int):
        out["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]
    for key in ("temperature", "top_p", "seed", "chat_template_kwargs"):
        if key in body:
            out[key] = body[key]
    tools = chat_tools(body["tools"]) if isinstance(body.get("tools"), list) else []
    if tools:
        out["tools"] = tools
    return out


def response_usage(prompt: int, cached: int, reasoning: int, completion: int) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion}


class ResponseBuilder:
    """The Response object and its stream events, for one planned turn."""

    def __init__(self, body: dict[str, Any], model: str, reasoning: list[str], content: list[str],
                 tool_call: Any, finish_reason: str) -> None:
        self.body = body
        self.model = model
        self.id = "resp_" + uuid.uuid4().hex
        self.msg_id = "msg_" + uuid.uuid4().hex
        self.rs_id = "rs_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.reasoning = reasoning
        self.content = content
        self.tool_call = tool_call
        self.incomplete = finish_reason == "length"
        self.seq = 0

    def _items(self, done: bool) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if self.reasoning:
            items.append({"id": self.rs_id, "type": "reasoning", "summary": [],
                          "content": [{"type": "reasoning_text", "text": "".join(self.reasoning)}],
                          "status": "completed" if done else "in_progress"})
        if self.tool_call is not None:
            items.append({"id": "fc_" + self.tool_call.stream_id, "type": "function_call",
                          "call_id": self.tool_call.stream_id, "name": self.tool_call.name,
                          "arguments": self.tool_call.arguments, "status": "completed"})
        else:
            items.append(self._message(done))
        return items

    def _message(self, done: bool) -> dict[str, Any]:
        return {"id": self.msg_id, "type": "message", "role": "assistant", "status": "completed" if done else
                "in_progress", "content": [{"type": "output_text", "text": "".join(self.content) if done else "",
                                            "annotations": [], "logprobs": []}] if done else []}

    def response(self, status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        done = status != "in_progress"
        b = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
            "output": self._items(True) if done else [], "parallel_tool_calls": True,
            "previous_response_id": None, "reasoning": b.get("reasoning"), "store": False,
            "temperature": b.get("temperature", 1.0), "text": {"format": {"type": "text"}},
            "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [], "top_p": b.get("top_p", 1.0),
            "truncation": "disabled", "usage": usage, "user": None, "metadata": {},
        }

    def final_status(self) -> str:
        return "incomplete" if self.incomplete else "completed"

    def event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"

    def head_events(self) -> list[bytes]:
        r = self.response("in_progress", None)
        return [self.event("response.created", response=r), self.event("response.in_progress", response=r)]

    def reasoning_open(self) -> list[bytes]:
        return [self.event("response.output_item.added", output_index=0, item={
            "id": self.rs_id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"})]

    def reasoning_delta(self, text: str) -> bytes:
        return self.event("response.reasoning_text.delta", item_id=self.rs_id, output_index=0, content_index=0,
                          delta=text)

    def reasoning_done(self) -> list[bytes]:
        item = self._items(True)[0]
        return [self.event("response.reasoning_text.done", item_id=self.rs_id, output_index=0, content_index=0,
                           text="".join(self.reasoning)),
                self.event("response.output_item.done", output_index=0, item=item)]

    def message_open(self, index: int) -> list[bytes]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self.event("response.output_item.added", output_index=index, item=self._message(False)),
                self.event("response.content_part.added", item_id=self.msg_id, output_index=index, content_index=0,
                           part=part)]

    def text_delta(self, index: int, text: str) -> bytes:
        return self.event("response.output_text.delta", item_id=self.msg_id, output_index=index, content_index=0,
                          delta=text, logprobs=[])

    def message_close(self, index: int) -> list[bytes]:
        text = "".join(self.content)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return [self.event("response.output_text.done", item_id=self.msg_id, output_index=index, content_index=0,
                           text=text, logprobs=[]),
                self.event("response.content_part.done", item_id=self.msg_id, output_index=index, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=index, item=self._message(True))]

    def tool_events(self, index: int) -> list[bytes]:
        item = self._items(True)[-1]
        return [self.event("response.output_item.added", output_index=index, item={**item, "arguments": "",
                                                                                   "status": "in_progress"}),
                self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                           delta=item["arguments"]),
                self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                           arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def tail_events(self, usage: dict[str, Any]) -> list[bytes]:
        status = self.final_status()
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [self.event(kind, response=self.response(status, usage))]


# -- embeddings and detokenize ----------------------------------------------------------------------


def embedding(text: str, dims: int) -> list[float]:
    """A deterministic unit vector for `text` (the same text always gives the same vector)."""
    raw = b"".join(xxhash.xxh3_128_digest(f"{i}:{text}".encode()) for i in range((dims * 4 + 15) // 16))
    vals = [((b / 255.0) - 0.5) for b in raw[:dims]]
    norm = math.sqrt(sum(v * v for v in vals)) or 1.0
    return [round(v / norm, 6) for v in vals]


def embeddings_body(body: dict[str, Any], model: str, dims_default: int, count_tokens) -> dict[str, Any]:
    inp: Any = body.get("input")  # a string, a list of them, or token ids (as the API accepts)
    items = [inp] if isinstance(inp, str) or (isinstance(inp, list) and inp and type(inp[0]) is int) else list(inp)
    dims = d if type(d := body.get("dimensions")) is int else dims_default
    as_b64 = body.get("encoding_format") == "base64"
    data = []
    tokens = 0
    for i, item in enumerate(items):
        text = item if isinstance(item, str) else " ".join(map(str, item))
        tokens += count_tokens(item)
        vec = embedding(text, dims)
        value: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode() if as_b64 else vec
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()), "model": model,
            "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                    "prompt_tokens_details": None}}
