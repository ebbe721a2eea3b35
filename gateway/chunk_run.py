"""Runs of token chunks relayed at once: one regex over a read instead of Python for every event.

Once the observer has learnt a stream's token-chunk shapes (chunk_shape.py), an engine's read holds
dozens of consecutive chunks that differ only in their text. Relaying them one by one still cost
Python per event: splitting, the shape check, recording, the reshaper (~1.5-2 µs a chunk, most of
what a 256-chunk stream cost beyond a small request). Here, from an event boundary, one compiled
pattern `(?:HEAD text TAIL)+` (the text: a plain JSON string, as chunk_shape.Shape.text accepts)
matches every consecutive chunk of one shape, `findall` gives their texts, and the run is recorded
(its texts, one timestamp for the read) and relayed as one piece: its own bytes when the reshaper
leaves the shape as it is, else the reshaped head and tail around each text.

Exactly what the event-by-event relay gives (tests/test_chunk_run.py drives both over generated
streams cut into random reads): a run holds only whole events of a learnt shape, which the splitter
would have cut at the same boundaries; its texts are decoded together (invalid UTF-8 anywhere: the
run goes event by event); and a shape's reshaped head and tail are taken from the reshaper itself,
in stream order, on probes, and used only when three probes show the reshaper leaves the text alone
(`reasoning_field: both` copies it: those runs go event by event).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import chunk_shape, sse
from .chunk_shape import Shape

ENABLED = os.environ.get("GATEWAY_CHUNK_RUNS", "1") != "0"  # 0: event by event (an A/B)
_SLOT = rb'[^"\\\x00-\x1f]*'  # a plain JSON string's characters: no quote, backslash or control byte
_PROBES = (b"a", b"bc d", b"")  # differ in their first and last characters (see _reshaped)


@dataclass(slots=True)
class _Pattern:
    shape: Shape
    run: re.Pattern[bytes]
    text: re.Pattern[bytes]
    head: bytes | None = None  # the reshaped head and tail (None: not probed yet)
    tail: bytes | None = None
    same: bool = False  # the reshaper leaves the shape's bytes as they are
    usable: bool = True  # False: the reshaper changes the text (this shape goes event by event)


@dataclass(slots=True)
class Run:
    """Consecutive whole events of one learnt shape, as the splitter found them in its buffer."""

    pattern: _Pattern
    data: bytes  # the events' bytes
    texts: list[bytes] = field(default_factory=list)  # each event's text, raw

    def events(self) -> list[bytes]:
        tail = self.pattern.shape.tail
        events = self.data.split(tail)
        events.pop()  # after the last tail: nothing
        return [e + tail for e in events]


class Runs:
    """One stream's runs: found in the splitter's buffer, relayed in stream order by `relay_read`."""

    __slots__ = ("observer", "reshape", "_patterns", "_known")

    def __init__(self, observer: Any, reshape: Callable[[bytes], bytes]) -> None:
        self.observer = observer  # sse.StreamObserver
        self.reshape = reshape
        self._patterns: list[_Pattern] = []
        self._known = 0  # observer shapes compiled so far

    def relay_read(self, splitter: Any, data: bytes, final: bool, out: list[bytes]) -> None:
        """The pieces the client gets for this read, appended to `out`, as the event-by-event loop of
        proxy.py gives them (the observer's `done` stops it, BadStream is raised as there)."""
        observer, shape = self.observer, self.reshape
        shapes = observer.shapes
        if len(shapes) != self._known:
            self._compile(shapes)
        items: list[Any] = splitter.feed_runs(data, self._match, final) if self._patterns \
            else splitter.feed(data, final)
        i = 0
        while i < len(items):
            item = items[i]
            i += 1
            if type(item) is Run:
                piece = self._relay(item)
                if piece is None:  # event by event after all
                    items[i:i] = item.events()
                    continue
                out.append(piece)
                continue
            piece = observer.relay(item)
            if piece is not None:
                out.append(shape(piece))
            if observer.done:
                break
            if len(shapes) != self._known and i < len(items):
                # A shape learnt from this event (an engine's first read often holds the whole answer):
                # what follows in the read is taken in runs from here.
                self._compile(shapes)
                rest = b"".join(x.data if type(x) is Run else x for x in items[i:])
                items[i:] = sse.scan_runs(rest, self._match)[0]

    def _compile(self, shapes: list[Shape]) -> None:
        for s in shapes[self._known:]:
            head, tail = re.escape(s.head), re.escape(s.tail)
            self._patterns.append(_Pattern(s, re.compile(b"(?:" + head + _SLOT + tail + b")+"),
                                           re.compile(head + b"(" + _SLOT + b")" + tail)))
        self._known = len(shapes)

    def _match(self, buf: bytes, at: int) -> Run | None:
        """The run of one usable shape that starts at `at` (an event boundary), if any."""
        for p in self._patterns:
            if p.usable:
                m = p.run.match(buf, at)
                if m is not None:
                    end = m.end()
                    return Run(p, buf[at:end], p.text.findall(buf, at, end))
        return None

    def _relay(self, run: Run) -> bytes | None:
        p = run.pattern
        if p.head is None and not self._reshaped(p):
            return None
        raw = run.texts
        try:
            texts = b"\x00".join(raw).decode().split("\x00") if len(raw) > 1 else [raw[0].decode()]
        except UnicodeDecodeError:
            return None
        self._record(p.shape, texts)
        if p.same:
            return run.data
        head, tail = p.head, p.tail
        return head + (tail + head).join(raw) + tail  # type: ignore[operator]

    def _reshaped(self, p: _Pattern) -> bool:
        """Learn the shape's reshaped head and tail from the reshaper (in stream order, as its first
        event of this shape would have taught it); False when the reshaper does more than rewrite them."""
        s = p.shape
        outs = [self.reshape(s.head + probe + s.tail) for probe in _PROBES]
        a, b = outs[0], outs[1]
        n = 0
        while n < len(a) and n < len(b) and a[n] == b[n]:
            n += 1
        head = a[:n]
        tail = a[n + len(_PROBES[0]):]
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
