"""Compare a turn's render with the previous turn's render plus its output; name why they differ.

The comparison walks per-segment digests (one per rendered message) and only looks at tokens in
the first segment that differs, so a 480K-token turn costs a few microseconds per message. The
cause is read from the render's provenance: the field and message the first differing character
comes from (BOS, effort line, tools block, a message's content, reasoning, tool calls, a tool
result inside a merged group, the generation header), what differs there between the two
requests, and what the template dropped in each render. Nothing is assumed: when nothing at that
source differs, the cause is `unknown` and the alert carries both snippets.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Callable, Sequence

from ..render.result import Rendered, Segment
from .state import ROLE_CODES, MessagePrints, SegmentPrints, TurnPrint

TokensOf = Callable[[int, int], Sequence[int] | None]  # (segment digest, text length) -> cached token ids

ROLE_SYSTEM = ROLE_CODES["system"]
ROLE_ASSISTANT = ROLE_CODES["assistant"]
ROLE_TOOL = ROLE_CODES["tool"]
ROLE_USER = ROLE_CODES["user"]
ROLE_DEVELOPER = ROLE_CODES["developer"]


@dataclass
class Comparison:
    lcp_tokens: int
    old_tokens: int  # previous prompt + generated output
    new_tokens: int
    stable: bool  # the new render starts with all of the previous render + output
    segment: int | None  # index of the first differing segment in the new render
    token_offset: int  # first differing token, counted from that segment's start
    exact: bool  # False when the old segment's tokens were no longer cached (segment precision)
    first_segment: int | None = None  # the first segment whose digest differs (the break is at or after it)


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


def compare(old: TurnPrint, new: Rendered, tokens_of: TokensOf, prints: SegmentPrints | None = None) -> Comparison:
    """`prints`: the new render's segment prints, when the caller has them (segment_prints(new.segments))."""
    old_segs = _concat(old.segments, old.generated)
    new_segs = new.segments
    if prints is None:
        prints = SegmentPrints([s.digest for s in new_segs], [len(s.token_ids) for s in new_segs],
                               [len(s.text) for s in new_segs])
    old_total = old_segs.total_tokens()
    new_total = prints.total_tokens()
    m = min(len(old_segs.digests), len(new_segs))
    i = _first_difference(old_segs, prints, m)  # segments before i are the same text
    pos = sum(old_segs.tokens[:i])
    if i < m:
        old_ids = _tokens_from(old_segs, i, tokens_of)
        if old_ids is None:
            return Comparison(pos, old_total, new_total, False, i, 0, False, i)
        new_ids = _tokens_of_new(new_segs, i)
        k = common_prefix(old_ids, new_ids)
        stable = k >= len(old_ids) and pos + k >= old_total
        seg_index, offset = _locate(new_segs, i, k)
        return Comparison(pos + k, old_total, new_total, stable, None if stable else seg_index, offset, True, i)
    if len(new_segs) > m:  # every old segment is there, and more follow
        return Comparison(old_total, old_total, new_total, True, None, 0, True)
    # The new render is a prefix of the old one (a retry, or the last answer dropped).
    return Comparison(new_total, old_total, new_total, pos >= old_total, None if pos >= old_total else len(new_segs),
                      0, True)


def _first_difference(old: SegmentPrints, new: SegmentPrints, m: int) -> int:
    """The first of the leading `m` segments whose digest or text length differs (m: none does),
    by slice comparisons: a long session's turn compared in C, not segment by segment in Python."""
    od, ol, nd, nl = old.digests, old.lengths, new.digests, new.lengths
    if od[:m] == nd[:m] and ol[:m] == nl[:m]:
        return m
    lo, hi = 0, m  # [lo, hi) holds a difference
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if od[lo:mid] == nd[lo:mid] and ol[lo:mid] == nl[lo:mid]:
            lo = mid
        else:
            hi = mid
    for k in range(lo, hi):
        if od[k] != nd[k] or ol[k] != nl[k]:
            return k
    return hi


