"""What happens after a response has ended: analysis first, then the sinks that read its results.

The hot path only enqueues the finished Exchange; a few worker tasks drain the queue. The queue
holds one place in line per conversation, with up to `coalesce` of its turns: a conversation's newer
turn joins its older ones waiting there (GATEWAY_AFTERMATH_COALESCE, default 4), and they are
analysed together, in order, each with its own verdict. Analysing every turn costs the analysis
worker less per verdict than analysing only the latest (an append-only turn whose previous turn was
analysed has one new message to render; one whose previous turns were skipped has several), so
under a burst coalescing gives more verdicts than superseding for the same CPU. When a conversation
already has `coalesce` turns waiting, its oldest waiting turn is shed ("superseded"), so the worker
still reaches each conversation's latest turn; when the queue is full (far beyond what analysis can
keep up with) a new conversation's turn is shed ("queue_full"). Past `max_coalesced` turns waiting
together in all (GATEWAY_AFTERMATH_MAX_COALESCED, no limit by default), a newer turn takes its
oldest waiting turn's place instead of joining it. A shed exchange still reaches the
sinks at once, with `analysis_skipped` saying why, so records and counters are never lost and the
shedding is never silent (`shed_superseded`, `shed_queue_full`; the metric
gateway_analysis_shed_total{reason}). `coalesce` = 1 keeps one turn per conversation: a newer
turn takes its older one's place.

The queue is bounded in exchanges and in bytes (each queued exchange holds its whole request, as
received and as forwarded: ten thousand agent turns of 400K tokens would be tens of GB),
GATEWAY_AFTERMATH_MAX_BYTES.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import logging
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Hashable, Sequence

from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime

log = logging.getLogger("gateway.aftermath")

Step = Callable[[Exchange, LaneRuntime | None], Awaitable[None] | None]

# What one queued exchange is taken to weigh beyond its raw request bytes (parsed body, headers,
# stream observations): about what a small chat request weighs in the soak (bench/soak.py).
EXCHANGE_OVERHEAD_BYTES = 16 * 1024
DEFAULT_MAX_QUEUE_BYTES = 64 * 1024 * 1024
# Workers in flight at once: each waits mostly on the analysis process, which takes the jobs of all
# of them in one batch (worker.py); with a few, it sat idle between jobs and most turns went unanalysed.
DEFAULT_WORKERS = 64

# Turns of one conversation waiting together (see above). Each holds its request: the byte bound,
# not this count, is what bounds the queue's memory.
DEFAULT_COALESCE = 4
# Turns waiting together in all (beyond the first of each conversation), GATEWAY_AFTERMATH_MAX_COALESCED:
# past it a conversation's newer turn takes its oldest waiting turn's place instead of joining it.
# No limit by default (the byte budget bounds the queue): a limit sheds fewer new conversations' turns
# as queue_full, but fewer turns are then analysed right after their predecessors, the cheap ones, and
# the share of turns with a verdict falls (bench/soak.py; the figures are in docs/performance.md).
DEFAULT_MAX_COALESCED = 1 << 62

SUPERSEDED = "superseded"
QUEUE_FULL = "queue_full"


class FirstBytes:
    """Requests on their way to the upstream go before the aftermath's work.

    The event loop runs one thing at a time: at concurrency 1 a new request arrived while the last
    one's analysis hand-off, record, metrics and access line were running, and waited
    for them. The pipeline holds this while a request is on the CPU before it is forwarded (not while
    it waits for the engine: that wait needs no CPU, and can last minutes); the aftermath waits while
    any request is held, for at most `max_wait_s` (a steady stream of requests must not starve it:
    records would pile up).
    """

    __slots__ = ("held", "_cool", "max_wait_s")

    def __init__(self, max_wait_s: float = 0.005) -> None:
        self.held = 0
        self._cool: asyncio.Event | None = None
        self.max_wait_s = max_wait_s

    def hold(self) -> "Hold":
        self.held += 1
        if self._cool is not None:
            self._cool.clear()
        return Hold(self)

    def release(self) -> None:
        self.held -= 1
        if not self.held and self._cool is not None:
            self._cool.set()

    async def quiet(self) -> None:
        """Return when no request is on its way to its first byte, or after max_wait_s."""
        if not self.held:
            return
        if self._cool is None:
            self._cool = asyncio.Event()
        try:
            async with asyncio.timeout(self.max_wait_s):
                await self._cool.wait()
        except TimeoutError:
            pass


class Hold:
    """One request's hold on FirstBytes; released once, however often `release` is called."""

    __slots__ = ("_of",)

    def __init__(self, of: FirstBytes) -> None:
        self._of: FirstBytes | None = of

    def release(self) -> None:
        of, self._of = self._of, None
        if of is not None:
            of.release()


