"""placeholder_tokens: special-token text (e.g. `<｜deepseek_image｜>`) written literally in a message.

The engine would parse it as its image placeholder (or another special token) and reject the request
or misrender it; a client that keeps the failing turn then fails forever. Searched in string content,
text parts, reasoning, tool results, tool-call arguments and tool schemas (everything the template
renders as text). Policy `reject`: 400 `invalid_placeholder_token` naming message and field. Policy
`escape`: a zero-width joiner is inserted after the token's first character, so the text reads the same
but no longer matches the special token; the same input always escapes to the same output, so the
rewrite is stable from turn to turn and does not move the prompt prefix.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson

from .base import NEED_PLACEHOLDERS, Context, Limit
from .scan import Spot

JOINER = "\u200d"  # ZERO WIDTH JOINER
MAX_LISTED = 8


def escape(text: str, tokens: tuple[str, ...]) -> str:
    for t in tokens:
        if t in text:
            text = text.replace(t, t[0] + JOINER + t[1:])
    return text


class Placeholders(Limit):
    name = "placeholder_tokens"
    needs = frozenset({NEED_PLACEHOLDERS})

    def active(self, limits) -> bool:
        return bool(limits.placeholder_tokens)

    async def enforce(self, ctx: Context) -> None:
        facts = ctx.facts
        if facts is None or not facts.spots:
            return
        spots = facts.spots
        if ctx.limits.placeholder_policy == "escape":
            self._escape(ctx, spots, tuple(ctx.limits.placeholder_tokens))
            return
        first = spots[0]
        places = ", ".join(s.param for s in spots[:MAX_LISTED])
        if len(spots) > MAX_LISTED:
            places += f", ... ({len(spots) - MAX_LISTED} more)"
        at = f"message {first.i} ({first.param})" if first.i >= 0 else first.param
        ctx.reject(
            self.name,
            f"{at} contains the text {first.token!r}, which this model reserves as a special token; it cannot "
            f"appear literally in a message. Found at: {places}. Remove it, or send images as image_url content "
            f"parts.",
            param=first.param,
            code="invalid_placeholder_token",
        )

    def _escape(self, ctx: Context, spots: list[Spot], tokens: tuple[str, ...]) -> None:
        body = ctx.body
        by_message: dict[int, list[Spot]] = defaultdict(list)
        for s in spots:
            by_message[s.i].append(s)
        if -1 in by_message:
            for s in by_message.pop(-1):
                if s.field == "tools":
                    body["tools"] = orjson.loads(escape(orjson.dumps(body["tools"]).decode(), tokens))
                elif s.field == "prompt":
                    if s.j is None:
                        body["prompt"] = escape(body["prompt"], tokens)
                    else:
                        prompts = list(body["prompt"])
                        prompts[s.j] = escape(prompts[s.j], tokens)
                        body["prompt"] = prompts
        if by_message:
            messages = list(body["messages"])
            for i, found in by_message.items():
                messages[i] = _escaped_message(messages[i], found, tokens)
            body["messages"] = messages
        ctx.rewrote(self.name, f"escaped={len(spots)}")
        ctx.ex.limits.placeholders_escaped = [s.param for s in spots]
        if ctx.facts is not None:
            ctx.facts.other_bytes += len(JOINER.encode()) * len(spots)


def _escaped_message(m: dict[str, Any], found: list[Spot], tokens: tuple[str, ...]) -> dict[str, Any]:
    """A copy of message `m` with every placeholder escaped; only the containers on the way are copied."""
    m = dict(m)
    copied: set[str] = set()
    for s in found:
        if s.field == "content" and s.j is None:
            m["content"] = escape(m["content"], tokens)
        elif s.field == "content":
            if "content" not in copied:
                m["content"] = list(m["content"])
                copied.add("content")
            part = dict(m["content"][s.j])
            part["text"] = escape(part["text"], tokens)
            m["content"][s.j] = part
        elif s.field in ("reasoning_content", "reasoning"):
            m[s.field] = escape(m[s.field], tokens)
        elif s.field == "tool_calls":
            if "tool_calls" not in copied:
                m["tool_calls"] = list(m["tool_calls"])
                copied.add("tool_calls")
            call = dict(m["tool_calls"][s.j])
            fn = dict(call["function"])
            args = fn["arguments"]
            if isinstance(args, dict):
                fn["arguments"] = orjson.loads(escape(orjson.dumps(args).decode(), tokens))
            else:
                fn["arguments"] = escape(args, tokens)
            call["function"] = fn
            m["tool_calls"][s.j] = call
    return m
