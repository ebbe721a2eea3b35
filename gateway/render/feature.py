"""Give every lane its renderer (exact, from its template) or, without a template, an estimator."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .cache import default_cache
from .options import options_for_lane
from .renderer import Renderer

if TYPE_CHECKING:
    from ..app import Gateway
    from ..runtime import LaneRuntime

log = logging.getLogger("gateway.render")


def attach(lane: "LaneRuntime") -> None:
    if lane.config.render.template:
        lane.extras["renderer"] = Renderer(options_for_lane(lane.config), cache=default_cache())
    else:
        try:
            from .estimate import Estimator
        except ImportError:  # estimator not available: message-level analysis is skipped
            return
        lane.extras["estimator"] = Estimator(engine=lane.config.engine)


def install(gw: "Gateway") -> None:
    gw.runtime.lane_hooks.append(attach)
    gw.runtime.rerun_lane_hooks()

    async def preload() -> None:
        # Loading a 128K-entry tokenizer holds the GIL for about half a second: do it before serving,
        # not in the middle of the first analysis (where it would stall every stream in flight).
        import asyncio

        from .template import load_template
        from .tokenizer import load_tokenizer

        renders = [lane.config.render for lane in gw.runtime.snapshot.lanes.values() if lane.config.render.template]
        for path in {r.tokenizer_path for r in renders}:
            await asyncio.to_thread(load_tokenizer, path)
        for name in {r.template for r in renders}:
            await asyncio.to_thread(load_template, name)

    gw.startup.append(preload)
