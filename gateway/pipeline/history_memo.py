"""The hot path's memory of recent large bodies: an agent's next turn repeats its history byte for byte.

A 1,600-message agent session sends 2-3 MB per turn, of which all but the last few messages are the
previous turn's bytes. Parsing, validating and re-serialising all of it costs the event loop
milliseconds per turn (bench/steps.py), for nothing new. So, per process, the last large bodies leave an
`Entry`: where their history ends in the bytes (`cut`, just after the last message), digests of the
bytes up to there, the parsed messages, and the top-level fields before `messages`. A new body that
starts with exactly those bytes is read as the entry's messages plus a parse of only what follows:

    {"model":..., "messages":[m0, ..., mk  |cut|  , m(k+1), ...], "max_tokens":...}
    parse  b'{"\\u0000messages":[' + bytes after the ','  ->  the new messages and the fields after them

JSON is read left to right, so identical leading bytes are identical leading values; the result is
what orjson.loads of the whole body gives. The caller validates only the new messages and forwards
the history's own bytes (`serialise`) instead of writing them again.

Finding `cut`: orjson reads the messages array alone from its '[' and says where the rest begins
(its "unexpected content after document" error gives the offset), and the rest must parse to exactly
the top-level fields after `messages`. A body seen for the first time is usually read in parts
(messages_span.py), which finds its array's span as it parses: its messages' own bytes are
forwarded at once, and filing it costs two digests. Else finding `cut` is a second parse of its
history, done only when a later body starts with the same bytes (a burst of new
one-turn conversations never pays it); for a body that extended a known one, only its new messages
are read. Anything unexpected (a second `messages` key in what follows, a
message that is not an object) means no entry, or a miss: the ordinary parse. Nothing here can make
a body read differently.

Bounded: entries hold at most `max_bytes` of body bytes in all (their parsed messages are shared
with the requests that use them); the least recently used go first. Shared message objects are
never modified in place: every policy that rewrites a message copies it first (limits, healing).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from . import messages_span
from .body_parts import Body, Parts, whole

MIN_BYTES = 64 * 1024  # below this a whole parse costs less than looking
HEAD = 4096  # the bytes that file an entry (a conversation's system prompt and first messages)
NEAR = 4096  # the bytes just before `cut`, checked before the whole prefix (tells conversations apart)
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_WS = b" \t\r\n"
_h = xxhash.xxh3_64_intdigest
# What follows the history is parsed under this key instead of "messages", so that a second
# top-level "messages" key there shows itself (it cannot be told from a nested one by its bytes).
_SENTINEL = "\x00messages"
_SENTINEL_JSON = b"\\u0000messages"


@dataclass(slots=True, eq=False)  # compared by identity (its messages are long)
class Entry:
    head: int
    before: dict[str, Any]  # the top-level fields before "messages", as parsed
    messages: list[Any]
    raw: bytes  # the body it was made from (its history's bytes are forwarded as they are)
    after: dict[str, Any] | None = None  # the fields after "messages": only until it is settled
    settled: bool = False  # where its history ends is known (below); a body seen once is not, yet
    cut: int = 0  # offset just after the last message
    near: int = 0  # digest of body[cut - NEAR:cut]
    whole: int = 0  # digest of body[:cut]
    open: int = 0  # offset just after the messages array's '['
    facts: dict[Any, Any] = field(default_factory=dict)  # what the limits learnt of its messages, per scan kind
    others: tuple[bytes, int] | None = None  # a first-seen body's other fields as written (messages_span.py)


@dataclass(slots=True)
class Parsed:
    data: Any  # as orjson.loads(body)
    known: int = 0  # leading messages that are an earlier body's, byte for byte (already validated)
    entry: Entry | None = None  # where they came from
    fresh: Entry | None = None  # this body's own settled entry (its history's bytes can be forwarded)
    pending: Entry | None = None  # this body's entry, filed once its answer has gone (`settle`)
    hasher: Any = None  # xxh3 state over the reused history's bytes


class HistoryMemo:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        """`max_bytes`: Settings.history_memo_mb, in bytes."""
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # by id, least recently used first
        self._by_head: dict[int, list[Entry]] = {}
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    # -- reading a body ------------------------------------------------------------------------

    def parse(self, body: bytes) -> Parsed:
        """The body parsed (orjson.JSONDecodeError as orjson raises it), reusing a known history."""
        if len(body) < MIN_BYTES or self.max_bytes <= 0:
            return Parsed(orjson.loads(body))
        view = memoryview(body)
        head = _h(view[:HEAD])
        for entry in tuple(reversed(self._by_head.get(head, ()))):
            if not entry.settled and not self._settle(entry):
                continue
            parsed = self._reuse(body, view, entry)
            if parsed is not None:
                self.hits += 1
                parsed.fresh = parsed.pending = self._extend(body, head, _fields(parsed.data), entry, parsed.hasher)
                return parsed
        self.misses += 1
        split = messages_span.split(body)  # the same data, and where its messages array lies
        data = orjson.loads(body) if split is None else split.data
        fields = _fields(data)  # as parsed: the policies may rewrite the body before it is filed
        if fields is None:
            return Parsed(data)
        if split is None:
            return Parsed(data, pending=Entry(head, fields[0], fields[1], body, after=fields[2]))
        # Its messages' own bytes are known: forwarded as they are (`serialise`), and filed with
        # their end already found (`_settle` only takes the digests).
        entry = Entry(head, fields[0], fields[1], body, open=split.bracket + 1, cut=_rskip(body, split.close),
                      others=split.others)
        return Parsed(data, fresh=entry, pending=entry)

    def settle(self, parsed: Parsed) -> None:
        """File the body once it has been answered (never one that was refused: its messages would
        count as checked next time). A body seen for the first time is filed as it is; its digests
        (and, if it could not be read in parts, where its history ends: a second parse) are worked
        out only when a later body starts like it (`_settle`), which a burst of one-turn
        conversations never pays. A body that extended an earlier one replaces it: the
        conversation moved on."""
        entry, parsed.pending = parsed.pending, None
        if entry is None:
            return
        if parsed.entry is not None:
            self._forget(parsed.entry)
        self._add(entry)

    def _reuse(self, body: bytes, view: memoryview, entry: Entry) -> Parsed | None:
        cut = entry.cut
        if len(body) <= cut or _h(view[max(0, cut - NEAR):cut]) != entry.near:
            return None
        hasher = xxhash.xxh3_64(view[:cut])  # carried on: the new entry's digest only adds what is new
        if hasher.intdigest() != entry.whole:
            return None
        j = _skip(body, cut)
        c = body[j:j + 1]
        if c == b",":
            rest = view[j + 1:]
        elif c == b"]":
            rest = view[j:]
        else:
            return None
        rest_bytes = bytes(rest)
        if _SENTINEL_JSON in rest_bytes:
            return None  # a client's own key of that name: the whole parse decides
        try:
            tail = orjson.loads(b'{"' + _SENTINEL_JSON + b'":[' + rest_bytes)
        except orjson.JSONDecodeError:
            return None  # the whole parse gives the client its error
        if type(tail) is not dict or "messages" in tail or type(tail.get(_SENTINEL)) is not list:
            return None  # a second messages key in what follows (the last one wins): the whole parse decides
        new = tail.pop(_SENTINEL)
        data = dict(entry.before)
        data["messages"] = entry.messages + new
        data.update(tail)
        return Parsed(data, len(entry.messages), entry, hasher=hasher)

    # -- remembering a body ------------------------------------------------------------------------

    def _settle(self, entry: Entry) -> bool:
        """Work out where a filed body's history ends (False, and forgotten, if it cannot be)."""
        if entry.cut:  # found when it was parsed (messages_span.py)
            open_, cut = entry.open, entry.cut
        else:
            open_ = _open_bracket(entry.raw, entry.before)
            close = _close_bracket(entry.raw, entry.after or {}, open_, True) if open_ >= 0 else -1
            cut = _rskip(entry.raw, close) if close >= 0 else -1
        if cut < 0 or entry.raw[cut - 1:cut] != b"}" or cut - open_ < 2:
            self._forget(entry)
            return False
        view = memoryview(entry.raw)
        entry.open, entry.cut = open_, cut
        entry.near, entry.whole = _h(view[max(0, cut - NEAR):cut]), _h(view[:cut])
        entry.after, entry.settled = None, True
        return True

    def _extend(self, body: bytes, head: int, fields: Any, base: Entry, hasher: Any) -> Entry | None:
        """The entry of a body that extended `base`'s history: only its new part is read."""
        if fields is None:
            return None
        before, messages, after = fields
        close = _close_bracket(body, after, base.cut, False)
        cut = _rskip(body, close) if close >= 0 else -1
        if cut < 0 or body[cut - 1:cut] != b"}":
            return None
        hasher.update(memoryview(body)[base.cut:cut])
        return Entry(head, before, messages, body, settled=True, cut=cut,
                     near=_h(memoryview(body)[max(0, cut - NEAR):cut]), whole=hasher.intdigest(), open=base.open)

    def _add(self, entry: Entry) -> None:
        self._entries[id(entry)] = entry
        self._by_head.setdefault(entry.head, []).append(entry)
        self.bytes += len(entry.raw)
        while self.bytes > self.max_bytes and self._entries:
            _, oldest = self._entries.popitem(last=False)
            self._drop(oldest)

    def _forget(self, entry: Entry) -> None:
        if self._entries.pop(id(entry), None) is not None:
            self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        self.bytes -= len(entry.raw)
        same = self._by_head.get(entry.head)
        if same is not None:
            if entry in same:
                same.remove(entry)
            if not same:
                del self._by_head[entry.head]

    # -- forwarding ---------------------------------------------------------------------------------

    @staticmethod
    def forward_body(parsed: Parsed, out: dict[str, Any]) -> Body | None:
        """`out` as JSON with the history's own bytes for its messages, when no policy replaced them
        (None: serialise it the ordinary way). Writing a long history again costs the event loop
        what reading it did; this writes only the other fields and hands the history's bytes on in
        place: the parts are written upstream as they are (body_parts.py; joining them would copy
        the whole body)."""
        entry = parsed.fresh
        if entry is None or out.get("messages") is not entry.messages:
            return None
        others = orjson.dumps({k: v for k, v in out.items() if k != "messages"})
        if entry.others is not None and entry.others[0] == others and list(out).index("messages") == entry.others[1]:
            # Nothing rewritten, no key given twice: the client's body is the body to forward, as
            # it is (no buffer of the body's size to fill: bench/steps.py "serialise").
            return entry.raw
        return Parts((others[:-1] + (b',"messages":' if len(others) > 2 else b'"messages":'),
                      memoryview(entry.raw)[entry.open - 1:entry.cut], b"]}"))

    @staticmethod
    def serialise(parsed: Parsed, out: dict[str, Any]) -> bytes | None:
        """`forward_body` as one bytes object."""
        body = HistoryMemo.forward_body(parsed, out)
        return None if body is None else whole(body)


