"""The pipeline's answer to a proxied request: whole or streamed, and how it ends.

The pipeline returns one `Answer` whatever its transport; a front end writes it from its fields (the
wire path: gateway/server/wire.py; ASGI, Starlette's routes and plain uvicorn: server/asgi_answer.py)
and then awaits `close()`, written or not (the client left, a write failed). `close` is the one place
an exchange ends: a stream's relay runs its own `finally` (the upstream connection released or closed),
a stream that never started gives its upstream connection back, then the exchange's `end` runs (its
in-flight counts go back, its record is made). It is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncGenerator, Callable, Mapping

Headers = list[tuple[bytes, bytes]]
JSON: Headers = [(b"content-type", b"application/json")]
# What a relayed stream carries (the engines' own): no caching, no buffering by a proxy in front.
SSE: Headers = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
                (b"content-type", b"text/event-stream; charset=utf-8")]


@dataclass(eq=False, slots=True)
class Answer:
    status: int
    headers: Headers  # raw, lower-case names; the front end adds the length or the chunked encoding
    body: bytes = b""  # a whole answer
    stream: AsyncGenerator[bytes, None] | None = None  # a streamed answer, written piece by piece
    release: Callable[[], None] | None = None  # a stream that never started: its upstream connection
    end: Callable[[], None] | None = None  # the exchange ends
    closed: bool = False

    @classmethod
    def json(cls, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
        return cls(status, [*extra, *JSON], body)

    def set_headers(self, pairs: list[tuple[str, str]]) -> None:
        """Each pair replaces the header of that name (its first place kept, repeats dropped) or is
        appended, in order. When none of the names is there yet (the usual case: the gateway's own X-
        headers), they are appended in one go."""
        raw = self.headers
        encoded = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs]
        names = {k for k, _ in encoded}
        if len(names) == len(encoded) and names.isdisjoint(k for k, _ in raw):
            raw.extend(encoded)
            return
        for name, value in encoded:
            at = [i for i, (k, _) in enumerate(raw) if k == name]
            if not at:
                raw.append((name, value))
                continue
            raw[at[0]] = (name, value)
            for i in reversed(at[1:]):
                del raw[i]

    async def close(self) -> None:
        """After the answer was written, or could not be: see the module's docstring."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.stream is not None:
                await self.stream.aclose()  # a relay interrupted at a piece runs its `finally` now
        finally:
            try:
                if self.release is not None:
                    self.release()
            finally:
                if self.end is not None:
                    self.end()
