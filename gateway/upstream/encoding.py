"""Content-Encoding of upstream answers: undo gzip, deflate and br, refuse anything else.

The gateway asks every upstream for `Accept-Encoding: identity` (engines answer plain text; on
loopback or a LAN compression only costs CPU). An upstream, or a proxy in front of it, may
compress anyway; aiohttp's own decompression is off (`auto_decompress=False`) so the gateway
decides here, with a bound on the output (a 1 KB gzip bomb must not become 1 GB in memory).
"""

from __future__ import annotations

import zlib
from typing import Protocol

import brotli


class Decoder(Protocol):
    """Bytes as they arrived in, bytes as the engine wrote them out."""

    def feed(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class DecodeError(Exception):
    """The body cannot be decoded (unknown coding, corrupt or truncated data, or too large)."""


class _Identity:
    def feed(self, data: bytes) -> bytes:
        return data

    def finish(self) -> bytes:
        return b""


class _Zlib:
    """gzip, or deflate: RFC 9110's deflate is zlib-wrapped, but some servers send raw deflate."""

    def __init__(self, kind: str, limit: int) -> None:
        self.kind = kind
        self.limit = limit
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS if kind == "gzip" else zlib.MAX_WBITS)
        # deflate: zlib-wrapped or raw is decided on the first two bytes (a zlib header: CM 8 and a
        # multiple of 31), however the upstream cut its chunks; until then the bytes wait here.
        self._head: bytes | None = b"" if kind == "deflate" else None

    def feed(self, data: bytes) -> bytes:
        if self._head is not None:
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return b""
            self._head = None
            if not (data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0):
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate (what many servers mean)
        if self._d.eof:
            if data.strip(b"\0"):
                raise DecodeError(f"data after the end of the {self.kind} stream")
            return b""
        try:
            out = self._d.decompress(data, self.limit + 1)
        except zlib.error:
            raise DecodeError(f"corrupt {self.kind} data") from None
        if len(out) > self.limit or self._d.unconsumed_tail:
            raise DecodeError(f"the {self.kind} data expands beyond {self.limit} bytes")
        return out

    def finish(self) -> bytes:
        if not self._d.eof:
            raise DecodeError(f"the {self.kind} stream was cut short")
        return b""


class _Brotli:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        if self._d.is_finished():
            if data:
                raise DecodeError("data after the end of the br stream")
            return b""
        try:
            out = self._d.process(data, output_buffer_limit=self.limit + 1)
        except brotli.error:
            raise DecodeError("corrupt br data") from None
        if len(out) > self.limit or not self._d.can_accept_more_data():
            raise DecodeError(f"the br data expands beyond {self.limit} bytes")
        return out

    def finish(self) -> bytes:
        if not self._d.is_finished():
            raise DecodeError("the br stream was cut short")
        return b""


class _Chain:
    """`Content-Encoding: gzip, br` means gzip first, then br: undo in reverse order."""

    def __init__(self, decoders: list) -> None:
        self.decoders = decoders

    def feed(self, data: bytes) -> bytes:
        for d in self.decoders:
            data = d.feed(data)
        return data

    def finish(self) -> bytes:
        out = b""
        for d in self.decoders:
            out = d.feed(out) + d.finish() if out else d.finish()
        return out


IDENTITY = _Identity()


def decoder_for(content_encoding: str | None, limit: int) -> Decoder:
    """A decoder for the header's value; `limit` bounds the bytes one `feed` may produce."""
    if not content_encoding:
        return IDENTITY
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    decoders: list[_Zlib | _Brotli] = []
    for coding in reversed(codings):
        if coding in ("identity", ""):
            continue
        if coding in ("gzip", "x-gzip"):
            decoders.append(_Zlib("gzip", limit))
        elif coding == "deflate":
            decoders.append(_Zlib("deflate", limit))
        elif coding == "br":
            decoders.append(_Brotli(limit))
        else:
            raise DecodeError(f"unsupported Content-Encoding {coding[:40]!r}")
    if not decoders:
        return IDENTITY
    return decoders[0] if len(decoders) == 1 else _Chain(decoders)