def _fields(data: Any) -> tuple[dict[str, Any], list[Any], dict[str, Any]] | None:
    """(the fields before "messages", the messages, the fields after), or None: nothing to remember."""
    if type(data) is not dict:
        return None
    messages = data.get("messages")
    if type(messages) is not list or not messages or type(messages[-1]) is not dict:
        return None
    keys = list(data)
    at = keys.index("messages")
    return {k: data[k] for k in keys[:at]}, messages, {k: data[k] for k in keys[at + 1:]}


def _skip(body: bytes, i: int) -> int:
    n = len(body)
    while i < n and body[i] in _WS:
        i += 1
    return i


def _rskip(body: bytes, i: int) -> int:
    """The offset just after the last non-whitespace byte before `i`."""
    while i > 0 and body[i - 1] in _WS:
        i -= 1
    return i


def _close_bracket(body: bytes, after: dict[str, Any], start: int, fresh: bool) -> int:
    """Where the messages array closes. `fresh`: `start` is just after its '['; else just after a
    known message, with `,` and more messages or `]` next. Exact: orjson reads the array and says
    where the rest begins ("unexpected content after document"). Read as latin-1 text, one character
    per byte, so that the offset it gives is a byte offset (given bytes, orjson counts characters);
    UTF-8's multi-byte characters never hold a quote, a backslash or a bracket, so it reads the same
    structure."""
    if fresh:
        doc, shift = body[start - 1:].decode("latin-1"), start - 1
    else:
        j = _skip(body, start)
        if body[j:j + 1] == b"]":
            doc = None
            close = j
        elif body[j:j + 1] == b",":
            doc, shift = "[" + body[j + 1:].decode("latin-1"), j  # index k of doc is body[j + k]
        else:
            return -1
    if doc is not None:
        try:
            orjson.loads(doc)
            return -1  # nothing after the array: not a body's messages
        except orjson.JSONDecodeError as exc:
            if "after document" not in exc.msg:
                return -1
            close = _rskip(body, shift + exc.pos) - 1
    if body[close:close + 1] != b"]":
        return -1
    try:
        return close if orjson.loads(b'{"messages":[' + body[close:]) == {"messages": [], **after} else -1
    except orjson.JSONDecodeError:
        return -1


def _open_bracket(body: bytes, before: dict[str, Any]) -> int:
    """Just after the messages array's '[': the first `"messages"` key preceded by exactly `before`."""
    want = {**before, "messages": []}
    bracket = messages_span.open_bracket(body, lambda head: head == want)
    return bracket + 1 if bracket >= 0 else -1
