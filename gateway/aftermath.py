"""What happens after a response has ended: analysis first, then the sinks that read its results.

The hot path only enqueues the finished Exchange; a few worker tasks drain the queue. When the
queue is full (a burst far beyond what analysis can keep up with) the exchange skips analysis
but still reaches the sinks, so records and counters are never lost, and the skip is counted.
The queue is bounded in exchanges and in bytes (each queued exchange holds its whole request, as
received and as forwarded: ten thousand agent turns of 400K tokens would be tens of GB),
GATEWAY_AFTERMATH_MAX_BYTES.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from typing import Any, Awaitable, Callable, Sequence

from .exchange import Exchange
from .runtime import LaneRuntime

log = logging.getLogger("gateway.aftermath")

Step = Callable[[Exchange, LaneRuntime | None], Awaitable[None] | None]

# What one queued exchange is taken to weigh beyond its raw request bytes (parsed body, headers,
# stream observations): measured ~15 KiB for small chat requests under a soak.
EXCHANGE_OVERHEAD_BYTES = 16 * 1024
DEFAULT_MAX_QUEUE_BYTES = 64 * 1024 * 1024


class Aftermath:
    """A Finisher (see runtime.py): analyzers run in order, then sinks, per exchange."""

    def __init__(self, analyzers: Sequence[Step] = (), sinks: Sequence[Step] = (), workers: int = 2,
                 max_queue: int = 10_000, max_queue_bytes: int | None = None) -> None:
        self.analyzers = tuple(analyzers)  # e.g. render + drift verdict (writes ex.cache)
        self.sinks = tuple(sinks)  # e.g. request record, metrics (read the exchange)
        self.skipped_analysis = 0
        self.processed = 0
        self._queue: asyncio.Queue[tuple[Exchange, LaneRuntime | None]] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._n_workers = workers
        self._max_queue = max_queue
        if max_queue_bytes is None:
            max_queue_bytes = int(os.environ.get("GATEWAY_AFTERMATH_MAX_BYTES") or DEFAULT_MAX_QUEUE_BYTES)
        self._max_queue_bytes = max_queue_bytes
        self.queued_bytes = 0
        self._idle = asyncio.Event()

    def start(self) -> None:
        self._queue = asyncio.Queue(self._max_queue)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self._n_workers)]

    async def stop(self) -> None:
        await self.drain(timeout=5.0)
        for w in self._workers:
            w.cancel()

    def exchange_ended(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        if self._queue is None:  # not started (e.g. a unit test): do the cheap part inline
            asyncio.get_event_loop().create_task(self._run_sinks(ex, lane))
            return
        cost = _weight(ex)
        try:
            if self.queued_bytes + cost > self._max_queue_bytes and self.queued_bytes:
                raise asyncio.QueueFull
            self._queue.put_nowait((ex, lane))
            self.queued_bytes += cost
        except asyncio.QueueFull:
            self.skipped_analysis += 1
            ex.analysis_skipped = "queue_full"
            asyncio.get_event_loop().create_task(self._run_sinks(ex, lane))

    async def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far has been processed (tests and shutdown)."""
        if self._queue is None:
            return True
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
            return True
        except TimeoutError:
            return False

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            ex, lane = await self._queue.get()
            try:
                for step in self.analyzers:
                    await _call(step, ex, lane)
                await self._run_sinks(ex, lane)
                self.processed += 1
            except Exception:
                log.exception("aftermath of %s failed", ex.request_id)
            finally:
                self.queued_bytes -= _weight(ex)
                self._queue.task_done()

    async def _run_sinks(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        for sink in self.sinks:
            try:
                await _call(sink, ex, lane)
            except Exception:
                log.exception("sink %r failed for %s", sink, ex.request_id)


def _weight(ex: Exchange) -> int:
    return ex.body_bytes + len(ex.forwarded or b"") + EXCHANGE_OVERHEAD_BYTES


async def _call(step: Step, ex: Exchange, lane: LaneRuntime | None) -> Any:
    result = step(ex, lane)
    if inspect.isawaitable(result):
        return await result
    return result
