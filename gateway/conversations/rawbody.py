"""A request body's messages, with the unchanged history recognised from its bytes.

An agent's next turn repeats its whole history byte for byte and appends a few messages. Parsing
the body of a long session and normalising and digesting its messages again costs milliseconds, all
to rediscover what the previous turn already knew. So the previous turn leaves a `BodyPrint`: where
each message's bytes end (relative to the messages array) and a digest of each message's bytes (with
the separator before it). The next body is read as:

* its top level is walked with the C JSON scanner (on a latin-1 view of the bytes, so character
  offsets are byte offsets; multi-byte UTF-8 never contains a quote or a backslash), to find the
  one `messages` key and the array's extent;
* the history's message spans are checked digest by digest (xxh64 of a memoryview, no copy);
  the first k that match are, byte for byte, the previous turn's first k messages (a JSON
  value read left to right from the same bytes is the same value), so their parsed, normalised
  and rendered forms are the previous turn's;
* only what follows is parsed (orjson, message by message), as is the rest of the body without
  its messages.

Anything unexpected (no messages array, a second `messages` key, bytes the scanner refuses) gives
None: the caller parses the whole body the ordinary way. The result is always what orjson.loads
of the whole body gives (as a dict: top-level key order may differ).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

_decoder = json.JSONDecoder()
_scan = _decoder.raw_decode
_WS = " \t\n\r"


@dataclass
class BodyPrint:
    """Where each message of a body's messages array ends and what its bytes digest to."""

    ends: array = field(default_factory=lambda: array("Q"))  # per message: end offset from the array's '['
    digests: array = field(default_factory=lambda: array("Q"))  # per message: xxh64 of (separator + message)
    whole: int = 0  # xxh64 of all of them at once (the common case: nothing changed)

    def __len__(self) -> int:
        return len(self.ends)

    def nbytes(self) -> int:
        return 16 * len(self.ends) + 64


@dataclass
class Body:
    body: dict[str, Any]  # as orjson.loads of the whole body
    unchanged: int  # leading messages that are, byte for byte, the previous print's
    print: BodyPrint  # of this body, for the next turn


def _skip(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _WS:
        i += 1
    return i


def read(data: bytes, previous: BodyPrint | None = None,
         previous_messages: list[dict[str, Any]] | None = None) -> Body | None:
    """The body, reusing `previous_messages` for the leading messages whose bytes are unchanged."""
    try:
        return _read(data, previous, previous_messages)
    except (ValueError, IndexError, orjson.JSONDecodeError):
        return None


def _read(data: bytes, previous: BodyPrint | None, previous_messages: list[dict[str, Any]] | None) -> Body | None:
    s = data.decode("latin-1")
    i = _skip(s, 0)
    if s[i] != "{":
        return None
    i = _skip(s, i + 1)
    open_at = close_at = -1
    unchanged = 0
    bp = BodyPrint()
    tail: list[dict[str, Any]] = []
    if s[i] == "}":
        return None
    while True:
        if s[i] != '"':
            return None
        key, i = _scan(s, i)
        i = _skip(s, i)
        if s[i] != ":":
            return None
        i = _skip(s, i + 1)
        if key == "messages":
            if open_at >= 0 or s[i] != "[":
                return None  # a second messages key, or not an array: the ordinary parse decides
            open_at = i + 1
            i, unchanged, tail = _messages(data, s, open_at, previous, previous_messages, bp)
            close_at = i
            i += 1
        else:
            _, i = _scan(s, i)
        i = _skip(s, i)
        if s[i] == ",":
            i = _skip(s, i + 1)
            continue
        if s[i] == "}":
            break
        return None
    if open_at < 0 or _skip(s, i + 1) != len(s):
        return None
    body = orjson.loads(data[:open_at] + data[close_at:])  # everything but the messages (an empty array)
    if not isinstance(body, dict):
        return None
    messages = (previous_messages[:unchanged] if unchanged and previous_messages is not None else []) + tail
    body["messages"] = messages
    return Body(body, unchanged, bp)


def _messages(data: bytes, s: str, start: int, previous: BodyPrint | None,
              previous_messages: list[dict[str, Any]] | None, bp: BodyPrint) -> tuple[int, int, list[dict[str, Any]]]:
    """(index of the closing ']', messages unchanged, the other messages parsed); fills `bp`."""
    view = memoryview(data)
    h64 = xxhash.xxh64_intdigest
    k = 0
    if previous is not None and previous_messages is not None and len(previous) and \
            len(previous_messages) == len(previous):
        ends = previous.ends
        n = len(ends)
        if start + ends[-1] <= len(data) and h64(view[start:start + ends[-1]]) == previous.whole:
            k = n
        else:
            prev = start
            for j in range(n):
                e = start + ends[j]
                if e > len(data) or h64(view[prev:e]) != previous.digests[j]:
                    break
                prev = e
                k = j + 1
        if k:
            bp.ends = previous.ends[:k]
            bp.digests = previous.digests[:k]
    prev = start + (bp.ends[-1] if k else 0)
    i = _skip(s, prev)
    tail: list[dict[str, Any]] = []
    first = k == 0
    while True:
        if s[i] == "]":
            break
        if not first:
            if s[i] != ",":
                raise ValueError("expected ',' between messages")
            i = _skip(s, i + 1)
        _, end = _scan(s, i)
        tail.append(orjson.loads(view[i:end]))
        bp.ends.append(end - start)
        bp.digests.append(h64(view[prev:end]))
        prev = end
        i = _skip(s, end)
        first = False
    bp.whole = h64(view[start:prev])
    return i, k, tail
