"""Where a turn's analysis runs: a tiny turn on a quiet lane is analysed on the event loop itself.

The analysis worker (worker.py) keeps the event loop free of long analyses, but for a tiny turn the
trip costs more than the work. Measured at concurrency 1 (2 cores, loadgen beside the shared stub,
alternated with the build before this): a one-message chat cost the worker ~0.33-0.40 ms of CPU,
the same analysis in a tight loop 0.08 ms. The worker wakes for each turn with its caches cold:
the same turn analysed after a 0.5 ms sleep costs 0.22 ms, after 1 ms 0.26 ms. The hand-off
(pickling, the pipe, the answer) cost the event loop ~0.1 ms as well. Analysed here instead, the
gateway's CPU per request went 0.94-1.08 -> 0.69-0.82 ms (small chat) and 2.16-2.39 -> 1.54-1.94 ms
(a 256-token stream), with latency unchanged within the noise.

Only when it cannot cost anyone anything:
* the turn is tiny: its request's bytes and its answer's characters, together, at most `max_bytes`
  (GATEWAY_ANALYSIS_INLINE_BYTES, default 2048, settings.py; 0: never). What it costs is tokenising
  text not seen before: ~0.25 ms for 1 KB of new words, ~0.4 ms for 2 KB, ~1.2 ms at worst of 300;
* nothing else of the lane is in flight and the worker has nothing in hand: the turns of a burst or
  a busy lane go to the worker in batches, 16 turns a batch costing the loop ~29 µs each (analysed
  here whenever the worker was idle, a concurrency-32 run lost 9% of its throughput; with this rule
  it matched the build before);
* the lane's tokenizer (or, on a lane without a template, the estimate's) is already loaded in this
  process (a load holds the loop ~0.5 s).

The analysis reads the same bytes, with the same code (analyzer.analyse_job), as in the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exchange import Exchange
from ..render.estimate import encoding_loaded
from ..render.tokenizer import loaded

if TYPE_CHECKING:
    from ..runtime import LaneRuntime
    from .worker import AnalysisProcess


def runs_inline(ex: Exchange, lane: "LaneRuntime", process: "AnalysisProcess | None", max_bytes: int) -> bool:
    if process is None or ex.body_bytes > max_bytes or lane.inflight or not process.idle():
        return False
    renderer = lane.renderer
    if not (loaded(renderer.defaults.tokenizer_path) if renderer is not None else encoding_loaded()):
        return False
    g = ex.generated
    n = ex.body_bytes + sum(map(len, g.content)) + sum(map(len, g.reasoning))
    for call in g.tool_calls.values():
        n += len(call["function"]["arguments"]) + len(call["function"]["name"])
    return n <= max_bytes