class _Turn:
    __slots__ = ("ex", "lane", "cost")

    def __init__(self, ex: Exchange, lane: LaneRuntime | None, cost: int) -> None:
        self.ex, self.lane, self.cost = ex, lane, cost


class _Entry:
    """One conversation's place in line: its turns waiting, oldest first."""

    __slots__ = ("turns",)

    def __init__(self, turn: _Turn) -> None:
        self.turns = collections.deque((turn,))


class Aftermath:
    """A Finisher (see runtime.py): analyzers run in order, then sinks, per exchange."""

    def __init__(self, analyzers: Sequence[Step] = (), sinks: Sequence[Step] = (), workers: int = DEFAULT_WORKERS,
                 max_queue: int = 10_000, max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
                 first_bytes: FirstBytes | None = None, coalesce: int = DEFAULT_COALESCE,
                 max_coalesced: int = DEFAULT_MAX_COALESCED) -> None:
        self.first_bytes = first_bytes or FirstBytes()
        self.analyzers = tuple(analyzers)  # e.g. render + drift verdict (writes ex.cache)
        self.sinks = tuple(sinks)  # e.g. request record, metrics (read the exchange)
        self.shed_superseded = 0  # an older queued turn of a conversation whose newer turn arrived
        self.shed_queue_full = 0  # the queue was full
        self.processed = 0
        self._pending: OrderedDict[Hashable, _Entry] = OrderedDict()  # conversation (or exchange) -> its latest turn
        # Idle workers, each waiting on its own future: an exchange wakes one of them. (One Event for
        # all would wake every worker for every exchange, all but one to find nothing.)
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle: asyncio.Event | None = None
        self._in_flight = 0
        # The sinks run in the order the turns were taken (a record stream stays in request order):
        # a turn whose analysis is done waits in `_ready` for the ones taken before it, and whichever
        # worker completes the next in line runs the sinks of every turn ready after it. A worker never
        # waits for another's analysis: when each awaited the one taken before it, the 64 workers
        # queued behind the slowest, and the analysis process got batches of 1-2 jobs and sat idle
        # with turns waiting.
        self._taken = 0  # turns taken so far: the next one's place in line
        self._next_out = 0  # the place of the next turn whose sinks run
        self._ready: dict[int, _Turn] = {}
        self._flushing = False
        self._shedding: set[asyncio.Task[None]] = set()
        self._started = False
        self._workers: list[asyncio.Task[None]] = []
        self._n_workers = workers
        self._max_queue = max_queue
        self._coalesce = max(1, coalesce)
        self._max_coalesced = max_coalesced
        self._coalesced = 0  # waiting turns beyond the first of each conversation
        self._max_queue_bytes = max_queue_bytes
        self.queued_bytes = 0  # queued and in flight
        self._seq = itertools.count()

    @property
    def skipped_analysis(self) -> int:
        return self.shed_superseded + self.shed_queue_full

    @property
    def queued(self) -> int:
        """Turns waiting (not those in the workers' hands)."""
        return sum(len(e.turns) for e in self._pending.values())

    def start(self) -> None:
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = True
        self._workers = [asyncio.create_task(self._work()) for _ in range(self._n_workers)]

    async def stop(self) -> None:
        await self.drain(timeout=5.0)
        for w in self._workers:
            w.cancel()

    def exchange_ended(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        if not self._started:  # not started (e.g. a unit test): do the cheap part inline
            asyncio.get_event_loop().create_task(self._run_sinks(ex, lane))
            return
        assert self._idle is not None
        key = _conversation(ex)
        entry = self._pending.get(key) if key is not None else None
        cost = _weight(ex)
        if entry is not None:  # the conversation's place in line: the turn waits with its older ones
            turns = entry.turns
            while turns and (len(turns) >= self._coalesce or self._coalesced >= self._max_coalesced or
                             self.queued_bytes + cost > self._max_queue_bytes):
                older = turns.popleft()  # the oldest waiting turn gives way
                self.queued_bytes -= older.cost
                self.shed_superseded += 1
                if turns:
                    self._coalesced -= 1
                self._shed(older.ex, older.lane, SUPERSEDED)
            if turns:
                self._coalesced += 1
            turns.append(_Turn(ex, lane, cost))
            self.queued_bytes += cost
            return
        if len(self._pending) >= self._max_queue or (
                self.queued_bytes and self.queued_bytes + cost > self._max_queue_bytes):
            self.shed_queue_full += 1
            self._shed(ex, lane, QUEUE_FULL)
            return
        self._pending[key if key is not None else ("exchange", next(self._seq))] = _Entry(_Turn(ex, lane, cost))
        self.queued_bytes += cost
        self._idle.clear()
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def _shed(self, ex: Exchange, lane: LaneRuntime | None, reason: str) -> None:
        ex.analysis_skipped = reason
        task = asyncio.get_event_loop().create_task(self._run_sinks(ex, lane))
        self._shedding.add(task)  # held until done (the loop keeps only a weak reference)
        task.add_done_callback(self._shedding.discard)

    async def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far has been processed (tests and shutdown)."""
        if self._idle is None:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def _work(self) -> None:
        assert self._idle is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                waiter = loop.create_future()
                self._waiting.append(waiter)
                await waiter
            _, entry = self._pending.popitem(last=False)
            self._coalesced -= len(entry.turns) - 1
            self._in_flight += 1
            try:
                for turn in entry.turns:  # a conversation's turns in order: each compares with the one before
                    await self._one(turn)
            finally:
                self._in_flight -= 1
                if not self._pending and not self._in_flight:
                    self._idle.set()

    async def _one(self, turn: _Turn) -> None:
        place = self._taken
        self._taken += 1
        try:
            if self.first_bytes.held:  # (a coroutine less when nothing is held, the usual case)
                await self.first_bytes.quiet()
            try:
                for step in self.analyzers:
                    await _call(step, turn.ex, turn.lane)
            except Exception:
                log.exception("analysis of %s failed", turn.ex.request_id)
        finally:
            self._ready[place] = turn  # analysed, failed or cancelled: its sinks still run, in its place
        await self._sink_ready()

    async def _sink_ready(self) -> None:
        """The sinks of the turns ready in line, from the next one on (by one worker at a time)."""
        if self._flushing:
            return  # the worker flushing now takes this turn too
        self._flushing = True
        first_bytes, ready = self.first_bytes, self._ready
        try:
            while self._next_out in ready:
                turn = ready.pop(self._next_out)
                self._next_out += 1
                try:
                    if first_bytes.held:
                        await first_bytes.quiet()
                    await self._run_sinks(turn.ex, turn.lane)
                    self.processed += 1
                finally:
                    self.queued_bytes -= turn.cost
        finally:
            self._flushing = False

    async def _run_sinks(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        for sink in self.sinks:
            try:
                result = sink(ex, lane)  # the usual sinks are plain functions: no coroutine each
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("sink %r failed for %s", sink, ex.request_id)


def _conversation(ex: Exchange) -> str | None:
    found = ex.conversation
    return found.state.id if found is not None else None


def _weight(ex: Exchange) -> int:
    return ex.body_bytes + len(ex.forwarded or b"") + EXCHANGE_OVERHEAD_BYTES


async def _call(step: Step, ex: Exchange, lane: LaneRuntime | None) -> Any:
    result = step(ex, lane)
    if inspect.isawaitable(result):
        return await result
    return result
