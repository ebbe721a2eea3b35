"""Where each character of a render comes from: the field span holding it and the request message that
span renders, down to the member of a merged user/tool item, in the order the template sorted them.

Only a drift's classification asks, so nothing is worked out while rendering: a render keeps the
groups, entries and plan it already has, and the question is answered from them when asked.
"""

from __future__ import annotations

from collections.abc import Sequence

from .cache import ItemEntry
from .plan import Item


def innermost(fields: Sequence[tuple[str, int, int]], pos: int) -> str | None:
    best = None
    for name, start, end in fields:
        if start <= pos < end:
            best = name  # the innermost (last listed) span wins
    return best


_MEMBER_FIELDS = ("content", "tool_result")


class Provenance:
    """Where each character of a render comes from; computed only when a drift is classified."""

    def __init__(self, groups: list[list[int]], items: list[ItemEntry], plan: list[Item], msgs: list[dict],
                 offset: int) -> None:
        self.groups, self.items, self.plan, self.msgs, self.offset = groups, items, plan, msgs, offset

    def source_at(self, segment: int, pos: int) -> tuple[str | None, int]:
        group = self.groups[segment]
        j = group[-1]
        for g in group:
            n = len(self.items[g].item.text)
            if pos < n:
                j = g
                break
            pos -= n
        ri, it = self.items[j].item, self.plan[j]
        name = innermost(ri.fields, pos)
        first = it.start - self.offset
        if it.end == it.start or (name is not None and name not in _MEMBER_FIELDS):
            return name, first
        # A merged group: the k-th content/tool_result span renders the k-th member in render order.
        spans = [(s, e) for n, s, e in ri.fields if n in _MEMBER_FIELDS]
        order = self.member_order(it)
        for k, (s, e) in enumerate(spans):
            if pos < e and k < len(order):
                return (name if s <= pos else None), order[k] - self.offset
        return name, first

    def member_order(self, it: Item) -> list[int]:
        """The members of a merged user/tool item in the order the template renders their spans."""
        msgs = self.msgs
        members = range(it.start, it.end + 1)
        tools = [k for k in members if msgs[k].get("role") == "tool"]
        if len(tools) > 1 and any(it.order):
            keyed = []
            for k in tools:
                key = 0
                for pos, cid in enumerate(it.order):
                    if cid and cid == msgs[k].get("tool_call_id"):
                        key = pos  # the template keeps the last match
                keyed.append((key, k))
            tools = [k for _, k in sorted(keyed, key=lambda t: t[0])]
        out, ti = [], 0
        for k in members:
            if msgs[k].get("role") == "tool":
                out.append(tools[ti])
                ti += 1
            else:
                c = msgs[k].get("content")
                if isinstance(c, str) or (isinstance(c, list) and len(c) > 0):
                    out.append(k)
        return out
