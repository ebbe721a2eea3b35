"""Warm what the lane limits need before the first request (the policy itself is in policy.py)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .tokens import encoding

if TYPE_CHECKING:
    from ..core.runtime import Runtime


class LimitsWarmup:
    """The cl100k estimate is loaded off the event loop before the first request needs it."""

    def __init__(self, runtime: "Runtime") -> None:
        self.runtime = runtime

    async def start(self) -> None:
        lanes = self.runtime.snapshot.lanes.values()
        if any(lane.config.limits.max_context_tokens is not None for lane in lanes):
            threading.Thread(target=encoding, name="limits-warm-tiktoken", daemon=True).start()

    async def stop(self) -> None:
        pass