def old_tokens_at(old: TurnPrint, tokens_of: TokensOf, position: int, n: int) -> list[int]:
    """Up to `n` token ids of the previous render + output from absolute `position` (if still cached)."""
    prints = _concat(old.segments, old.generated)
    out: list[int] = []
    pos = 0
    for j in range(len(prints.digests)):
        t = prints.tokens[j]
        if pos + t > position:
            ids = tokens_of(prints.digests[j], prints.lengths[j])
            if ids is None:
                break
            out.extend(list(ids)[max(0, position - pos):])
            if len(out) >= n:
                break
            position = pos + t
        pos += t
    return out[:n]


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
    """Name the cause of a drift from the render's provenance: the field and message the first differing
    character comes from (Rendered.source_at), and what differs there between the two requests. When
    nothing there differs, the cause is `unknown`: an honest unknown beats a confident wrong cause.

    The index is the message whose span in the new render holds the first differing character (a
    merged user/tool group's first member, as the golden turn pairs define it); the cause is read from
    the member the character renders."""
    if cmp.segment is None or cmp.segment >= len(rendered.segments):
        return Divergence("regenerated" if cmp.new_tokens < cmp.old_tokens else "unknown", None, None)
    si, offset = _char_at(rendered.segments, cmp.segment, char_offset)
    seg = rendered.segments[si]
    mi = max(seg.message_index, 0)
    fld, member = rendered.source_at(si, offset)
    first = si == 0 or seg.message_index <= 0
    if new.rewritten:
        return Divergence(new.rewritten.get("cause", "history_edited"), new.rewritten.get("message_index", mi), fld)
    # Request-level parts: the effort line and the header at the very start, the tools and
    # response-format blocks of the (possibly inserted) system message.
    if rendered.exact and first and new.thinking != old.thinking \
            and fld in (None, "bos", "header", "effort", "content", "generation_header"):
        return Divergence("thinking_toggled", mi, "thinking")
    if fld == "effort":
        return Divergence("effort_changed", mi, "reasoning_effort") if new.effort != old.effort \
            else Divergence("unknown", mi, "reasoning_effort")
    boundary = (cmp.first_segment is not None and cmp.first_segment < si
                and (offset == 0 or (si == cmp.segment and cmp.token_offset == 0)))
    if boundary:
        # The old render of an earlier segment was longer: what it had at its end is what changed
        # (tools removed from the system message, a message deleted after it, ...).
        prev = rendered.segments[cmp.first_segment]  # type: ignore[index]
        fld, member = rendered.source_at(cmp.first_segment, max(0, len(prev.text) - 1))  # type: ignore[arg-type]
        first = first or cmp.first_segment == 0 or prev.message_index <= 0
        fld = None if fld in ("content", "tool_result") else fld
    tools_moved = new.tools_digest != old.tools_digest
    rf_moved = new.response_format_digest != old.response_format_digest
    # The tools and response-format blocks close the first rendered item (an inserted system message, or
    # whatever renders first): a break there, outside any message's own text, is theirs when they changed.
    request_part = first and (member <= 0 or fld in (None, "bos", "header", "effort"))
    if fld in ("tools", "response_format") or (request_part and fld != "content" and (tools_moved or rf_moved)):
        # Both sides of the character: where the new render has the response format, the old one may
        # have had the tools block that is gone now.
        if tools_moved and (fld != "response_format" or not rf_moved or not new.tools_digest):
            return Divergence("tools_changed", mi, "tools")
        if rf_moved:
            return Divergence("response_format_changed", mi, "response_format")
        return Divergence("unknown", mi, fld)
    old_msgs = _concat_messages(old.messages, old.generated_message)
    m = max(member, 0)
    if fld == "generation_header" or fld is None:
        # The header after a user turn belongs to what follows: the template switches it to
        # "</think>" when it drops the next assistant's reasoning (and deletes developer messages).
        end = m
        while end + 1 < len(new.messages) and new.messages.roles[end + 1] in (ROLE_USER, ROLE_TOOL) \
                and new.messages.roles[m] in (ROLE_USER, ROLE_TOOL):
            end += 1
        k = end + 1
        while k < len(new.messages):
            if _template_dropped(old, rendered, new.messages, k):
                return Divergence("reasoning_dropped_by_template", mi, "reasoning_content")
            if new.messages.roles[k] != ROLE_DEVELOPER:
                break
            k += 1
    if m >= len(old_msgs) or m >= len(new.messages):
        return Divergence("history_edited", mi, fld)
    if not _same_message(old_msgs, new.messages, m):
        d = _message_cause(old_msgs, new.messages, m, fld)
        return Divergence(d.cause, mi, d.field)
    if fld in ("reasoning_content", "think_end", None) and _template_dropped(old, rendered, new.messages, m):
        return Divergence("reasoning_dropped_by_template", mi, "reasoning_content")
    # The message itself is unchanged: the difference starts where the next one begins.
    nxt = m + 1
    if nxt < len(new.messages) or nxt < len(old_msgs):
        if nxt >= len(old_msgs) or nxt >= len(new.messages) or not _same_message(old_msgs, new.messages, nxt):
            if nxt < len(old_msgs) and nxt < len(new.messages):
                d = _message_cause(old_msgs, new.messages, nxt, None)
                return Divergence(d.cause, mi, d.field)
            return Divergence("history_edited", mi, fld)
    return Divergence("unknown", mi, fld)


