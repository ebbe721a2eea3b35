"""Units of the hostile-upstream helpers: what scrubbing removes and keeps, bounded decoding, SSE splitting."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest

from gateway.upstream.encoding import DecodeError, decoder_for
from gateway.relay.scrub import Scrubber
from gateway.relay.sse import BadStream, EventSplitter

KEY = "upstream-key-0123456789abcdefXYZ"


@pytest.mark.parametrize("text", [
    f"invalid key {KEY}", f"Authorization: Bearer {KEY}", f"api_key={KEY}&x=1", f'{{"token": "{KEY}"}}',
    "key sk-proj-abcdef0123456789", "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
    f"cut off: {KEY[:14]}", "AKIAABCDEFGHIJKLMNOP used",
])
def test_secrets_are_removed(text: str) -> None:
    out = Scrubber([KEY]).text(text)
    assert KEY[:12] not in out and "[redacted]" in out
    assert "sk-proj-abcdef" not in out and "AKIAABCD" not in out and "eyJzdWIi" not in out


@pytest.mark.parametrize("text", [
    "This model's maximum context length is 131072 tokens. However, you requested 140000 tokens.",
    "'max_tokens' must be at least 1, got 0.", "The model `deepseek-ai/DeepSeek-V4.1-Flash` does not exist.",
    "top_logprobs must be <= 32",
])
def test_ordinary_error_text_is_kept(text: str) -> None:
    assert Scrubber([KEY]).text(text) == text


def test_codes_are_identifiers_or_dropped() -> None:
    s = Scrubber([KEY])
    assert s.code("BadRequestError") == "BadRequestError" and s.code(400) == 400
    assert s.code(KEY) is None and s.code("a b") is None and s.code(True) is None and s.code({"x": 1}) is None


@pytest.mark.parametrize("coding,pack", [("gzip", gzip.compress), ("deflate", zlib.compress), ("br", brotli.compress)])
def test_decoding_any_split(coding: str, pack) -> None:
    body = b'{"choices": []}' * 100
    wire = pack(body)
    for step in (1, 7, len(wire)):
        d = decoder_for(coding, 1 << 20)
        out = b"".join(d.feed(wire[i:i + step]) for i in range(0, len(wire), step)) + d.finish()
        assert out == body


def test_raw_deflate_and_truncation_and_bombs() -> None:
    c = zlib.compressobj(wbits=-15)
    raw = c.compress(b"hello") + c.flush()
    d = decoder_for("deflate", 1 << 20)
    assert d.feed(raw) + d.finish() == b"hello"
    d = decoder_for("gzip", 1 << 20)
    d.feed(gzip.compress(b"x" * 1000)[:-6])
    with pytest.raises(DecodeError):
        d.finish()
    with pytest.raises(DecodeError):
        decoder_for("gzip", 1000).feed(gzip.compress(b"\0" * 10_000_000))
    with pytest.raises(DecodeError):
        decoder_for("zstd", 1000)


def test_sse_splitting_with_every_line_ending_cut_anywhere() -> None:
    for eol in (b"\n", b"\r\n", b"\r"):
        stream = b"".join(b"data: " + str(i).encode() + eol + eol for i in range(5))
        for step in range(1, 8):
            sp = EventSplitter()
            events = [e for i in range(0, len(stream), step) for e in sp.feed(stream[i:i + step])]
            events += sp.feed(b"", final=True)
            assert events == [b"data: %d\n\n" % i for i in range(5)], (eol, step)


def test_an_endless_event_is_refused() -> None:
    sp = EventSplitter(max_bytes=1000)
    with pytest.raises(BadStream):
        for _ in range(20):
            sp.feed(b"data: " + b"x" * 100)


@pytest.mark.parametrize("text", [
    "Authorization: Bearer sk-live-0123456789abcdef", "token=[abc123def]", "api_key: '[x]'", "password=hunter2",
    "Bearer [redacted]", "secret=[redacted] and more",
])
def test_a_redaction_is_never_redacted_again(text: str) -> None:
    once = Scrubber().text(text)
    assert Scrubber().text(once) == once
    assert "[redacted]]" not in once
