"""A large chat body read in three parts, so that its `messages` array's own bytes are known.

The hot path forwards a first-seen large body with its messages untouched; re-serialising them
costs the event loop a fresh buffer of the body's size per request (orjson.dumps; bench/steps.py
"serialise"). When the gateway changes none of the other fields (the model name is the
upstream's, no stream options added) the client's body itself is forwarded; else the other fields
are written and joined with the array's own bytes. That needs the array's exact byte span, found
without a second pass over 2 MB:

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

S is parsed in place (a memoryview: no copy). Copying it into a new buffer, to wrap it or to
re-serialise it, would cost more than the parse saves (fresh pages).

One difference from the whole parse, at depths no client writes: S alone is one level shallower
than in the body, so messages nested exactly 1,024 levels deep read here where the whole parse
refuses them, and messages nested 254+ levels (deeper than orjson writes) are forwarded as the
client wrote them rather than refused as "nested too deeply to forward" (the memo's later turns
already forwarded their new messages that way). Anything unexpected (a second `messages` key,
broken JSON, a tail longer than the window) is None: the caller parses the whole body the ordinary way;
the only extra cost is the wasted attempt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import orjson

# Tail read backwards: string tokens and brackets, on the reversed bytes. A reversed string ends at a
# quote that is not followed (in reversed order) by an odd run of backslashes. One cut by the
# window's end matches up to it (\Z) instead of failing: a failed match restarts the scan at every
# quote inside the string (quadratic in the escaped quotes).
_REV_TOKEN = re.compile(rb'"(?:[^"]++|"(?=(?:\\\\)*+\\(?!\\)))*+(?P<end>"|\Z)|[\[\]{}]')
_ROLE_REV = b'"elor"'  # "role", reversed
WINDOW = 16 * 1024  # bytes read backwards from the end at most; a longer last message: no span
_KEY_TRIES = 4  # `"messages"` occurrences tried for the '[' (a nested one before it: rare)
_PREFIX_MAX = 64 * 1024  # ... within this many bytes of the start
_WS = b" \t\r\n"
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}:]')  # forward: strings, brackets, colons
_OTHERS_MAX = 8 * 1024  # the fields besides messages, counted for a repeated key only when this short


@dataclass(slots=True)
class Span:
    data: dict[str, Any]  # as orjson.loads(body)
    bracket: int  # offset of the messages array's '['
    close: int  # offset of its ']'
    # The body's top-level fields other than messages, as orjson writes them, and the position of
    # "messages" among them: when the forwarded body's are the same, the client's bytes are the
    # forwarded body. None: not known to be safe (a repeated top-level key, a long tail).
    others: tuple[bytes, int] | None


def split(body: bytes) -> Span | None:
    """The body's parse, and where its messages array lies; None: parse it whole."""
    bracket = _open(body)
    if bracket < 0:
        return None
    close = _close_guess(body, bracket)
    if close < 0:
        return None
    prefix, tail = body[:bracket], body[close + 1:]
    try:
        rest = prefix + b"[]" + tail
        data = orjson.loads(rest)
        if type(data) is not dict or data.get("messages") != []:
            return None
        if b"messages" in tail or b"\\" in tail:
            # A later top-level "messages" key (perhaps written with escapes) would win over ours.
            probe = orjson.loads(prefix + b"0" + tail)
            if type(probe.get("messages")) is not int:
                return None
        others = _others(rest, data)  # before the messages are put in
        data["messages"] = orjson.loads(memoryview(body)[bracket:close + 1])  # no copy
    except orjson.JSONDecodeError:
        return None
    return Span(data, bracket, close, others)


def _others(rest: bytes, data: dict[str, Any]) -> tuple[bytes, int] | None:
    if len(rest) > _OTHERS_MAX or _members(rest) != len(data):
        return None  # a key given twice: the client's bytes are not what orjson would write
    keys = list(data)
    return orjson.dumps({k: v for k, v in data.items() if k != "messages"}), keys.index("messages")


def _members(doc: bytes) -> int:
    """Top-level members of a valid JSON object: the ':' at depth 1."""
    depth = members = 0
    for m in _TOKEN.finditer(doc):
        c = doc[m.start()]
        if c == 0x3A:
            members += depth == 1
        elif c == 0x5B or c == 0x7B:
            depth += 1
        elif c != 0x22:
            depth -= 1
    return members


def _open(body: bytes) -> int:
    """The '[' of the first top-level `"messages"` member (-1: none found cheaply)."""
    return open_bracket(body, lambda head: type(head) is dict, _PREFIX_MAX, _KEY_TRIES)


def open_bracket(body: bytes, accept: Callable[[Any], bool], end: int | None = None, tries: int | None = None) -> int:
    """The '[' of a `"messages": [` whose prefix, closed with `]}`, parses to what `accept` takes
    (-1: none). A `"messages"` inside a string or a nested object before the real one fails that
    parse and the next occurrence is tried (at most `tries`, within `end` bytes of the start)."""
    start = 0
    tried = 0
    while tries is None or tried < tries:
        tried += 1
        at = body.find(b'"messages"', start, len(body) if end is None else end)
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
            if accept(orjson.loads(body[:bracket + 1] + b"]}")):
                return bracket
        except orjson.JSONDecodeError:
            continue
    return -1


def _close_guess(body: bytes, bracket: int) -> int:
    """The ']' that probably closes the array opened at `bracket` (verified by the caller): read
    from the last 4 KB (a short last message, a small tail), else from the last 16 KB. The cost
    grows with the escaped quotes read, so a longer last message is parsed whole."""
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
            if not m.group("end"):
                return -2  # it goes on beyond the window
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
