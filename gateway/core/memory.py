"""The process's memory as the system sees it: glibc's heaps, bounded and given back.

glibc gives each thread that allocates its own arena (up to 8 per core): the analysis and records
threads then hold freed memory apart from the event loop's, and RSS creeps up; `limit_arenas` caps
them. Freed memory stays in glibc's heaps until the top of a heap is free: a large text's tokenization
(hundreds of bytes per token, briefly, inside the tokenizer) leaves most of it there, scattered, so
RSS stays at the peak after the work is done. `give_back` returns every free page (malloc_trim), after
work that size only: it holds the allocator's locks while it walks the heaps, which the next
allocation of another thread waits for.
"""

from __future__ import annotations

import ctypes
import functools
import logging

log = logging.getLogger("gateway.memory")

M_ARENA_MAX = -8
# Texts at least this long leave hundreds of MB free in the heaps once tokenized: give them back.
GIVE_BACK_AFTER_CHARS = 4 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - present in glibc only
        return libc
    except (OSError, AttributeError):
        return None  # another C library: nothing to tune


def limit_arenas(arenas: int = 2) -> None:
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, arenas)


def give_back() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
