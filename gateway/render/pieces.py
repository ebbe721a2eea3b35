"""Byte-level BPE without the Rust tokenizer's pre-tokenizer, for ASCII text: the same ids, faster.

Where the time goes in `tokenizers` (the DeepSeek tokenizer.json): most of an encode is the
pre-tokenizer (three regex Splits over NormalizedStrings that carry per-byte alignments, then the
byte-level map); the BPE merges themselves are cheap (its word cache hits). And for an agent's small
turn, a call into it has a fixed cost that is most of the turn's (its tables are cold between turns).

This module does what the tokenizer does, in the tokenizer's own order, with cheaper parts:
1. split the added tokens out (the tokenizer's two passes: its non-normalized added tokens, then, on
   what is between them, its normalized ones; leftmost-longest, as its Aho-Corasick matcher);
2. pre-tokenize what is between them with one `re` pattern equivalent, on ASCII text, to the
   tokenizer's Sequence of Splits (`\\p{N}{1,3}`, the CJK run, then the word pattern, each Isolated);
   non-ASCII text goes to the tokenizer itself (Unicode classes are the tokenizer's to decide);
3. map each piece to its ids through a dict; a piece not seen before is spelled in the vocabulary's
   characters (the byte-level map) and encoded by the tokenizer's own BPE model.

It is used only when the tokenizer's configuration is the one this equivalence was written for
(`PieceEncoder.for_tokenizer` checks it: pre-tokenizer, normalizer, model options, added-token flags);
tests check ids equal to the tokenizer's on the corpus and on generated text (tests/test_render_pieces.py).
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Sequence

from tokenizers import Tokenizer

# The pre-tokenizer this equivalence is written for (DeepSeek V3/V4 tokenizer.json), as its JSON says.
PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                                               "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*"
                                               "|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}

# On ASCII text: \p{N} is [0-9], \p{L} is [A-Za-z], \p{M} is empty, \p{P} and \p{S} together are the 32
# punctuation characters, \s is [\t\n\v\f\r ] (the CJK Split never matches). The digit Split runs first,
# so the word pattern sees digit runs as the ends of its pieces: here one pattern does both, with digits
# kept out of the word alternatives, and `(?!\S)` reading a digit as the end of a piece.
_WS = "\\t\\n\\x0b\\x0c\\r "
_PU = "!-/:-@\\[-`{-~"
ASCII_PIECE = re.compile(
    "[0-9]{1,3}"
    f"|[{_PU}][A-Za-z]+"
    f"|[^\\r\\nA-Za-z0-9{_PU}]?[A-Za-z]+"
    f"| ?[{_PU}]+[\\r\\n]*"
    f"|[{_WS}]*[\\r\\n]+"
    f"|[{_WS}]+(?![^{_WS}0-9])"
    f"|[{_WS}]+"
)

# Every ASCII character starts a match of ASCII_PIECE but these (control characters other than \s), which
# only an optional first character of a word allows: in a text without them the matches cover it.
_UNMATCHED = re.compile("[\\x00-\\x08\\x0e-\\x1f\\x7f]")

# Pieces kept (their ids): the 473K-token corpus has ~20K distinct pieces, ~117 bytes each with the
# table (2.3 MB), so a full table is ~23 MB.
MAX_PIECES = 200_000


def _byte_level() -> dict[int, str]:
    """The byte-level pre-tokenizer's map of ASCII bytes to the characters the BPE vocabulary spells
    them with (GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others from U+0100)."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return {b: c for b, c in out.items() if b < 128}


_ASCII_TO_VOCAB = str.maketrans(_byte_level())


def _trie_pattern(words: Sequence[str]) -> str:
    """A regex matching, at a position, the longest of `words` that starts there (a trie: at each
    character one branch can match, and a longer word is tried before the word ending here)."""
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 and "" not in node else "(?:" + "|".join(alts) + ")"
        return body + "?" if "" in node else body

    return emit(trie)


def _tokens(words: Sequence[str]) -> tuple[re.Pattern, re.Pattern] | None:
    """(their first characters, their trie) for `_found`."""
    if not words:
        return None
    return re.compile("[" + "".join(sorted({re.escape(w[0]) for w in words})) + "]"), re.compile(_trie_pattern(words))


