"""Tool results reordered by the client, without tool-call ids: the order that was forwarded before.

With ids the template sorts results by their call's position, so order never matters; without ids it
renders them as sent, so a client that reorders them (sorts, or gathers parallel results in the order
they finished) changes the prompt. The gateway remembers, per conversation, the order in which it
forwarded each id-less group (the results after one assistant message with calls); a later request
whose group holds the same results in another order gets that order back. Unambiguous only: one result
per call, no two results with the same text, the same set of results; otherwise it goes as sent.
"""

from __future__ import annotations

from typing import Any

import xxhash

from ..conversations.identity import text_bytes


def id_less_groups(messages: list[Any], assistants: list[int]) -> list[tuple[int, int, int]]:
    """(assistant index, first, end) of each run of tool results without ids after an assistant with calls."""
    out = []
    n = len(messages)
    for a in assistants:
        calls = messages[a].get("tool_calls")
        if not isinstance(calls, list) or len(calls) < 2:
            continue
        j = a + 1
        while j < n and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
            j += 1
        if j - (a + 1) >= 2 and not any(messages[k].get("tool_call_id") for k in range(a + 1, j)):
            out.append((a, a + 1, j))
    return out


def _digest(msg: dict[str, Any]) -> int:
    return xxhash.xxh64_intdigest(text_bytes(msg.get("content")))


class ToolResultOrder:
    name = "tool_result_order"

    def heal(self, messages: list[Any], group: tuple[int, int, int],
             forwarded: dict[int, tuple[int, ...]], repair: bool = True) -> bool:
        """Put the group back in the order it was forwarded in (in place); remember the order forwarded."""
        a, start, end = group
        results = messages[start:end]
        digests = tuple(_digest(m) for m in results)
        before = forwarded.get(a)
        ncalls = len(messages[a].get("tool_calls") or ())
        if (not repair or before is None or before == digests or len(digests) != ncalls
                or len(set(digests)) != len(digests) or sorted(before) != sorted(digests)):
            forwarded[a] = digests
            return False
        by_digest = dict(zip(digests, results))
        messages[start:end] = [by_digest[d] for d in before]
        return True
