"""The render check: the ids the engine says it prefilled (vLLM `return_token_ids`) against the render's.

An append-only turn of a long session repeats the previous turn's prompt, and so do the engine's ids of
it: their JSON starts with the previous turn's. When the previous turn's ids matched its render, the
JSON of them (up to the byte before its closing bracket) is remembered by its hash (`Checked`); a next
turn whose JSON starts with the same bytes, and whose render starts with the previous render's ids as
far (the comparison's common prefix), needs only its new ids parsed and compared. Anything else is
compared whole, as the first turn is. The result is the same either way.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import orjson
import xxhash

from ..pipeline.token_ids import parse_ids
from .drift import common_prefix


@dataclass(frozen=True)
class Checked:
    """The engine's prompt ids of a turn, equal to its render: `tokens` ids, whose JSON without its
    closing bracket is `offset` bytes hashing to `digest` (xxh3-64)."""

    tokens: int
    offset: int
    digest: int


@dataclass(frozen=True)
class RenderCheck:
    matches: bool
    first_difference: int | None  # the first id that differs, when they do not match
    checked: Checked | None  # what the next turn can start from (None: nothing to remember)


def check(engine: bytes | list[int], parsed: list[int] | None, ours: array, common: int,
          before: Checked | None) -> RenderCheck:
    """`engine`: the engine's ids (their JSON, or parsed); `parsed`: the same parsed, if the caller has
    it; `ours`: the render's ids; `common`: how many leading ids of this render are the previous
    turn's (prompt and output, drift.compare); `before`: the previous turn's `Checked`."""
    if isinstance(engine, bytes) and parsed is None and before is not None and before.tokens <= common:
        tail = _after(engine, before)
        if tail is not None:
            mine = ours[before.tokens:]
            if tail == mine:
                return RenderCheck(True, None, _checked(engine, len(ours)))
            k = common_prefix(tail, mine)
            return RenderCheck(False, before.tokens + k, None)
    whole = parsed if parsed is not None else parse_ids(engine) if isinstance(engine, bytes) else engine
    try:
        theirs = array("I", whole)
    except (OverflowError, TypeError):  # not ids: a negative or huge number, or not a number
        return RenderCheck(False, 0, None)
    if theirs == ours:
        return RenderCheck(True, None, _checked(engine, len(ours)) if isinstance(engine, bytes) else None)
    return RenderCheck(False, common_prefix(theirs, ours), None)


def _checked(engine: bytes, tokens: int) -> Checked | None:
    end = engine.rstrip().rfind(b"]")
    if end < 0:
        return None
    return Checked(tokens, end, xxhash.xxh3_64_intdigest(engine[:end]))


def _after(engine: bytes, before: Checked) -> array | None:
    """The ids after the previous turn's, when this JSON starts with the previous turn's, else None."""
    head = engine[:before.offset]
    if len(head) < before.offset or xxhash.xxh3_64_intdigest(head) != before.digest:
        return None
    rest = engine[before.offset:].lstrip()
    if rest.startswith(b"]"):
        return array("I")
    if not rest.startswith(b","):
        return None
    try:
        tail = orjson.loads(b"[" + rest[1:])
        return array("I", tail) if isinstance(tail, list) else None
    except (orjson.JSONDecodeError, OverflowError, TypeError):
        return None
