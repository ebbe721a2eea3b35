"""Shared state (conversations, anchors, alerts): in memory by default, Redis when configured."""

from .base import StateStore
from .memory import MemoryStore

__all__ = ["StateStore", "MemoryStore"]
