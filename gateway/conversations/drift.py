"""Compare a turn's render with the previous turn's render plus its output; name why they differ.

The comparison walks per-segment digests (one per rendered message) and only looks at tokens in
the first segment that differs, so a 480K-token turn costs a few microseconds per message. The
cause is read from what changed between the two requests at the message where the prefix moved,
and from what the template did with it: a message whose own fields are unchanged but whose
rendering changed was re-rendered by the template (reasoning dropped, generation header moved).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Callable, Sequence

from ..render.renderer import Rendered, Segment
from .state import ROLE_CODES, MessagePrints, SegmentPrints, TurnPrint

TokensOf = Callable[[int, int], Sequence[int] | None]  # (segment digest, text length) -> cached token ids

ROLE_SYSTEM = ROLE_CODES["system"]
ROLE_ASSISTANT = ROLE_CODES["assistant"]
ROLE_TOOL = ROLE_CODES["tool"]


@dataclass
class Comparison:
    lcp_tokens: int
    old_tokens: int  # previous prompt + generated output
    new_tokens: int
    stable: bool  # the new render starts with all of the previous render + output
    segment: int | None  # index of the first differing segment in the new render
    token_offset: int  # first differing token, counted from that segment's start
    exact: bool  # False when the old segment's tokens were no longer cached (segment precision)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences (C-speed slice compares, binary search)."""
    a = a if isinstance(a, array) else array("I", a)
    b = b if isinstance(b, array) else array("I", b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def compare(old: TurnPrint, new: Rendered, tokens_of: TokensOf) -> Comparison:
    old_segs = _concat(old.segments, old.generated)
    new_segs = new.segments
    old_total = old_segs.total_tokens()
    new_total = new.n_tokens
    pos = 0
    for i, seg in enumerate(new_segs):
        if i >= len(old_segs.digests):
            return Comparison(old_total, old_total, new_total, True, None, 0, True)
        if old_segs.digests[i] == seg.digest and old_segs.lengths[i] == len(seg.text):
            pos += old_segs.tokens[i]
            continue
        old_ids = _tokens_from(old_segs, i, tokens_of)
        if old_ids is None:
            return Comparison(pos, old_total, new_total, False, i, 0, False)
        new_ids = _tokens_of_new(new_segs, i)
        k = common_prefix(old_ids, new_ids)
        stable = k >= len(old_ids) and pos + k >= old_total
        seg_index, offset = _locate(new_segs, i, k)
        return Comparison(pos + k, old_total, new_total, stable, None if stable else seg_index, offset, True)
    # The new render is a prefix of the old one (a retry, or the last answer dropped).
    return Comparison(new_total, old_total, new_total, pos >= old_total, None if pos >= old_total else len(new_segs),
                      0, True)


def _concat(a: SegmentPrints, b: SegmentPrints) -> SegmentPrints:
    return SegmentPrints(a.digests + b.digests, a.tokens + b.tokens, a.lengths + b.lengths,
                         a.messages + b.messages, a.roles + b.roles)


def _tokens_from(prints: SegmentPrints, i: int, tokens_of: TokensOf, segments: int = 3) -> array | None:
    """Tokens of old segments i.. (a few: a difference is found near the segment start)."""
    out = array("I")
    for j in range(i, min(i + segments, len(prints.digests))):
        ids = tokens_of(prints.digests[j], prints.lengths[j])
        if ids is None:
            if j == i:
                return None
            break
        out.extend(ids if isinstance(ids, array) else array("I", ids))
    return out


def _tokens_of_new(segs: list[Segment], i: int, segments: int = 3) -> array:
    out = array("I")
    for seg in segs[i:i + segments]:
        ids = seg.token_ids
        out.extend(ids if isinstance(ids, array) else array("I", ids))
    return out


def _locate(segs: list[Segment], i: int, k: int) -> tuple[int, int]:
    """Which new segment holds token k counted from segment i's start, and the offset inside it."""
    j = i
    while j < len(segs) - 1 and k >= len(segs[j].token_ids):
        k -= len(segs[j].token_ids)
        j += 1
    return j, k


# -- causes ------------------------------------------------------------------------------------


@dataclass
class Divergence:
    cause: str
    message_index: int | None
    field: str | None


@dataclass
class NewTurn:
    """What the classifier needs to know about the new request besides its render."""

    messages: MessagePrints
    thinking: bool | None
    effort: int | str | None
    tools_digest: int
    response_format_digest: int
    rewritten: dict | None = None  # the gateway itself rewrote history (e.g. dropped images)


def field_at(seg: Segment, char_offset: int) -> str | None:
    best = None
    for name, start, end in seg.fields:
        if start <= char_offset < end:
            best = name  # the innermost (last listed) span wins
    return best


def classify(old: TurnPrint, new: NewTurn, rendered: Rendered, cmp: Comparison, char_offset: int) -> Divergence:
    """Name the cause of a drift at the segment the comparison found."""
    if cmp.segment is None or cmp.segment >= len(rendered.segments):
        return Divergence("regenerated" if cmp.new_tokens < cmp.old_tokens else "unknown", None, None)
    seg = rendered.segments[cmp.segment]
    mi = max(seg.message_index, 0)
    fld = field_at(seg, char_offset)
    if new.thinking != old.thinking:
        return Divergence("thinking_toggled", 0, "thinking")
    if new.effort != old.effort:
        return Divergence("effort_changed", 0, "reasoning_effort")
    if new.rewritten:
        return Divergence(new.rewritten.get("cause", "history_edited"), new.rewritten.get("message_index", mi), fld)
    if fld in ("tools",) or (new.tools_digest != old.tools_digest and mi == 0 and fld != "content"):
        return Divergence("tools_changed", 0, "tools")
    if fld == "response_format" or (new.response_format_digest != old.response_format_digest and mi == 0
                                     and fld != "content"):
        return Divergence("response_format_changed", 0, "response_format")
    old_msgs = _concat_messages(old.messages, old.generated_message)
    if mi >= len(old_msgs) or mi >= len(new.messages):
        return Divergence("history_edited", mi, fld)
    if _same_message(old_msgs, new.messages, mi):
        if seg.role == "tool" or new.messages.roles[mi] == ROLE_TOOL:
            cause = _tool_group_cause(old_msgs, new.messages, mi)
            if cause:
                return Divergence(cause, mi, fld)
        # Unchanged message, changed rendering: the template re-rendered it.
        return Divergence("reasoning_dropped_by_template" if old.thinking else "template_rerendered", mi, fld)
    return _message_cause(old_msgs, new.messages, mi, fld)


def _message_cause(old: MessagePrints, new: MessagePrints, i: int, fld: str | None) -> Divergence:
    if old.roles[i] != new.roles[i]:
        return Divergence("history_edited", i, fld)
    if new.roles[i] == ROLE_SYSTEM:
        return Divergence("system_prompt_changed", i, "content")
    if new.images[i] < old.images[i]:
        return Divergence("image_removed", i, "content")
    if new.roles[i] == ROLE_TOOL:
        cause = _tool_group_cause(old, new, i)
        return Divergence(cause or "history_edited", i, fld or "content")
    if new.roles[i] == ROLE_ASSISTANT and old.content[i] == new.content[i] and old.tool_calls[i] == new.tool_calls[i]:
        if old.reasoning[i] != new.reasoning[i]:
            empty = new.reasoning[i] == 0
            return Divergence("client_stripped_reasoning" if empty else "history_edited", i, "reasoning_content")
    return Divergence("history_edited", i, fld or "content")


def _tool_group_cause(old: MessagePrints, new: MessagePrints, i: int) -> str | None:
    """Tool results merged into one user turn: the same results in another order?"""
    def group(p: MessagePrints) -> list[tuple[int, int]]:
        out, j = [], i
        while j < len(p) and p.roles[j] == ROLE_TOOL:
            out.append((p.tool_call_ids[j], p.content[j]))
            j += 1
        return out

    a, b = group(old), group(new)
    if a != b and sorted(a) == sorted(b):
        return "tool_results_reordered" if all(tid for tid, _ in b) else "history_edited"
    return None


def _same_message(old: MessagePrints, new: MessagePrints, i: int) -> bool:
    return (i < len(old) and i < len(new) and old.roles[i] == new.roles[i] and old.content[i] == new.content[i]
            and old.reasoning[i] == new.reasoning[i] and old.tool_calls[i] == new.tool_calls[i]
            and old.tool_call_ids[i] == new.tool_call_ids[i] and old.images[i] == new.images[i])


def _concat_messages(a: MessagePrints, b: MessagePrints) -> MessagePrints:
    return MessagePrints(a.roles + b.roles, a.content + b.content, a.reasoning + b.reasoning,
                         a.tool_calls + b.tool_calls, a.tool_call_ids + b.tool_call_ids, a.images + b.images)
