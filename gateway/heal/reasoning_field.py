"""The reasoning under `reasoning` instead of `reasoning_content`: moved to the name the template reads.

vLLM streams reasoning as `reasoning` and clients echo it back under that name (or rename SGLang's
`reasoning_content`); the DeepSeek-V4.1 template reads `reasoning_content` (SGLang passes messages as
they are; vLLM copies `reasoning_content` to `reasoning` and gives the template both). Moving the text
to `reasoning_content` is what vLLM does itself, and the only way SGLang's template sees it. Applies
when the text is exactly the relayed reasoning, and `reasoning_content` is absent or empty.
"""

from __future__ import annotations

from typing import Any

from .base import POP, TEMPLATE_FIELD, Relayed, Updates, client_reasoning


class ReasoningField:
    name = "reasoning_field"

    def plan(self, msg: dict[str, Any], relayed: Relayed) -> Updates | None:
        field, text = client_reasoning(msg)
        if field is None or field == TEMPLATE_FIELD or text != relayed.reasoning:
            return None
        return {TEMPLATE_FIELD: text, field: POP}
