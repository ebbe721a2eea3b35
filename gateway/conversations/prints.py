"""Compact fingerprints of renders and messages (see state.py for how they are stored)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Iterable

import orjson
import xxhash

from ..render.renderer import Segment
from .state import ROLE_CODES, MessagePrints, SegmentPrints

IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})


def _d32(value: Any) -> int:
    """32-bit digest, 0 reserved for 'empty'."""
    if value is None or value == "" or value == []:
        return 0
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else orjson.dumps(
        value, option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh32_intdigest(data) or 1


def _tool_calls(calls: Any) -> int:
    if not calls:
        return 0
    canon = []
    for call in calls:
        fn = (call.get("function") or {}) if isinstance(call, dict) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = orjson.loads(args) if args.strip() else {}
            except orjson.JSONDecodeError:
                pass
        canon.append([fn.get("name"), args])
    return _d32(canon)


def _images(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") in IMAGE_PARTS)


def _row(m: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    return (ROLE_CODES.get(str(m.get("role")), 0), _d32(m.get("content")),
            _d32(m.get("reasoning_content") or m.get("reasoning")), _tool_calls(m.get("tool_calls")),
            _d32(m.get("tool_call_id")), min(_images(m.get("content")), 65535))


# Rows of messages already seen, by the renderer's whole-message digest: an append-only turn of a
# 1,600-message session then costs a dictionary lookup per old message, not a re-hash of its text.
_memo: OrderedDict[int, tuple[int, int, int, int, int, int]] = OrderedDict()
_MEMO_MAX = 50_000  # ~6 MB: the messages of a few dozen long agent sessions
_memo_lock = threading.Lock()


def message_prints(messages: list[dict[str, Any]], digests: list[int] | None = None) -> MessagePrints:
    rows = []
    if digests is None or len(digests) != len(messages):
        rows = [_row(m) for m in messages]
    else:
        with _memo_lock:
            for m, d in zip(messages, digests):
                row = _memo.get(d)
                if row is None:
                    row = _memo[d] = _row(m)
                    if len(_memo) > _MEMO_MAX:
                        _memo.popitem(last=False)
                rows.append(row)
    p = MessagePrints()
    if rows:
        p.roles, p.content, p.reasoning, p.tool_calls, p.tool_call_ids, p.images = (list(c) for c in zip(*rows))
    return p


def segment_prints(segments: Iterable[Segment]) -> SegmentPrints:
    p = SegmentPrints()
    for s in segments:
        p.digests.append(s.digest)
        p.tokens.append(len(s.token_ids))
        p.lengths.append(len(s.text))
        p.messages.append(s.message_index)
        p.roles.append(ROLE_CODES.get(s.role, 0))
    return p
