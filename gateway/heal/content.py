"""Assistant content trimmed or re-encoded by the client: the relayed text.

Applies when the client's text equals the relayed text after `norm_text` (literal \\uXXXX escapes
decoded, Unicode NFC, whitespace at the ends trimmed) and differs in bytes. Only strings: content
parts or a null content are the client's own shape, left alone.
"""

from __future__ import annotations

from typing import Any

from .base import Relayed, Updates, norm_text


class Content:
    name = "content"

    def plan(self, msg: dict[str, Any], relayed: Relayed) -> Updates | None:
        text = msg.get("content")
        if not isinstance(text, str) or text == relayed.content or not relayed.content:
            return None
        if norm_text(text) != norm_text(relayed.content):
            return None
        return {"content": relayed.content}