class PieceEncoder:
    """The tokenizer's `encode(text, add_special_tokens=False).ids`, for a checked configuration."""

    def __init__(self, tok: Tokenizer, added: dict[str, tuple[int, bool]]) -> None:
        self._tok = tok
        self._model = tok.model
        self._ids = {content: i for content, (i, _) in added.items()}
        raw = [c for c, (_, normalized) in added.items() if not normalized]
        norm = [c for c, (_, normalized) in added.items() if normalized]
        self._raw = _tokens(raw)
        self._norm = _tokens(norm)
        self._pieces: dict[str, bytes] = {}  # piece -> its ids, array('I') bytes (joined in one copy)

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer) -> PieceEncoder | None:
        """An encoder for `tok` when its configuration is the one this module reproduces, else None."""
        try:
            pre = tok.pre_tokenizer
            normalizer = tok.normalizer
            spec = json.loads(pre.__getstate__()) if pre is not None else None
            norm = json.loads(normalizer.__getstate__()) if normalizer is not None else None
            model = tok.model
            if spec != PRE_TOKENIZER or norm not in (None, {"type": "Sequence", "normalizers": []}) or \
                    tok.truncation or tok.padding or getattr(tok, "encode_special_tokens", False):
                return None
            if type(model).__name__ != "BPE" or model.dropout or model.byte_fallback or \
                    model.continuing_subword_prefix or model.end_of_word_suffix or model.fuse_unk or \
                    getattr(model, "ignore_merges", False):
                return None
            added: dict[str, tuple[int, bool]] = {}
            for i, t in tok.get_added_tokens_decoder().items():
                if t.lstrip or t.rstrip or t.single_word or not t.content or t.content in added:
                    return None
                added[t.content] = (i, bool(t.normalized))
        except (AttributeError, TypeError, ValueError):  # a tokenizer of another make: not ours to shortcut
            return None
        return cls(tok, added)

    # -- encoding ---------------------------------------------------------------------------------
    def encode(self, text: str) -> array:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[array]:
        plans = [self._plan(t) for t in texts]
        # Text the tokenizer itself must read (not ASCII), all in one call.
        other = [p for plan in plans for p in plan if type(p) is str]
        if other:
            done = iter([array("I", e.ids).tobytes()
                         for e in self._tok.encode_batch_fast(other, add_special_tokens=False)])
            plans = [[next(done) if type(p) is str else p for p in plan] for plan in plans]
        try:
            return self._assemble(plans, self._pieces)
        except KeyError:  # pieces not seen before
            return self._assemble(plans, self._learn(plans))

    @staticmethod
    def _assemble(plans: list[list], table: dict[str, bytes]) -> list[array]:
        get = table.__getitem__
        join = b"".join
        out = []
        for plan in plans:
            ids = array("I")
            for p in plan:
                t = type(p)
                if t is int:
                    ids.append(p)
                elif t is list:
                    ids.frombytes(join(map(get, p)))
                else:
                    ids.frombytes(p)
            out.append(ids)
        return out

    def _plan(self, text: str) -> list:
        """The text as added-token ids (int), ASCII pieces (list of str) and other text (str)."""
        out: list = []
        pos = 0
        ids = self._ids
        for m in self._found(self._raw, text, 0, len(text)):
            s = m.start()
            if s > pos:
                self._between(text, pos, s, out)
            out.append(ids[m.group()])
            pos = m.end()
        if pos < len(text):
            self._between(text, pos, len(text), out)
        return out

    def _between(self, text: str, start: int, end: int, out: list) -> None:
        """Text between two non-normalized added tokens: its normalized added tokens (the normalizer is
        the identity), then what is between those."""
        pos = start
        ids = self._ids
        for m in self._found(self._norm, text, start, end):
            s = m.start()
            if s > pos:
                self._text(text[pos:s], out)
            out.append(ids[m.group()])
            pos = m.end()
        if pos < end:
            self._text(text[pos:end], out)

    @staticmethod
    def _found(tokens: tuple[re.Pattern, re.Pattern] | None, text: str, start: int, end: int):
        """Each added token of `tokens` in text[start:end], leftmost-longest: the next character that
        starts one (a character class search), then the trie there."""
        if tokens is None:
            return
        first, trie = tokens
        search, match = first.search, trie.match
        pos = start
        while True:
            f = search(text, pos, end)
            if f is None:
                return
            m = match(text, f.start(), end)
            if m is None:
                pos = f.start() + 1
            else:
                yield m
                pos = m.end()

    @staticmethod
    def _text(span: str, out: list) -> None:
        if not span.isascii():
            out.append(span)
            return
        if _UNMATCHED.search(span) is None:  # then the pattern's matches cover the text
            out.append(ASCII_PIECE.findall(span))
            return
        pieces, pos = [], 0  # characters no alternative matches (control characters): pieces of their own
        for m in ASCII_PIECE.finditer(span):
            if m.start() > pos:
                pieces.append(span[pos:m.start()])
            pieces.append(m.group())
            pos = m.end()
        if pos < len(span):
            pieces.append(span[pos:])
        out.append(pieces)

    def _learn(self, plans: list[list]) -> dict[str, bytes]:
        """Ids for the pieces not seen before: the tokenizer's BPE model on each (what its encode does
        with a piece once the byte-level pre-tokenizer has spelled it in the vocabulary's characters).
        Returns the table that now holds every piece of `plans` (a full table is replaced, never
        cleared, so another thread's table stays whole)."""
        known = self._pieces
        wanted: set[str] = set()
        for plan in plans:
            for p in plan:
                if type(p) is list:
                    wanted.update(p)
        new = wanted.difference(known)
        if len(known) + len(new) > MAX_PIECES:  # full: start again with this batch's pieces
            known = self._pieces = {}
            new = wanted
        tokenize = self._model.tokenize
        for w in new:
            known[w] = array("I", [t.id for t in tokenize(w.translate(_ASCII_TO_VOCAB))]).tobytes()
        return known
