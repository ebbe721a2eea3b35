"""Runs of token chunks relayed at once: C-speed byte operations over a read, not Python per event.

Once the observer has learnt a stream's token-chunk shapes (chunk_shape.py), an engine's read holds
dozens of consecutive chunks that differ only in their text: `HEAD text TAIL HEAD text TAIL ...`.
Relaying them one by one costs Python for every event (split, shape check, record, reshape). Here
the relay walks the read's events itself, and where an event starts with a learnt shape's head, one
`split` after each of the shape's tails cuts the following chunks apart, C-level calls keep the pieces
that are the head and a text, one join
checks that the texts are all plain JSON strings (no quote, backslash or control byte, as
chunk_shape.Shape.text accepts) and one decode makes them text. The run is recorded (its texts, one
timestamp for the read) and relayed as one piece: its own bytes when the reshaper leaves the shape
as it is, else the reshaped head and tail around each text.

Exactly what the event-by-event relay gives (tests/test_chunk_run.py drives both over generated
streams cut into random reads): a run holds only whole events of a learnt shape, which the splitter
would have cut at the same boundaries (a shape's bytes hold one blank line, at their end; a plain
text holds none); a run whose texts are not UTF-8 goes event by event; a shape's reshaped head and
tail come from the reshaper itself, in stream order, on probes, and are used only when three probes
show the reshaper leaves the text alone (`reasoning_field: both` copies it: event by event).
A run is cut from at most WINDOW bytes at a time, so shapes that alternate chunk by chunk cost a
bounded copy each.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from operator import itemgetter, methodcaller
from typing import Any, Callable

from . import chunk_shape
from .chunk_shape import Shape

WINDOW = 16 * 1024
MIN_BYTES = 1024  # a shorter read (a few chunks: an engine pacing its tokens) goes event by event
# Not in a plain JSON string: the quote, the backslash, control bytes (NUL apart: it joins the texts).
_NOT_PLAIN = re.compile(rb'["\\\x01-\x1f]')
_PROBES = (b"a", b"bc d", b"")  # they differ in their first and last characters (see _reshaped)


@dataclass(slots=True)
class _Pattern:
    shape: Shape
    starts: Callable[[bytes], bool]  # a piece starts with the shape's head
    text: Callable[[bytes], bytes]  # a piece without the head
    head: bytes | None = None  # the reshaped head and tail (None: not probed yet)
    tail: bytes | None = None
    same: bool = False  # the reshaper leaves the shape's bytes as they are
    usable: bool = True  # False: the reshaper changes the text (this shape goes event by event)


class Runs:
    """One stream's runs, relayed in stream order among its other events by `relay_read`."""

    __slots__ = ("observer", "reshape", "_patterns", "_known")

    def __init__(self, observer: Any, reshape: Callable[[bytes], bytes]) -> None:
        self.observer = observer  # sse.StreamObserver
        self.reshape = reshape
        self._patterns: list[_Pattern] = []
        self._known = 0  # observer shapes taken so far

    def relay_read(self, splitter: Any, data: bytes, final: bool, out: list[bytes]) -> None:
        """The pieces the client gets for this read, appended to `out`, as relay/stream.py's event-by-event
        loop over `splitter.feed` gives them (the observer's `done` stops it, BadStream is raised)."""
        observer, shape = self.observer, self.reshape
        buf, hold = splitter.joined(data, final)
        last = buf.rfind(b"\n\n")
        if len(buf) < MIN_BYTES or len(buf) - last - 1 > splitter.max_bytes:
            # A read of a few events (an engine pacing its tokens) is cheaper event by event; and an
            # unfinished rest that may be refused is refused before any event, as `feed` does.
            events = buf.split(b"\n\n")
            splitter.keep(events.pop(), hold)
            for event in events:
                if event.strip():
                    piece = observer.relay(event + b"\n\n")
                    if piece is not None:
                        out.append(shape(piece))
                    if observer.done:
                        return
            return
        shapes = observer.shapes
        at = 0
        plain_until = 0  # a run that could not be relayed whole: its events one by one up to here
        find = buf.find
        while True:
            if len(shapes) != self._known:
                self._take(shapes)
            if at >= plain_until and self._patterns:
                run = self._run(buf, at)
                if run is not None:
                    piece = self._relay(buf, at, *run)
                    if piece is not None:
                        out.append(piece)
                        at = run[1]
                        continue
                    plain_until = run[1]
            end = find(b"\n\n", at)
            if end < 0:
                break
            if buf[at:end].strip():
                piece = observer.relay(buf[at:end + 2])
                if piece is not None:
                    out.append(shape(piece))
                if observer.done:
                    return  # what follows [DONE] is never read
            at = end + 2
        splitter.keep(buf[at:], hold)

    def _take(self, shapes: list[Shape]) -> None:
        for s in shapes[self._known:]:
            starts, text = methodcaller("startswith", s.head), itemgetter(slice(len(s.head), None))
            self._patterns.append(_Pattern(s, starts, text))
        self._known = len(shapes)

    def _run(self, buf: bytes, at: int) -> tuple[_Pattern, int, list[bytes], bytes] | None:
        """The chunks of one usable shape from `at` (an event boundary) on: (pattern, where they end,
        their raw texts, the texts joined by NUL), or None."""
        for p in self._patterns:
            if not (p.usable and buf.startswith(p.shape.head, at)):
                continue
            # Cut after each tail (a tail ends the event: its blank line is the event's only one), keep
            # the pieces that are the head and a text. Not a split by tail+head: a needle of 100+ bytes
            # takes CPython's slower two-way search.
            pieces = buf[at:at + WINDOW].split(p.shape.tail)
            pieces.pop()  # what follows the last tail: not a whole event of this run
            heads = list(map(p.starts, pieces))
            if False in heads:
                del pieces[heads.index(False):]
            texts = list(map(p.text, pieces))
            joined = b"\x00".join(texts)
            if _NOT_PLAIN.search(joined) is not None or joined.count(b"\x00") != len(texts) - 1:
                n = 0
                while n < len(texts) and _NOT_PLAIN.search(texts[n]) is None and b"\x00" not in texts[n]:
                    n += 1
                del texts[n:]
                joined = b"\x00".join(texts)
            if not texts:
                return None
            end = at + len(texts) * (len(p.shape.head) + len(p.shape.tail)) + len(joined) - (len(texts) - 1)
            return p, end, texts, joined
        return None

    def _relay(self, buf: bytes, at: int, p: _Pattern, end: int, raw: list[bytes], joined: bytes) -> bytes | None:
        if p.head is None and not self._reshaped(p):
            return None
        try:
            texts = joined.decode().split("\x00")
        except UnicodeDecodeError:
            return None
        self._record(p.shape, texts)
        head, tail = p.head, p.tail
        if p.same:
            return buf[at:end]
        return head + (tail + head).join(raw) + tail  # type: ignore[operator]

    def _reshaped(self, p: _Pattern) -> bool:
        """Learn the shape's reshaped head and tail from the reshaper (in stream order, as the first
        event of this shape would have taught it); False when it does more than rewrite them."""
        s = p.shape
        outs = [self.reshape(s.head + probe + s.tail) for probe in _PROBES]
        a, b = outs[0], outs[1]
        lo, hi = 0, min(len(a), len(b))  # their common prefix, by slice comparisons (not a byte loop)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        head, tail = a[:lo], a[lo + len(_PROBES[0]):]
        if any(o != head + probe + tail for o, probe in zip(outs, _PROBES)):
            p.usable = False
            return False
        p.head, p.tail = head, tail
        p.same = head == s.head and tail == s.tail
        return True

    def _record(self, shape: Shape, texts: list[str]) -> None:
        """What the observer records for these chunks one by one (StreamObserver._produced)."""
        ex = self.observer.ex
        gen = ex.generated
        if shape.kind == chunk_shape.ARGUMENTS:  # a tool call's delta counts even when empty
            for text in texts:
                gen.add_tool_call_delta({"index": shape.call, "function": {"arguments": text}})
        else:
            if "" in texts:
                texts = [t for t in texts if t]
            (gen.content if shape.kind == chunk_shape.CONTENT else gen.reasoning).extend(texts)
        n = len(texts)
        if n:
            now = time.perf_counter()
            if ex.t_first_token is None:
                ex.t_first_token = now
            ex.t_last_token = now
            ex.token_chunk_times.extend([now] * n)
