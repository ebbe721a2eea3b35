"""Block keys from token ids: how the gateway and the engine's events name the same KV block.

vLLM's own block hash cannot be reproduced outside the engine process in general: the default
`--prefix-caching-hash-algo sha256` pickles its input, and the root of every chain (NONE_HASH) is
random per process unless PYTHONHASHSEED is fixed. SGLang hashes differently again. Every BlockStored
event, however, carries the block's token ids and its parent's hash. So the gateway names a block by
a content key of its own: the chain `key_i = xxh3_64(key_{i-1} || token ids of block i)`, computed
once from the event (the parent's key found through the parent's engine hash) and, for a prediction,
from the tokens of the gateway's render. Two blocks get the same key exactly when the engine's hashes
would agree (same tokens, same parents all the way to the start), whatever the engine's algorithm.

Blocks whose engine hash also depends on extra keys (images, LoRA, cache_salt: `extra_keys` in the
event) get the extra keys folded in, so a text-only prediction never claims them.

Its cost is the per-block Python loop, not the hashing.
"""

from __future__ import annotations

from array import array
from typing import Any, Iterable, Sequence

import orjson
import xxhash

ROOT = 0  # the parent key of a chain's first block


def _as_bytes(token_ids: Sequence[int]) -> bytes:
    if isinstance(token_ids, array) and token_ids.typecode == "I":
        return token_ids.tobytes()
    return array("I", token_ids).tobytes()


def block_key(parent: int, tokens: bytes, extra: Any = None) -> int:
    h = xxhash.xxh3_64(parent.to_bytes(8, "little"))
    h.update(tokens)
    if extra is not None:
        h.update(b"\x00extra")
        h.update(orjson.dumps(extra, default=repr))
    return h.intdigest()


def keys(token_ids: Sequence[int], block_size: int, parent: int = ROOT,
         extras: Iterable[Any] | None = None) -> list[int]:
    """The key of every full block of `token_ids` (a trailing partial block has none: engines cache
    whole blocks only)."""
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    raw = _as_bytes(token_ids)
    width = block_size * 4
    n = len(raw) // width
    out: list[int] = []
    extra_list = list(extras) if extras is not None else None
    key = parent
    digest = xxhash.xxh3_64_intdigest
    for i in range(n):
        chunk = raw[i * width:(i + 1) * width]
        extra = extra_list[i] if extra_list is not None and i < len(extra_list) else None
        if extra is None:
            key = digest(key.to_bytes(8, "little") + chunk)
        else:
            key = block_key(key, chunk, extra)
        out.append(key)
    return out
