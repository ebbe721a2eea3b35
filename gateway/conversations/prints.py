"""Compact fingerprints of renders and messages (see state.py for how they are stored)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Iterable

import orjson
import xxhash

from ..render.normalize import canonical
from ..render.result import Segment
from .state import ROLE_CODES, MessagePrints, SegmentPrints


def _d32(value: Any) -> int:
    """32-bit digest, 0 reserved for 'empty'."""
    if value is None or value == "" or value == b"" or value == []:
        return 0
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass") if isinstance(value, str) \
        else orjson.dumps(value)
    return xxhash.xxh32_intdigest(data) or 1


def _row(m: Any, engine: str) -> tuple[int, int, int, int, int, int]:
    """Field digests of a message as the lane's engine reads it (render/normalize.py): content as it
    renders, reasoning from the field the engine honours, tool-call arguments in the given key order
    (the template renders them in that order, so a reordering is a real change)."""
    c = canonical(m, engine)
    calls = b"\x1e".join(name.encode("utf-8", "surrogatepass") + b"\x1f" + args for _, name, args in c.tool_calls)
    return (ROLE_CODES.get(c.role, 0), _d32(c.content), _d32(c.reasoning), _d32(calls), _d32(c.tool_call_id),
            min(c.images, 65535))


# Rows of messages already seen, by the renderer's whole-message digest: an append-only turn of a
# 1,600-message session then costs a dictionary lookup per old message, not a re-hash of its text.
_memo: OrderedDict[tuple[int, str], tuple[int, int, int, int, int, int]] = OrderedDict()
_MEMO_MAX = 50_000  # ~6 MB: the messages of a few dozen long agent sessions
_memo_lock = threading.Lock()


def message_prints(messages: list[dict[str, Any]], digests: list[int] | None = None,
                   engine: str = "sglang") -> MessagePrints:
    rows = []
    if digests is None or len(digests) != len(messages):
        rows = [_row(m, engine) for m in messages]
    else:
        with _memo_lock:
            for m, d in zip(messages, digests):
                row = _memo.get((d, engine))
                if row is None:
                    row = _memo[(d, engine)] = _row(m, engine)
                    if len(_memo) > _MEMO_MAX:
                        _memo.popitem(last=False)
                rows.append(row)
    p = MessagePrints()
    if rows:
        p.roles, p.content, p.reasoning, p.tool_calls, p.tool_call_ids, p.images = (list(c) for c in zip(*rows))
    return p


def segment_prints(segments: Iterable[Segment]) -> SegmentPrints:
    # Column by column (one comprehension each), every append-only turn: cheaper than one loop
    # appending to five lists.
    segs = segments if isinstance(segments, list) else list(segments)
    role = ROLE_CODES.get
    return SegmentPrints([s.digest for s in segs], [len(s.token_ids) for s in segs], [len(s.text) for s in segs],
                         [s.message_index for s in segs], [role(s.role, 0) for s in segs])
