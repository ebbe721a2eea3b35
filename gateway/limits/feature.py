"""Install the lane limits: a hot-path policy, and a lane hook that plans each lane's checks once."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .policy import LimitsPolicy
from .tokens import encoding

if TYPE_CHECKING:
    from ..app import Gateway


def install(gw: "Gateway") -> None:
    policy = LimitsPolicy()
    gw.runtime.policies.append(policy)
    gw.runtime.lane_hooks.append(policy.attach)
    for lane in gw.runtime.snapshot.lanes.values():  # lanes built before this feature was installed
        policy.attach(lane)
    gw.services["limits"] = policy

    def warm() -> None:
        # The cl100k estimate is loaded off the event loop before the first request needs it.
        lanes = gw.runtime.snapshot.lanes.values()
        if any(lane.config.limits.max_context_tokens is not None for lane in lanes):
            threading.Thread(target=encoding, name="limits-warm-tiktoken", daemon=True).start()

    gw.startup.append(warm)
