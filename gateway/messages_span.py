"""A large chat body read in three parts, so that its `messages` array's own bytes are known.

The hot path forwards a first-seen 2 MB body with its messages untouched; re-serialising them cost
~1.3 ms of the event loop per request (orjson.dumps into a fresh 2 MB buffer, measured in place by
bench/steps.py), where copying the client's bytes of the array costs a memcpy. That needs the
array's exact byte span, found without a second pass over 2 MB:

    {"model": "m", "messages": [ m0, ..., mk ], "max_tokens": 16}
    |-- prefix P ------------|  |-- array S --|  |-- tail T ---|

- the '[' : the first `"messages"` key whose prefix, closed with `]}`, parses: it is then a
  top-level member's value (a string or a nested object cannot be closed that way);
- the ']' : a guess from the end, reading the tail backwards (strings and brackets only; a quote
  is a string's end unless an odd run of backslashes precedes it, which is exact for valid JSON)
  up to the last top-level array whose elements have a "role" key (tools, stop lists and the like
  are skipped whole when they close within the window);
- the proof: S parses alone (so it is one JSON value: an array ends at its matching bracket, so a
  wrong ']' cannot parse), P + `[]` + T parses to an object, and no later top-level `messages` key
  replaces ours. Then the body's parse is that object with S's value at our key, in the same key
  order: JSON is read left to right and S sits where a value goes.

S is parsed inside `_WRAP` extra brackets so that the depth limits stay those of today: orjson
reads 1,024 levels and writes 254, and a body whose messages nest deeper than the writer allows was
refused ("nested too deeply to forward"); the wrapped parse fails exactly then (checked in
tests/test_history_memo.py), and the caller falls back to the whole parse, which refuses it as
before. Anything unexpected (a second `messages` key, broken JSON, a tail longer than the window)
is None: the caller parses the whole body, as before; the only extra cost is the wasted attempt.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# Tail read backwards: string tokens and brackets, on the reversed bytes. A reversed string ends at a
# quote that is not followed (in reversed order) by an odd run of backslashes.
_REV_TOKEN = re.compile(rb'"(?:[^"]++|"(?=(?:\\\\)*+\\(?!\\)))*+"|[\[\]{}]')
_ROLE_REV = b'"elor"'  # "role", reversed
WINDOW = 64 * 1024  # bytes read backwards from the end; a longer last message or tail: no span
_KEY_TRIES = 4  # `"messages"` occurrences tried for the '[' (a nested one before it: rare)
_PREFIX_MAX = 64 * 1024  # ... within this many bytes of the start
# orjson.loads fails beyond 1,024 levels, orjson.dumps beyond 254: a messages array of depth d is
# written inside the body's object (d + 1 levels), so it must be that d + 1 <= 254; wrapped in _WRAP
# brackets the parse fails iff d + _WRAP > 1024, i.e. exactly when d > 253.
_WRAP = 1025 - 254
_OPEN = b"[" * _WRAP
_CLOSE = b"]" * _WRAP
_WS = b" \t\r\n"


def split(body: bytes) -> tuple[dict[str, Any], int, int] | None:
    """(orjson.loads(body), offset of the messages array's '[', offset of its ']'), or None."""
    bracket = _open(body)
    if bracket < 0:
        return None
    close = _close_guess(body, bracket)
    if close < 0:
        return None
    prefix, tail = body[:bracket], body[close + 1:]
    try:
        data = orjson.loads(prefix + b"[]" + tail)
        if type(data) is not dict or data.get("messages") != []:
            return None
        if b"messages" in tail or b"\\" in tail:
            # A later top-level "messages" key (perhaps written with escapes) would win over ours.
            probe = orjson.loads(prefix + b"0" + tail)
            if type(probe.get("messages")) is not int:
                return None
        wrapped = orjson.loads(b"".join((_OPEN, memoryview(body)[bracket:close + 1], _CLOSE)))
    except orjson.JSONDecodeError:
        return None
    for _ in range(_WRAP):
        wrapped = wrapped[0]
    data["messages"] = wrapped
    return data, bracket, close


def _open(body: bytes) -> int:
    """The '[' of the first top-level `"messages"` member (-1: none found cheaply)."""
    start = 0
    for _ in range(_KEY_TRIES):
        at = body.find(b'"messages"', start, _PREFIX_MAX)
        if at < 0:
            return -1
        start = at + 1
        colon = _skip(body, at + 10)
        if body[colon:colon + 1] != b":":
            continue
        bracket = _skip(body, colon + 1)
        if body[bracket:bracket + 1] != b"[":
            continue
        try:
            if type(orjson.loads(body[:bracket + 1] + b"]}")) is dict:
                return bracket
        except orjson.JSONDecodeError:
            continue
    return -1


def _close_guess(body: bytes, bracket: int) -> int:
    """The ']' that probably closes the array opened at `bracket` (verified by the caller): read
    from the last 4 KB (a short last message, a small tail: ~5 µs), else from the last 64 KB (~40 µs)."""
    for window in (4096, WINDOW):
        close = _read_back(body, bracket, window)
        if close != -2 or window >= len(body) - bracket:
            return max(close, -1)
    return -1


def _read_back(body: bytes, bracket: int, window: int) -> int:
    """-2: undecided within the window."""
    n = len(body)
    lo = max(bracket, n - window)
    rev = body[lo:][::-1]  # rev[k] is body[n - 1 - k]
    depth = 0
    candidate = -1
    for m in _REV_TOKEN.finditer(rev):
        k = m.start()
        c = rev[k]
        if c == 0x22:  # a string
            if depth == 0:
                return -1
            if depth == 3 and candidate >= 0 and m.group() == _ROLE_REV:
                j = k - 1  # the byte after the string in the body
                while j >= 0 and rev[j] in _WS:
                    j -= 1
                if j >= 0 and rev[j] == 0x3A:  # a "role" key of an element: the messages array
                    return candidate
            continue
        pos = n - 1 - k
        if c == 0x5D or c == 0x7D:  # ] }
            if depth == 0:
                if c != 0x7D or body[pos + 1:].strip(_WS):
                    return -1
            elif depth == 1:
                candidate = pos if c == 0x5D else -1
            depth += 1
        else:  # [ {
            depth -= 1
            if depth == 1:
                if candidate >= 0 and pos == bracket:
                    return candidate
                candidate = -1  # another member's array (tools, stop): skipped whole
            elif depth <= 0:
                return -1
    return -2


def _skip(body: bytes, i: int) -> int:
    n = len(body)
    while i < n and body[i] in _WS:
        i += 1
    return i
