"""Cache-protecting admission's scenario: a lane whose pool (`admission.pool_tokens`) holds one large
conversation, and newcomers of a given size that it may or may not hold beside it."""

from __future__ import annotations

from typing import Any

from tests.support.routes import agent_lane, routes

POOL = 4500  # tokens: one newcomer of 1800 words fits, a second one beside it does not


def newcomer(topic: str, words: int, history: list | None = None) -> dict[str, Any]:
    """The first turn of a new conversation of about `words` tokens on public model "ds" (`history`:
    what the client appends in its next turns)."""
    messages = [{"role": "user", "content": f"{topic}: " + "lorem " * words}, *(history or [])]
    return {"model": "ds", "max_tokens": 8, "messages": messages}


def admission_routes(url: str, **admission: Any) -> dict[str, Any]:
    """One agent lane "ds" with a pool of POOL tokens; `admission`: the rest of its admission section."""
    return routes({"ds": agent_lane(url, admission={"pool_tokens": POOL, **admission})})


def diverting_routes(url: str) -> dict[str, Any]:
    """Lane "ds" diverts a newcomer it cannot hold to lane "ds-b" (the same pool size, on the same
    engine); public model "ds" only."""
    return routes({"ds": agent_lane(url, admission={"pool_tokens": POOL, "policy": "divert", "divert_to": ["ds-b"],
                                                    "hold_s": 1, "idle_after_s": 60}),
                   "ds-b": agent_lane(url, admission={"pool_tokens": POOL, "idle_after_s": 60})},
                  {"ds": "ds"})
