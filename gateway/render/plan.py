"""The plan of a request: which messages render as one item (a run of user and tool messages merges into
one user turn) and each item's context (first or not, thinking, generation header, tool-call order).

It mirrors the template's top level exactly, so that rendering item by item through the template's
`render_item` macro gives the bytes of the whole render, and an item whose messages and context are
unchanged need not be rendered again. `Resume` lets a conversation's next turn keep the items whose
context cannot have changed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

# The generation headers `plan` gives an item (None: no model turn follows it); all are special tokens.
HEADERS = (None, "<think>", "</think>")


def _tool_call_id(tc: Any) -> Any:
    if not isinstance(tc, dict):
        return ""
    fn = tc.get("function")
    return tc.get("id") or (fn.get("id", "") if isinstance(fn, dict) else "")


@dataclass
class Item:
    role: str  # template role: system | developer | user (merged user/tool run) | assistant
    start: int  # position in the effective message list (with an inserted system at 0)
    end: int  # inclusive
    first: bool
    think: bool
    header: str | None
    order: tuple  # preceding assistant's tool_call ids (only kept when it can matter)


def plan(roles: list[str], msgs: list[dict], thinking: bool, eff_drop: bool,
         agp: bool = True, resume: "Resume | None" = None) -> tuple[list[Item], int, int]:
    """Items and their context, exactly as the template's top level computes them; with what the
    template drops: (items, assistants up to this index lose their reasoning, developer messages
    before this index are deleted), both -1 when nothing is dropped.

    `resume`: the previous turn's plan of the same conversation, whose first messages are unchanged:
    its items are kept up to where their context could differ (see Resume), and the walk goes on
    from there."""
    n = len(roles)
    last_ul = -1
    for k in range(n - 1, -1, -1):
        r = roles[k]
        if r == "user" or r == "tool" or r == "developer" or (r == "system" and k > 0):
            last_ul = k
            break

    if eff_drop:
        drop = [r == "developer" and k < last_ul for k, r in enumerate(roles)]
    else:
        drop = None
    first_kept = next((k for k in range(n) if not drop[k]), -1) if drop else 0
    last_ul2 = -1 if (last_ul >= 0 and last_ul == first_kept and roles[last_ul] == "system") else last_ul

    items: list[Item] = []
    last_tc = -1  # the latest assistant message with tool_calls
    started = False
    k = 0
    if resume is not None:
        kept = resume.kept(last_ul2, eff_drop)
        if kept:
            items = resume.items[:kept]
            started = True
            k = items[-1].end + 1
            for j in range(k - 1, -1, -1):
                if roles[j] == "assistant":
                    tcs = msgs[j].get("tool_calls")
                    if tcs and isinstance(tcs, list):
                        last_tc = j
                        break
    think_hdr = "<think>" if thinking else "</think>"
    while k < n:
        r = roles[k]
        end = k
        if r == "user" or r == "tool":
            while end + 1 < n and (roles[end + 1] == "user" or roles[end + 1] == "tool"):
                end += 1
        if drop is None or not drop[k]:
            j = end + 1
            if drop is not None:
                while j < n and drop[j]:
                    j += 1
            nxt = roles[j] if j < n else None
            first = not started
            userlike = r == "user" or r == "tool" or r == "developer" or (r == "system" and not first)
            header = None
            if userlike and (nxt == "assistant" or (nxt is None and agp)):
                header = think_hdr if (not eff_drop or end >= last_ul2) else "</think>"
            think = r == "assistant" and thinking and (not eff_drop or k > last_ul2)
            item_order: tuple = ()
            if end > k and last_tc >= 0:
                n_tool = 0
                for j in range(k, end + 1):
                    if roles[j] == "tool":
                        n_tool += 1
                if n_tool > 1:
                    order = tuple(_tool_call_id(tc) for tc in msgs[last_tc]["tool_calls"])
                    if any(order):
                        item_order = order
            items.append(Item("user" if r == "tool" else r, k, end, first, think, header, item_order))
            started = True
        if r == "assistant":
            tcs = msgs[k].get("tool_calls")
            if tcs and isinstance(tcs, list):
                last_tc = k
        k = end + 1
    if not eff_drop:
        return items, -1, -1
    return items, last_ul2, last_ul


@dataclass
class Resume:
    """The previous plan of a conversation whose first `unchanged` effective messages are unchanged.

    An item's context depends on the messages before it (first, the latest tool calls), on the next
    kept message's role (its generation header), and, when reasoning is dropped, on where the last
    user-like message is (`last_ul2`: header and think flags, and which developer messages are
    dropped). So an old item is kept when the item after it starts before the unchanged messages
    end and before both turns' `last_ul2`: everything its context reads is then the same."""

    items: list[Item]
    unchanged: int
    last_ul2: int  # of the previous plan (-1: none, or nothing dropped)

    used: int = 0  # items kept (set by plan)

    def kept(self, last_ul2: int, eff_drop: bool) -> int:
        h = min(self.unchanged, self.last_ul2, last_ul2) if eff_drop else self.unchanged
        before = bisect.bisect_left(self.items, h, key=start)  # items starting before h
        self.used = max(0, before - 1)
        return self.used


def start(it: Item) -> int:
    return it.start
