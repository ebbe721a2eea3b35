"""A lane's render settings (routes.yaml `render:`) as renderer options."""

from __future__ import annotations

from ..core.config import Lane
from .result import RenderOptions


def options_for_lane(lane: Lane) -> RenderOptions:
    r = lane.render
    return RenderOptions(
        template=r.template,  # None: no template, message-level analysis (estimate.py)
        thinking=r.thinking,
        reasoning_effort=r.default_effort,
        effort_map=r.effort_map,
        drop_thinking=r.drop_thinking,
        tokenizer_path=r.tokenizer_path,
        # vLLM normalises requests before templating (e.g. joins text-only tool content with "\n");
        # the renderer must do the same to match its prompt byte for byte.
        engine="vllm" if lane.engine == "vllm" else "sglang",
    )
