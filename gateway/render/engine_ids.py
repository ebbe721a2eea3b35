"""The engine's own prompt ids cut into the render's segments, instead of tokenising them again.

vLLM returns the ids it prefilled (`return_token_ids`, the lane's `token_ids: auto`). Where they spell the
rendered prompt byte for byte, each segment's ids are the run of them that spells its text: segments
are cut where tokenisation cannot merge across (renderer.py groups items at special tokens), so the
engine's ids of the whole prompt are the ids of its segments end to end. Spelling the ids back costs a
table lookup per id; tokenising the same text costs several times more.

What is checked before the engine's ids are used: they spell the rendered text exactly (an engine that
rendered other text, a template difference, keeps the tokenizer's ids and the render check reports it);
every segment ends on an id boundary; and the tokenizer's ids of one segment in `SPOT_EVERY` (the first
included) equal the engine's, so a lane whose tokenizer spells the same text with other ids tokenises
as before.
"""

from __future__ import annotations

import bisect
import json
from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import Protocol, cast

from tokenizers import Tokenizer

# One segment in this many (the first included) is tokenised too and compared with the engine's ids.
SPOT_EVERY = 16


class Encoder(Protocol):
    def encode_batch(self, texts: Sequence[str]) -> list[array]: ...


def _unicode_to_byte() -> dict[int, int]:
    """The inverse of the byte-level map (GPT-2's bytes_to_unicode): vocabulary character -> byte."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = b
        else:
            out[256 + extra] = b
            extra += 1
    return out


class Spelling:
    """Each token id's bytes: a byte-level BPE token's characters mapped back to bytes, an added
    token's own text."""

    def __init__(self, spelled: list[bytes | None]) -> None:
        # None (an id the vocabulary does not have) makes the join below raise TypeError.
        self._spelled = cast("list[bytes]", spelled)
        self._lengths = [len(b) if b is not None else 0 for b in spelled]

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer) -> Spelling | None:
        """The table for `tok` when it decodes byte-level BPE with no normalizer, else None."""
        try:
            decoder = json.loads(tok.decoder.__getstate__()) if tok.decoder is not None else None
            normalizer = json.loads(tok.normalizer.__getstate__()) if tok.normalizer is not None else None
            if not decoder or decoder.get("type") != "ByteLevel" or \
                    normalizer not in (None, {"type": "Sequence", "normalizers": []}):
                return None
            vocab = tok.get_vocab(with_added_tokens=True)
            added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
        except (AttributeError, TypeError, ValueError):  # a tokenizer of another make
            return None
        to_byte = str.maketrans({chr(c): chr(b) for c, b in _unicode_to_byte().items()})
        spelled: list[bytes | None] = [None] * (max(vocab.values()) + 1)
        for token, i in vocab.items():
            if i in added:
                spelled[i] = added[i].encode()
                continue
            try:
                spelled[i] = token.translate(to_byte).encode("latin-1")
            except UnicodeEncodeError:  # a character outside the byte-level map: not this make
                return None
        return cls(spelled)

    def cut(self, ids: Sequence[int], texts: Sequence[str], wanted: Sequence[int],
            tok: Encoder) -> list[array] | None:
        """The engine's ids of `texts[j]` for each j in `wanted` (`texts`: every segment's text in
        prompt order), or None when `ids` do not spell the texts end to end or the spot check fails."""
        if not wanted or not ids:
            return None
        encoded = [t.encode() for t in texts]
        try:
            at = array("I", ids)  # a negative id or one past 32 bits raises OverflowError
            if b"".join(map(self._spelled.__getitem__, at)) != b"".join(encoded):
                return None
        except (TypeError, IndexError, OverflowError):  # an id the vocabulary does not have
            return None
        ends = list(accumulate(map(self._lengths.__getitem__, at)))  # byte offset after each id
        out: list[array] = []
        wanted_set = set(wanted)
        offset = start = 0
        for j, b in enumerate(encoded):
            if not b:
                if j in wanted_set:
                    out.append(array("I"))
                continue
            offset += len(b)
            end = bisect.bisect_left(ends, offset, start) + 1
            if end > len(ends) or ends[end - 1] != offset:  # a segment ends inside a token
                return None
            if j in wanted_set:
                out.append(at[start:end])
            start = end
        spot = wanted[::SPOT_EVERY]
        if tok.encode_batch([texts[j] for j in spot]) != [out[k] for k in range(0, len(wanted), SPOT_EVERY)]:
            return None
        return out
