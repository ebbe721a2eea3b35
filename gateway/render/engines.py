"""What an engine does to a request before its chat template sees it.

The same template renders differently on two engines when they normalise the request differently,
so the renderer applies the lane's engine normalisation first:

* "sglang" (default): nothing. SGLang's DeepSeek-V4.1 path hands the OpenAI messages to the
  reference encoder as they are; the golden vectors are this path.
* "vllm": vLLM (checked against 0.32) before templating
  - joins a tool message's list content with "\\n" when every part is text (the reference joins
    parts with "\\n\\n"; mixed text/image content stays a list);
  - re-serialises each tool through its pydantic model: `function` becomes {name, description,
    parameters} in that order, missing description/parameters become null, `strict` and
    `defer_loading` appear only when set, other keys are dropped;
  - drops the first line of a system text part that starts with Claude Code's
    "x-anthropic-billing-header" (and the part when nothing remains);
  - renames `reasoning_content` to `reasoning` and gives the template both (no effect here);
  - never hands the request's top-level `response_format` to the chat template (it only drives
    guided decoding): the template sees one only through `chat_template_kwargs.response_format`
    (checked on vLLM 0.32's chat path with `return_token_ids`: golden case 13 renders without it).
  Tool-call arguments that are not a JSON object are coerced to {} by vLLM; the gateway rejects
  them instead (the reference encoder fails on them), so that difference never reaches an engine.
"""

from __future__ import annotations

from typing import Any

ENGINES = ("sglang", "vllm")
_CLAUDE_CODE_BILLING_HEADER = "x-anthropic-billing-header"


def normalize_messages(engine: str, messages: list) -> list:
    if engine != "vllm":
        return messages
    out = messages
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        new = None
        if role == "tool":
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
                for p in parts:
                    text = p if isinstance(p, str) else p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
                    if isinstance(text, str) and text.startswith(_CLAUDE_CODE_BILLING_HEADER):
                        rest = text.partition("\n")[2]
                        if rest:
                            kept.append(rest if isinstance(p, str) else {**p, "text": rest})
                    else:
                        kept.append(p)
                new = {**m, "content": kept if isinstance(c, list) else ("".join(kept) if kept else [])}
        if new is not None:
            if out is messages:
                out = list(messages)
            out[i] = new
    return out


def _is_billing(p: Any) -> bool:
    text = p if isinstance(p, str) else p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
    return isinstance(text, str) and text.startswith(_CLAUDE_CODE_BILLING_HEADER)


def template_response_format(engine: str, body: dict) -> Any:
    """The response_format the engine's chat template sees (None when it sees none)."""
    if engine == "vllm":
        kwargs = body.get("chat_template_kwargs")
        return (kwargs.get("response_format") if isinstance(kwargs, dict) else None) or None
    return body.get("response_format") or None


def normalize_tools(engine: str, tools: list | None) -> list | None:
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
