"""The switches a process holds in module state, set from Settings once, before anything renders.

The render's caches (templates, tokenizers, the segment cache) and the analysis memos are made on
first use, once per process, wherever they are used: in the gateway's process (the limits' exact
count, analysis in threads), in its analysis worker, and in the command line (`gateway render`).
So their switches are set on the process, not passed to each part: by the composition root
(compose.py), by the analysis worker as it starts (with the gateway's Settings), and by the command
line before it runs a command.
"""

from __future__ import annotations

from .conversations import memo
from .core.settings import Settings
from .render import cache, native, tokenizer


def apply(settings: Settings) -> None:
    native.ENABLED = settings.render_native
    tokenizer.PIECES = settings.tokenizer_pieces
    cache.BUDGET_BYTES = settings.render_cache_bytes
    memo.MAX_BYTES = settings.analysis_memo_bytes
