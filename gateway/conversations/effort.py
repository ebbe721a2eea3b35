"""What thinking mode and reasoning effort a request asks for, as the lane will render them.

Effort is compared as the rendered number (lanes map words differently: SGLang's reference
renders "high" as 50, the model card's encoder as 75), so a pin survives a client switching
between equivalent spellings, and a real change is caught whatever the spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.config import DEFAULT_EFFORT_MAP, EFFORT_WORDS, Lane
from ..core.errors import invalid_request
from ..render.effort import ENGINE_WORDS, effort_number, effort_word

__all__ = ["DEFAULT_EFFORT_MAP", "EFFORT_WORDS", "EffortChoice", "accepted_efforts", "apply_to_body", "resolve"]


@dataclass(frozen=True)
class EffortChoice:
    thinking: bool
    effort: int | str | None  # rendered number on template lanes; the raw value elsewhere
    raw_effort: Any  # what the request said (None: lane default)


def requested_thinking(body: dict[str, Any], default: bool) -> bool:
    kwargs = body.get("chat_template_kwargs") or {}
    for key in ("thinking", "enable_thinking"):
        if isinstance(kwargs.get(key), bool):
            return kwargs[key]
    t = body.get("thinking")
    if isinstance(t, bool):
        return t
    if isinstance(t, dict) and t.get("type") in ("enabled", "disabled"):
        return t["type"] == "enabled"
    if body.get("reasoning_effort") == "none":
        return False
    return default


def requested_effort(body: dict[str, Any]) -> Any:
    effort = body.get("reasoning_effort")
    if effort is None or effort == "none":
        effort = (body.get("chat_template_kwargs") or {}).get("reasoning_effort")
    return None if effort == "none" else effort


def effort_map(lane: Lane) -> dict[str, int]:
    return dict(lane.render.effort_map or DEFAULT_EFFORT_MAP)


def accepted_efforts(lane: Lane) -> str:
    """What the 400 lists: every word the lane maps, `none`, and the integer range."""
    words = ["none", *lane.render.effort_map] if lane.render.effort_map else list(EFFORT_WORDS)
    return ", ".join(dict.fromkeys(words)) + " or an integer 1-100"


def _invalid(value: Any, lane: Lane):
    return invalid_request(f"invalid reasoning_effort {str(value)[:40]!r}: expected {accepted_efforts(lane)}",
                           param="reasoning_effort", code="invalid_value")


def resolve(body: dict[str, Any], lane: Lane) -> EffortChoice:
    """The request's effective (thinking, effort) on this lane; an invalid effort is a 400."""
    thinking = requested_thinking(body, lane.render.thinking)
    raw = requested_effort(body)
    value = raw if raw is not None else lane.render.default_effort
    if lane.render.template is None:
        # No template to render it: the engine reads the value; only a word nobody knows is refused.
        if type(value) is str and value not in EFFORT_WORDS and value not in (lane.render.effort_map or ()):
            raise _invalid(value, lane)
        return EffortChoice(thinking, value, raw)
    try:
        number = effort_number(value, lane.render.effort_map)
    except ValueError:
        raise _invalid(value, lane) from None
    return EffortChoice(thinking, number, raw)


def needs_translation(choice: EffortChoice) -> bool:
    """The client named its effort with a word the engines' own encoders refuse (minimal, medium)."""
    return type(choice.raw_effort) is str and choice.raw_effort not in ENGINE_WORDS and choice.raw_effort != "none"


def apply_to_body(body: dict[str, Any], lane: Lane, thinking: bool, effort: int | str | None) -> None:
    """Rewrite the request so the engine renders exactly (thinking, effort), however it reads them
    (render/told.py, which also states the lane's drop_thinking)."""
    from ..render.told import tell

    tell(body, lane, thinking, effort if isinstance(effort, int) else None)


def _word_for(lane: Lane, effort: int | str | None) -> str | None:
    if effort is None or isinstance(effort, str):
        return effort if isinstance(effort, str) else None
    # Only a word the engine itself knows, and only when it names this number alone among them
    # (medium and high are both 50 by default: "high" goes); otherwise the number goes.
    return effort_word(effort, lane.render.effort_map)
