"""Give every lane its renderer (exact, from its template) or, without a template, an estimator."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .cache import default_cache
from .options import options_for_lane
from .renderer import Renderer

if TYPE_CHECKING:
    from ..core.runtime import LaneRuntime, Runtime

log = logging.getLogger("gateway.render")


def attach(lane: "LaneRuntime") -> None:
    """Lane hook: the lane's renderer, or its estimator when it has no template."""
    if lane.config.render.template:
        lane.renderer = Renderer(options_for_lane(lane.config), cache=default_cache())
    else:
        from .estimate import Estimator

        lane.estimator = Estimator(engine=lane.config.engine)


class RenderPreload:
    """Load the lanes' tokenizers and templates before serving.

    Loading a 128K-entry tokenizer holds the GIL for about half a second: do it before serving,
    not in the middle of the first analysis (where it would stall every stream in flight).
    """

    def __init__(self, runtime: "Runtime") -> None:
        self.runtime = runtime

    async def start(self) -> None:
        from .template import load_template
        from .tokenizer import load_tokenizer

        renders = [lane.config.render for lane in self.runtime.snapshot.lanes.values() if lane.config.render.template]
        for path in {r.tokenizer_path for r in renders}:
            await asyncio.to_thread(load_tokenizer, path)
        for name in {r.template for r in renders if r.template}:
            await asyncio.to_thread(load_template, name)

    async def stop(self) -> None:
        pass
