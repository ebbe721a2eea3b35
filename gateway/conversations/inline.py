"""Where a turn's analysis runs: a tiny turn on a quiet lane is analysed on the event loop itself.

The analysis worker (worker.py) keeps the event loop free of long analyses, but for a tiny turn the
trip costs more than the work: the worker wakes for each turn with its caches cold, and the hand-off
(pickling, the pipe, the answer) costs the event loop as well. Analysed here instead, a small chat
or a short stream costs the gateway less CPU per request, with latency unchanged (the figures:
docs/performance.md).

Only when it cannot cost anyone anything:
* the turn is tiny: its request's bytes and its answer's characters, together, at most `max_bytes`
  (GATEWAY_ANALYSIS_INLINE_BYTES, default 2048, settings.py; 0: never). What it costs is tokenising
  text not seen before, which grows with the text: the bound keeps it below a millisecond;
* nothing else of the lane is in flight and the worker has nothing in hand: the turns of a burst or
  a busy lane go to the worker in batches, which cost the loop little per turn (analysed here
  whenever the worker is idle, a busy lane's turns take the loop's time from its requests and
  throughput falls);
* the lane's tokenizer (or, on a lane without a template, the estimate's) is already loaded in this
  process (loading one would hold the loop for a long time);
* the conversation is new, or its turns so far were analysed here. A turn is compared with the
  previous one token by token, through the token ids of the previous render that the analysing
  process still holds. So a conversation moves once, here -> worker, when it outgrows the bound or
  its lane is busy, and takes those ids along (`Placement.seeds`). Without them the worker compared
  coarsely: on the real engine, a drift's cause read `unknown` instead of
  `reasoning_dropped_by_template`.

The analysis reads the same bytes, with the same code (analysis.analyse_job), as in the worker.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ..core.exchange import Exchange
from ..render.estimate import ENCODING_NAME, encoding_loaded
from ..render.tokenizer import load_tokenizer, loaded
from .state import ConversationState

if TYPE_CHECKING:
    from ..core.runtime import LaneRuntime
    from .worker import AnalysisProcess

MAX_CONVERSATIONS = 10_000  # remembered as analysed here (~100 bytes each); one forgotten goes to the worker


class Placement:
    """Which turns the event loop analyses itself (the rules above), and the conversations it has."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._here: OrderedDict[str, None] = OrderedDict()  # conversations analysed here so far

    def here(self, ex: Exchange, lane: "LaneRuntime", process: "AnalysisProcess | None", cid: str,
             new: bool) -> bool:
        if process is None or ex.body_bytes > self.max_bytes or lane.inflight or not process.idle():
            return False
        if not new and cid not in self._here:
            return False
        renderer = lane.renderer
        if not (loaded(renderer.defaults.tokenizer_path) if renderer is not None else encoding_loaded()):
            return False
        g = ex.generated
        n = ex.body_bytes + sum(map(len, g.content)) + sum(map(len, g.reasoning))
        for call in g.tool_calls.values():
            n += len(call["function"]["arguments"]) + len(call["function"]["name"])
        return n <= self.max_bytes

    def analysed_here(self, cid: str) -> None:
        self._here[cid] = None
        self._here.move_to_end(cid)
        while len(self._here) > MAX_CONVERSATIONS:
            self._here.popitem(last=False)

    def seeds(self, cid: str, lane: "LaneRuntime", stored: bytes | None) -> list[tuple[Any, Any]] | None:
        """For a conversation analysed here that moves to the worker: the token ids of its last render
        (prompt and answer) from this process's cache, for the worker's (None: it was never here)."""
        if cid not in self._here:
            return None
        del self._here[cid]
        if stored is None:
            return None
        last = ConversationState.from_bytes(stored).last
        renderer = lane.renderer
        cache = renderer.cache if renderer is not None else lane.estimator.cache if lane.estimator is not None else None
        if last is None or cache is None:
            return None
        name = load_tokenizer(renderer.defaults.tokenizer_path).path if renderer is not None else ENCODING_NAME
        keys = [(name, d, n) for prints in (last.segments, last.generated)
                for d, n in zip(prints.digests, prints.lengths)]
        return [(k, ids) for k, ids in zip(keys, cache.get_tokens(keys)) if ids is not None]
