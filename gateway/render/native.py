"""The packaged DeepSeek-V4.1 template's `render_item` macro, in Python, for the messages it renders plainly.

Why: a new long conversation calls the macro once per message, and each call in Jinja's sandbox is
costly (attribute checks on every `c.x` and `m['x']`, a marked string to split again): the macro was
most of such a render. Here an item is a few string joins.

When: only for a template whose macros (`_part`, `_text`, `render_item`) are, character for
character, the ones this function was written from (`for_source`: their digest), and only for items
of the plain shapes: text content, arguments already parsed to objects, tools as objects. Anything else
(content parts, images, a placeholder token in the text, tool results the template must sort, a
message the macro would refuse) returns None and the macro renders it, with its own errors. Tests render
every item both ways (tests/test_render_native.py) and the whole prompt against the full template.
GATEWAY_RENDER_NATIVE=0 always calls the macro (an A/B).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import xxhash

# xxh64 of the template text from `{%- macro _part(` through the `{%- endmacro -%}` closing `render_item`.
# The packaged deepseek_v4.1.jinja's; an edit of those macros turns this path off until it is reviewed and
# this digest updated (tests/test_render_native.py says so).
MACROS_DIGEST = 0x99A4B50EAE7C80DA
_START = "{%- macro _part("
_END_OF_ITEM = "{%- endmacro -%}\n\n{#- ====="

IMAGE = "<｜deepseek_image｜>"
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
SYSTEM = "<｜System｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
TOOLS_HEAD = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n"
    "</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString "
    "parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled "
    "(triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool "
    "calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
RF_HEAD = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"

Fields = tuple[tuple[str, int, int], ...]
ItemRender = Callable[[str, int, list, dict], "tuple[str, Fields] | None"]


def _macros(source: str) -> str | None:
    start = source.find(_START)
    end = source.find(_END_OF_ITEM, start)
    return source[start:end + len("{%- endmacro -%}")] if start >= 0 and end >= 0 else None


def _digest(source: str) -> int | None:
    macros = _macros(source)
    return xxhash.xxh64_intdigest(macros.encode()) if macros is not None else None


# Settings.render_native (GATEWAY_RENDER_NATIVE), set as the process starts (process_switches.py); off,
# every item goes through the macro.
ENABLED = True


def for_source(source: str) -> ItemRender | None:
    """`render_item` in Python when `source`'s macros are the ones it reproduces, else None."""
    if not ENABLED:
        return None
    return render_item if _digest(source) == MACROS_DIGEST else None


def _tojson(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)  # template.py's tojson with its defaults


class _Plain(Exception):
    """Not a plain item: the macro renders it."""


def _text(c: Any) -> str:
    if type(c) is str:
        if IMAGE in c:
            raise _Plain
        return c
    if c is None:
        return ""
    raise _Plain


def render_item(role: str, idx: int, members: list, c: dict) -> tuple[str, Fields] | None:
    """(text, fields) as the macro renders them (its field markers read as spans), or None."""
    try:
        return _render(role, members, c)
    except (_Plain, KeyError, TypeError, AttributeError, IndexError):
        return None


def _render(role: str, members: list, c: dict) -> tuple[str, Fields]:
    parts: list[str] = []
    fields: list[tuple[str, int, int]] = []
    pos = 0

    def field(name: str, text: str) -> None:
        nonlocal pos
        parts.append(text)
        fields.append((name, pos, pos + len(text)))
        pos += len(text)

    def plain(text: str) -> None:
        nonlocal pos
        parts.append(text)
        pos += len(text)

    effort = c["effort"]
    if effort is not None and type(effort) is not int:
        raise _Plain
    if c["first"]:
        field("bos", BOS)
        if effort is not None or role == "system":
            field("header", SYSTEM)
        if effort is not None:
            field("effort", f"Reasoning Effort: {effort} (range 1-100, the higher the value, the more thorough the "
                            "reasoning)\n\n")
    if role == "system":
        if not c["first"]:
            field("header", SYSTEM)
        field("content", _text(members[0].get("content")))
        tools = c["tools"]
        if tools:
            if type(tools) is not list:
                raise _Plain
            schemas = []
            for t in tools:
                if type(t) is not dict or type(t.get("function")) is not dict:
                    raise _Plain
                schemas.append(_tojson(t["function"]))
            plain("\n\n")
            field("tools", TOOLS_HEAD + "\n".join(schemas) + TOOLS_TAIL)
        rf = c["rf"]
        if rf:
            plain("\n\n")
            field("response_format", RF_HEAD + _tojson(rf))
    elif role == "developer":
        text = _text(members[0].get("content"))
        if not text:
            raise _Plain
        field("header", USER)
        field("content", text)
    elif role == "user":
        field("header", USER)
        if sum(1 for mm in members if mm["role"] == "tool") > 1 and any(c["order"]):
            raise _Plain  # tool results the template sorts by their call's position
        nb = 0
        for mm in members:
            content = mm.get("content")
            if mm["role"] == "tool":
                if content is None:
                    raise _Plain
                if nb:
                    plain("\n\n")
                field("tool_result", "<tool_result>" + _text(content) + "</tool_result>")
            elif type(content) is str:
                if nb:
                    plain("\n\n")
                field("content", _text(content))
            else:
                raise _Plain
            nb += 1
    elif role == "assistant":
        m = members[0]
        if c["think"]:
            rc = m.get("reasoning_content")
            if rc is not None and type(rc) is not str:
                raise _Plain
            field("reasoning_content", rc or "")
            field("think_end", "</think>")
        field("content", _text(m.get("content")))
        calls = m.get("tool_calls")
        if calls:
            if type(calls) is not list:
                raise _Plain
            out = []
            for tc in calls:
                fn = tc["function"] if type(tc) is dict else None
                if type(fn) is not dict or type(fn.get("name")) is not str or type(fn.get("arguments")) is not dict:
                    raise _Plain
                params = []
                for k, v in fn["arguments"].items():
                    if type(k) is not str:
                        raise _Plain
                    if type(v) is str:
                        params.append('<｜DSML｜ parameter name="' + k + '" string="true">' + v +
                                      "</｜DSML｜ parameter>")
                    else:
                        params.append('<｜DSML｜ parameter name="' + k + '" string="false">' + _tojson(v) +
                                      "</｜DSML｜ parameter>")
                out.append('<｜DSML｜ invoke name="' + fn["name"] + '">\n' + "\n".join(params) + "\n</｜DSML｜ invoke>")
            plain("\n\n")
            field("tool_calls", "<｜DSML｜ calls>\n" + "\n".join(out) + "\n</｜DSML｜ calls>")
        field("eos", EOS)
    else:
        raise _Plain
    header = c["header"]
    if header:
        if type(header) is not str:
            raise _Plain
        field("generation_header", ASSISTANT + header)
    return "".join(parts), tuple(fields)
