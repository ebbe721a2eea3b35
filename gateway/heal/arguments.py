"""Tool-call arguments re-serialised by the client (key order, whitespace, escapes): the relayed string.

The engine parses the arguments and renders them in the order of their keys, so a client that sorts
keys (or pretty-prints, or escapes non-ASCII) changes the prompt. The repair applies when every call
matches its relayed call: same position, same function name, the same id (or none sent), and arguments
that parse to the same JSON value with the same types (canonical bytes equal). Anything else is a
history edit: the request goes as sent.
"""

from __future__ import annotations

from typing import Any

from .base import Relayed, Updates, canonical_args


class Arguments:
    name = "arguments"

    def plan(self, msg: dict[str, Any], relayed: Relayed) -> Updates | None:
        calls = msg.get("tool_calls")
        if not isinstance(calls, list) or len(calls) != len(relayed.calls) or not calls:
            return None
        out, changed = [], False
        for call, (rid, rname, rargs) in zip(calls, relayed.calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or fn.get("name") != rname:
                return None
            cid = call.get("id")
            if cid and rid and cid != rid:  # another call in this place: not ours to repair
                return None
            args = fn.get("arguments")
            if args == rargs:
                out.append(call)
                continue
            ours = canonical_args(rargs)
            if ours is None or canonical_args(args) != ours:
                return None
            out.append({**call, "function": {**fn, "arguments": rargs}})
            changed = True
        return {"tool_calls": out} if changed else None
