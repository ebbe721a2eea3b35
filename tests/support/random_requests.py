"""Random chat requests for the renderer's equivalence tests: every message role, text and image parts,
tool calls with odd arguments, reasoning, tools, response formats, thinking and effort settings."""

from __future__ import annotations

import json
import random

from gateway.render import RenderOptions

WORDS = ["alpha", "beta", "x = 1", "naïve café", "日本語", "<think>", "\n", "  ", "}{", "[]", "?\n\n", "end."]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))


def _content(rng: random.Random, allow_none: bool) -> object:
    x = rng.random()
    if allow_none and x < 0.1:
        return None
    if x < 0.7:
        return _text(rng)
    parts = []
    for _ in range(rng.randrange(0, 4)):
        if rng.random() < 0.7:
            parts.append({"type": "text", "text": _text(rng)})
        else:
            parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    return parts


def _args(rng: random.Random) -> object:
    d = {}
    for i in range(rng.randrange(0, 4)):
        d[f"k{i}"] = rng.choice(["str val", 3, 2.5, True, None, [1, "a"], {"n": {"m": "ü"}}, ""])
    return json.dumps(d, ensure_ascii=rng.random() < 0.5) if rng.random() < 0.7 else d


TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}}]


def random_request(rng: random.Random) -> tuple[dict, RenderOptions]:
    msgs: list[dict] = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": _content(rng, True)})
    call_ids: list[str] = []
    for _ in range(rng.randrange(1, 12)):
        r = rng.choice(["user", "user", "assistant", "assistant", "tool", "tool", "developer", "system"])
        if r == "user":
            msgs.append({"role": "user", "content": _content(rng, False)})
        elif r == "developer":
            msgs.append({"role": "developer", "content": "dev " + _text(rng)})
        elif r == "system":
            msgs.append({"role": "system", "content": _content(rng, True)})
        elif r == "tool":
            m = {"role": "tool", "content": _content(rng, False)}
            if call_ids and rng.random() < 0.8:
                m["tool_call_id"] = rng.choice(call_ids + ["unknown"])
            msgs.append(m)
        else:
            m = {"role": "assistant", "content": _content(rng, True)}
            if rng.random() < 0.6:
                m["reasoning_content"] = _text(rng)
            if rng.random() < 0.5:
                n = rng.randrange(1, 4)
                call_ids = [f"c{rng.randrange(100)}" for _ in range(n)]
                m["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": rng.choice("fg"), "arguments": _args(rng)}}
                    if rng.random() < 0.9 else {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    for cid in call_ids
                ]
            msgs.append(m)
    body: dict = {"messages": msgs}
    if rng.random() < 0.4:
        body["tools"] = rng.choice([TOOLS, TOOLS[:1], []])
    if rng.random() < 0.15:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    opts = RenderOptions(
        thinking=rng.random() < 0.6,
        reasoning_effort=rng.choice([None, "low", "high", "xhigh", "max", 1, 37, 100]),
        drop_thinking=rng.random() < 0.7,
    )
    return body, opts
