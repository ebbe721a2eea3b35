"""What an engine does to a request before its chat template sees it (kept for its callers).

The rules, each with the engine file and function it follows, live in normalize.py.
"""

from __future__ import annotations

from .normalize import ENGINES, template_messages, template_response_format, template_tools

normalize_messages = template_messages
normalize_tools = template_tools

__all__ = ["ENGINES", "normalize_messages", "normalize_tools", "template_response_format"]
