"""Prompt rendering: exact DeepSeek-V4.1 prompts (template + real tokenizer) and estimates for other lanes."""

from .cache import SegmentCache, default_cache
from .checks import effective_effort
from .renderer import Renderer
from .result import Rendered, RenderError, RenderOptions, Segment
from .told import options_for_request

__all__ = [
    "Rendered",
    "RenderError",
    "Renderer",
    "RenderOptions",
    "Segment",
    "SegmentCache",
    "default_cache",
    "effective_effort",
    "options_for_request",
]
