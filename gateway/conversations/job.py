"""One finished turn as plain data: what its analysis reads and what it gives back.

Both cross a process boundary (the analysis worker, worker.py), so they hold values, never the
Exchange, the lane runtime or a renderer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.verdict import CacheVerdict
from ..pipeline.body_parts import Body
from ..render.result import RenderOptions
from .drift import Divergence
from .handoff import InRing
from .state import ConversationState


@dataclass
class Job:
    request_id: str
    lane: str
    lane_render: RenderOptions | None  # the lane's renderer settings; None: no template (estimated analysis)
    options: RenderOptions  # this turn's (thinking and effort as applied)
    block_size: int
    engine: str
    prefill_tokens_per_s: float
    # the request as forwarded: parsed (threads) or its JSON (worker process: a large one as its place in
    # shared memory until the worker takes it, handoff.py; in parts until handoff.pack joins or places them)
    body: dict[str, Any] | Body | InRing
    generated: dict[str, Any]  # the assistant message the response carried
    finish_reason: str | None
    usage: dict[str, Any] | None
    thinking: bool | None
    effort: int | str | None
    rewritten: dict[str, Any] | None  # what the limits rewrote in the history, if anything
    replica: str | None
    rehomed: bool  # the router moved the conversation away from its cache for this turn
    repinned: bool
    state: ConversationState  # as the hot path found it
    healed: tuple[tuple[str, int], ...] = ()  # drift healing's repairs (kind, message index)
    stored: bytes | None = None  # the freshest stored state (another worker or process may have moved on)
    # what the engine prefilled (vLLM return_token_ids), if it said; bytes: their JSON (render_check.py)
    prompt_token_ids: list[int] | bytes | None = None
    generated_token_ids: list[int] | None = None  # what the engine generated, if it said
    token_ids_why: str | None = None  # why the engine gave no prompt ids (the record then compares counts)
    kv_block_size: int | None = None  # the lane has KV events; key the render's blocks this size
    last_in_stored: bool = False  # `state` was sent without its previous turn's print: read it from `stored`
    # The previous render's token ids ((tokenizer, digest, length), ids), when it was analysed on the event
    # loop and the conversation now moves to the worker (inline.py): compared token by token, not coarsely.
    seed_tokens: list[tuple[Any, Any]] | None = None
    rejoined: bool = False  # found through an earlier answer: the client retried or edited its last turn


@dataclass
class Outcome:
    cache: CacheVerdict
    turn: int  # of the new state
    data: bytes  # the new state, encoded
    divergence: Divergence | None
    snippets: tuple[str, str] | None
    kv_keys: bytes | None = None  # block keys of the render + output (array('Q'), gateway/kvevents)
    kv_ends: bytes | None = None  # render tokens through each request message (array('I'))
