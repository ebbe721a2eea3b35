"""A request's input checked before anything is rendered: the reasoning effort, each message's content
and reasoning, and an assistant's tool calls (their arguments parsed into objects, as the template
renders them).

Each refusal is a `RenderError` naming the offending field (e.g. messages[3].content[1]), so that the
client learns which part of its request to fix rather than meeting a template error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .effort import DEFAULT_EFFORT_MAP, effort_number
from .result import RenderError, RenderOptions

IMAGE_PLACEHOLDER = "<｜deepseek_image｜>"
ROLES = ("system", "user", "assistant", "tool", "developer")


def _effort_map(options: RenderOptions) -> Mapping[str, int]:
    return options.effort_map if options.effort_map else DEFAULT_EFFORT_MAP


def effective_effort(options: RenderOptions) -> int | None:
    """The number the prompt carries in thinking mode (None in chat mode); validates in both modes."""
    try:
        value = effort_number(options.reasoning_effort, options.effort_map)
    except ValueError as e:
        raise RenderError(str(e), "reasoning_effort") from None
    return value if options.thinking else None


def _check_text(text: str, param: str) -> None:
    if IMAGE_PLACEHOLDER in text:
        raise RenderError(
            f"contains the image placeholder token {IMAGE_PLACEHOLDER}; send images as image_url content parts",
            param,
        )


def _check_parts(parts: list, param: str) -> None:
    for j, p in enumerate(parts):
        pp = f"{param}[{j}]"
        if not isinstance(p, dict):
            raise RenderError("content parts must be objects", pp)
        t = p.get("type")
        if t == "text":
            if not isinstance(p.get("text"), str):
                raise RenderError("a text part needs a string `text`", pp + ".text")
            _check_text(p["text"], pp + ".text")
        elif t == "image_url":
            iu = p.get("image_url")
            url = iu if isinstance(iu, str) else (iu.get("url") if isinstance(iu, dict) else None)
            if not isinstance(url, str) or not url:
                raise RenderError("an image_url part needs image_url.url", pp + ".image_url")
        elif t == "image":
            if not any(p.get(k) for k in ("source", "url", "data")):
                raise RenderError("an image part needs a source, url or data", pp)
        else:
            raise RenderError(f"unsupported content part type {t!r} (expected text, image_url or image)", pp + ".type")


def _check_content(m: dict, i: int, role: str) -> None:
    c = m.get("content")
    param = f"messages[{i}].content"
    if isinstance(c, str):
        _check_text(c, param)
    elif isinstance(c, list):
        _check_parts(c, param)
    elif c is None:
        if role in ("user", "tool", "developer"):
            raise RenderError(f"a {role} message must have content", param)
    else:
        raise RenderError("must be a string or a list of content parts", param)
    rc = m.get("reasoning_content")
    if rc is not None:
        if not isinstance(rc, str):
            raise RenderError("must be a string", f"messages[{i}].reasoning_content")
        _check_text(rc, f"messages[{i}].reasoning_content")


def _content_text(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n\n".join(p["text"] if p.get("type") == "text" else IMAGE_PLACEHOLDER for p in c)
    return ""


def normalize_message(m: dict, i: int) -> dict:
    """Validate one message (roles were checked already) and parse tool-call arguments into dicts."""
    role = m["role"]
    _check_content(m, i, role)
    if role == "developer" and not _content_text(m.get("content")):
        raise RenderError("a developer message must have non-empty content", f"messages[{i}].content")
    if role != "assistant":
        return m
    tcs = m.get("tool_calls")
    if tcs is None:
        return m
    if not isinstance(tcs, list):
        raise RenderError("must be a list", f"messages[{i}].tool_calls")
    new_tcs = []
    for j, tc in enumerate(tcs):
        p = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
            raise RenderError("must be an object with a `function` object", p)
        fn = tc["function"]
        if not isinstance(fn.get("name"), str):
            raise RenderError("must be a string", p + ".function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError as e:
                raise RenderError(f"is not valid JSON ({e})", p + ".function.arguments") from None
        if not isinstance(args, dict):
            raise RenderError("must be a JSON object", p + ".function.arguments")
        if args is not fn.get("arguments"):
            tc = {**tc, "function": {**fn, "arguments": args}}
        new_tcs.append(tc)
    return {**m, "tool_calls": new_tcs}
