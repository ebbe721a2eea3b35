"""The single pass over a request that every limit reads from.

One loop over the messages collects, depending on what the lane's active limits need: where the
images are, where placeholder tokens appear as text, and how many UTF-8 bytes of text the prompt
carries (with references to the strings, for an estimate by a tokenizer). Nothing is copied.

Costs that matter on 1,600-message 2 MB bodies: `str.isascii()` is O(1) in CPython (the flag is
stored), so ASCII strings are measured with `len` and never encoded, and placeholder tokens that
contain non-ASCII characters (DeepSeek's fullwidth bars) are never searched for in ASCII strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..render.normalize import reasoning_field

IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image"})
TEXT_PART_TYPES = frozenset({"text", "input_text"})


@dataclass(slots=True)
class Spot:
    """A place in the request where text holds a placeholder token."""

    i: int  # message index; -1 for request-level fields (tools, prompt)
    field: str  # content | reasoning_content | reasoning | tool_calls | tools | prompt
    j: int | None  # content part, tool call or prompt index
    token: str  # the first token found there

    @property
    def param(self) -> str:
        if self.i < 0:
            return self.field if self.j is None else f"{self.field}[{self.j}]"
        base = f"messages[{self.i}].{self.field}"
        if self.field == "tool_calls":
            return f"{base}[{self.j}].function.arguments"
        if self.j is not None:
            return f"{base}[{self.j}].text"
        return base


@dataclass(slots=True)
class Facts:
    n_messages: int = 0
    images: list[tuple[int, int]] = field(default_factory=list)  # (message, part) in history order
    spots: list[Spot] = field(default_factory=list)
    ascii_bytes: int = 0  # text in ASCII-only strings
    other_bytes: int = 0  # UTF-8 bytes of text in strings with any non-ASCII character
    texts: list[str] = field(default_factory=list)  # the strings counted (references, not copies)
    n_tool_calls: int = 0
    token_ids: int = 0  # /v1/completions prompts given as token ids: exact counts

    @property
    def text_bytes(self) -> int:
        return self.ascii_bytes + self.other_bytes


class _Finder:
    """Finds the first placeholder token in a string, skipping impossible searches cheaply."""

    __slots__ = ("all", "ascii")

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self.all = tokens
        self.ascii = tuple(t for t in tokens if t.isascii())

    def first(self, s: str) -> str | None:
        for t in (self.ascii if s.isascii() else self.all):
            if t in s:
                return t
        return None


def joined(history: Facts, new: Facts) -> Facts:
    """The facts of a history's messages followed by those of the messages after it (scan_chat's
    `start`); neither is changed."""
    return Facts(n_messages=new.n_messages, images=history.images + new.images, spots=history.spots + new.spots,
                 ascii_bytes=history.ascii_bytes + new.ascii_bytes, other_bytes=history.other_bytes + new.other_bytes,
                 texts=history.texts + new.texts, n_tool_calls=history.n_tool_calls + new.n_tool_calls)


def scan_chat(body: dict[str, Any], *, images: bool, tokens: tuple[str, ...], text: bool,
              engine: str = "openai", start: int = 0, request_level: bool = True) -> Facts:
    """The facts of messages[start:] (indices as in the whole list), and of the request-level
    parts (tools) unless `request_level` is False."""
    messages = body.get("messages")
    f = Facts()
    if not isinstance(messages, list):
        return f
    f.n_messages = len(messages)
    finder = _Finder(tokens) if tokens else None
    ph_all = finder.all if finder else ()
    ph_ascii = finder.ascii if finder else ()
    ascii_bytes = other_bytes = n_calls = 0
    texts = f.texts
    spots = f.spots
    image_at = f.images

    strings = text or finder is not None  # anything to learn from the strings beyond content parts?
    for i in range(start, len(messages)):
        m = messages[i]
        if m.__class__ is not dict:
            continue
        c = m.get("content")
        if c.__class__ is str:
            if text:
                texts.append(c)
                if c.isascii():
                    ascii_bytes += len(c)
                else:
                    other_bytes += len(c.encode("utf-8", "surrogatepass"))
            if finder is not None and c:
                for tok in (ph_ascii if c.isascii() else ph_all):
                    if tok in c:
                        spots.append(Spot(i, "content", None, tok))
                        break
            if len(m) == 2 and "role" in m:
                continue  # {role, content}: no reasoning, no tool calls (the commonest shape of a long history)
        elif c.__class__ is list:
            for j, p in enumerate(c):
                if p.__class__ is not dict:
                    continue
                kind = p.get("type")
                if kind == "text" or kind == "input_text":
                    if not strings:
                        continue
                    s = p.get("text")
                    if s.__class__ is not str:
                        continue
                    if text:
                        texts.append(s)
                        if s.isascii():
                            ascii_bytes += len(s)
                        else:
                            other_bytes += len(s.encode("utf-8", "surrogatepass"))
                    if finder is not None and s:
                        for tok in (ph_ascii if s.isascii() else ph_all):
                            if tok in s:
                                spots.append(Spot(i, "content", j, tok))
                                break
                elif images and kind in IMAGE_PART_TYPES:
                    image_at.append((i, j))
        if not strings:
            continue
        # Only the reasoning field the lane's engine renders (render/normalize.py): vLLM prefers
        # `reasoning`, SGLang ignores it; a placeholder in a field the engine drops breaks nothing.
        rfield = reasoning_field(m, engine) if ("reasoning" in m or "reasoning_content" in m) else None
        s = m.get("reasoning_content") if rfield == "reasoning_content" else None
        if s.__class__ is str and s:
            if text:
                texts.append(s)
                if s.isascii():
                    ascii_bytes += len(s)
                else:
                    other_bytes += len(s.encode("utf-8", "surrogatepass"))
            if finder is not None:
                for tok in (ph_ascii if s.isascii() else ph_all):
                    if tok in s:
                        spots.append(Spot(i, "reasoning_content", None, tok))
                        break
        s = m.get("reasoning") if rfield == "reasoning" else None
        if s.__class__ is str and s:
            if text:
                texts.append(s)
                if s.isascii():
                    ascii_bytes += len(s)
                else:
                    other_bytes += len(s.encode("utf-8", "surrogatepass"))
            if finder is not None:
                for tok in (ph_ascii if s.isascii() else ph_all):
                    if tok in s:
                        spots.append(Spot(i, "reasoning", None, tok))
                        break
        calls = m.get("tool_calls")
        if calls.__class__ is list and calls:
            n_calls += len(calls)
            for j, call in enumerate(calls):
                fn = call.get("function") if call.__class__ is dict else None
                if fn.__class__ is not dict:
                    continue
                args = fn.get("arguments")
                if args.__class__ is dict:
                    args = orjson.dumps(args).decode()
                elif args.__class__ is not str:
                    continue
                if text:
                    texts.append(args)
                    if args.isascii():
                        ascii_bytes += len(args)
                    else:
                        other_bytes += len(args.encode("utf-8", "surrogatepass"))
                    name = fn.get("name")
                    if name.__class__ is str:
                        ascii_bytes += len(name)
                if finder is not None and args:
                    for tok in (ph_ascii if args.isascii() else ph_all):
                        if tok in args:
                            spots.append(Spot(i, "tool_calls", j, tok))
                            break
    f.n_tool_calls = n_calls

    tools = body.get("tools") if request_level else None
    if tools and (text or finder is not None):
        s = orjson.dumps(tools).decode()
        if text:
            texts.append(s)
            if s.isascii():
                ascii_bytes += len(s)
            else:
                other_bytes += len(s.encode("utf-8", "surrogatepass"))
        if finder is not None:
            for tok in (ph_ascii if s.isascii() else ph_all):
                if tok in s:
                    spots.append(Spot(-1, "tools", None, tok))
                    break
    f.ascii_bytes = ascii_bytes
    f.other_bytes = other_bytes
    return f


def scan_prompt(body: dict[str, Any], *, tokens: tuple[str, ...], text: bool) -> Facts:
    """/v1/completions: `prompt` is a string, a list of strings, token ids, or a list of token id lists."""
    f = Facts()
    prompt = body.get("prompt")
    finder = _Finder(tokens) if tokens else None
    items: list[tuple[int | None, Any]]
    if isinstance(prompt, str):
        items = [(None, prompt)]
    elif isinstance(prompt, list):
        if prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            f.token_ids = len(prompt)
            return f
        items = list(enumerate(prompt))
    else:
        return f
    # Several prompts are several requests to the engine: the window applies to the largest one.
    best: tuple[int, int, str] | None = None  # (bytes, ascii?, text)
    for j, s in items:
        if isinstance(s, list):
            f.token_ids = max(f.token_ids, len(s))
            continue
        if not isinstance(s, str):
            continue
        if text:
            n = len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))
            if best is None or n > best[0]:
                best = (n, s.isascii(), s)
        if finder is not None:
            tok = finder.first(s)
            if tok is not None:
                f.spots.append(Spot(-1, "prompt", j, tok))
    if best is not None:
        f.texts.append(best[2])
        if best[1]:
            f.ascii_bytes = best[0]
        else:
            f.other_bytes = best[0]
    return f