def _char_at(segs: list[Segment], i: int, offset: int) -> tuple[int, int]:
    """(segment, offset in it) of the character `offset` characters after segment i's start: a token
    that straddles two segments puts the first differing character in the next one."""
    while offset >= len(segs[i].text) and i + 1 < len(segs):
        offset -= len(segs[i].text)
        i += 1
    return i, min(offset, max(0, len(segs[i].text) - 1))


def _template_dropped(old: TurnPrint, rendered: Rendered, msgs: MessagePrints, k: int) -> bool:
    """Did the template drop message k's reasoning (or the developer message k) in the new render but
    not in the old one?"""
    role = msgs.roles[k]
    if role == ROLE_ASSISTANT:
        return rendered.dropped[0] > k and not old.dropped[0] > k
    if role == ROLE_DEVELOPER:
        return rendered.dropped[1] > k and not old.dropped[1] > k
    return False


def _message_cause(old: MessagePrints, new: MessagePrints, i: int, fld: str | None) -> Divergence:
    if old.roles[i] != new.roles[i]:
        return Divergence("history_edited", i, fld)
    if new.roles[i] == ROLE_SYSTEM and old.content[i] != new.content[i]:
        return Divergence("system_prompt_changed", i, "content")
    if new.images[i] < old.images[i]:
        return Divergence("image_removed", i, "content")
    if new.roles[i] == ROLE_TOOL:
        cause = _tool_group_cause(old, new, i)
        return Divergence(cause or "history_edited", i, fld or "content")
    if new.roles[i] == ROLE_ASSISTANT:
        # Several parts of one message may differ: the cause is the part at the first differing
        # character (the template renders reasoning, then content, then tool calls).
        only_reasoning = old.content[i] == new.content[i] and old.tool_calls[i] == new.tool_calls[i]
        if old.reasoning[i] != new.reasoning[i] and (only_reasoning or fld in ("reasoning_content", "think_end")):
            empty = new.reasoning[i] == 0
            return Divergence("client_stripped_reasoning" if empty else "history_edited", i, "reasoning_content")
        if old.tool_calls[i] != new.tool_calls[i] and (old.content[i] == new.content[i] or fld == "tool_calls"):
            return Divergence("history_edited", i, "tool_calls")
    return Divergence("history_edited", i, fld or "content")


def _tool_group_cause(old: MessagePrints, new: MessagePrints, i: int) -> str | None:
    """Tool results merged into one user turn: the same results in another order?"""
    def group(p: MessagePrints) -> list[tuple[int, int]]:
        j = i
        while j > 0 and p.roles[j - 1] == ROLE_TOOL:
            j -= 1
        out = []
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
