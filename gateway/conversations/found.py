"""What the conversation policy learnt about a request on the hot path (`ex.conversation`), read by
routing, admission and the analysis after the response."""

from __future__ import annotations

from dataclasses import dataclass

from . import effort as effort_mod
from .identity import Lineage
from .state import ConversationState


@dataclass
class Found:
    """What the hot path learnt, handed to the analyzer through ex.conversation."""

    state: ConversationState
    lineage: Lineage
    is_new: bool
    anchor_turn: int | None  # the turn whose output this request continues (lineage only)
    requested: effort_mod.EffortChoice
    repinned: bool = False
