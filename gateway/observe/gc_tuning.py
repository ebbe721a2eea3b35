"""The cyclic garbage collector, tuned for a process that must never stall its streams.

A full collection walks every tracked object: the imported code, templates and tokenizer alone
make it a stall of every stream in flight. And a long agent request (tens of thousands of
containers, freed by reference counting moments later) makes CPython run a full collection about
once per request with its default thresholds (700, 10, 10).

So, once the process has started: collect, then freeze what exists (it lives as long as the
process: the permanent generation is never walked again), and run the young collections less often.
Cyclic garbage still goes, a little later: the thresholds count allocations, not time.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("gateway.gc")

# Young objects between collections of generation 0, and collections of each generation between
# collections of the next; Settings.gc_thresholds (GATEWAY_GC_THRESHOLDS="50000,20,10") overrides,
# "default" keeps CPython's.
THRESHOLDS = (50_000, 20, 10)


def thresholds(raw: str = "") -> tuple[int, int, int] | None:
    """The thresholds `raw` asks for: empty, ours; "default", CPython's (None); "a,b,c"."""
    raw = raw.strip()
    if raw == "default":
        return None
    if raw:
        try:
            a, b, c = (int(x) for x in raw.split(","))
            if min(a, b, c) > 0:
                return a, b, c
        except ValueError:
            pass
        log.warning("GATEWAY_GC_THRESHOLDS=%r is not three positive integers; using %s", raw, THRESHOLDS)
    return THRESHOLDS


def settle(raw: str = "") -> None:
    """Call once start-up work (imports, templates, tokenizers) is done; `raw`: Settings.gc_thresholds."""
    gc.collect()
    gc.freeze()
    chosen = thresholds(raw)
    if chosen is not None:
        gc.set_threshold(*chosen)
