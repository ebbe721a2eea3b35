"""Reasoning effort: the one lookup from a request's word or number to the number the prompt carries.

Every part that maps effort (the hot path's pin in conversations/effort.py, the renderer, what the
engine is told in render/told.py) calls `effort_number`, so adding words to a lane's `render.effort_map`
(e.g. OpenAI's `medium`, `minimal`) changes them all at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.config import DEFAULT_EFFORT_MAP as CONFIG_DEFAULT_EFFORT_MAP

# SGLang's reference encoder (encoding_dsv41.py REASONING_EFFORT_MAPPINGS) plus OpenAI's words (config.py
# fills every lane's map); the model card's own encoder maps low/high/max to 50/75/100, so lanes configure theirs.
DEFAULT_EFFORT_MAP: Mapping[str, int] = CONFIG_DEFAULT_EFFORT_MAP
DEFAULT_EFFORT = "high"
# The words SGLang's and vLLM's DeepSeek-V4.1 encoders accept themselves; others are told as the number.
ENGINE_WORDS = ("low", "high", "xhigh", "max")


def effort_map(configured: Mapping[str, int] | None) -> Mapping[str, int]:
    return configured if configured else DEFAULT_EFFORT_MAP


def effort_number(value: Any, emap: Mapping[str, int] | None) -> int:
    """The number 1-100 the template renders for `value` (None: the default word); ValueError otherwise."""
    m = effort_map(emap)
    if value is None:
        value = DEFAULT_EFFORT
    if type(value) is int and 1 <= value <= 100:
        return value
    if type(value) is str and value in m:
        return int(m[value])
    raise ValueError(f"invalid reasoning effort {value!r}; expected an integer 1-100 "
                     f"or one of {', '.join(map(str, m))}")


def effort_word(number: int | None, emap: Mapping[str, int] | None) -> str | None:
    """The lane's only engine-known word for `number`, if it has exactly one (medium and high are both
    50 by default: "high")."""
    if number is None:
        return None
    words = [w for w, n in effort_map(emap).items() if n == number and w in ENGINE_WORDS]
    return words[0] if len(words) == 1 else None
