"""The analysis worker process: renders, tokenizes and compares turns where the event loop's GIL
is not. The hot path's process then spends no CPU on analysis at all (an append-only turn of a
long agent session is milliseconds of mostly pure-Python work that, run in a thread, slows every
request in flight by taking turns at the GIL with it).

One process per gateway process: its render cache (what earlier turns rendered and tokenized) is
what makes an append-only turn cheap, so every turn goes to the same one. It is spawned (not
forked: the gateway runs threads) when the gateway starts and loads the lanes' tokenizers and
templates before its first job; if it dies (heard at once, from its process sentinel), the jobs in
its hands fail as "analysis failed" and the next job starts a new one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import multiprocessing
import os
import pickle
import shutil
import struct
import tempfile
from typing import TYPE_CHECKING, Any

from ..render.result import RenderOptions
from . import handoff
from .job import Job, Outcome
from .worker_main import serve

if TYPE_CHECKING:
    from ..core.settings import Settings

log = logging.getLogger("gateway.drift")


# Jobs larger than this go through a file in memory (tmpfs) instead of the pipe: the pipe moves 64 KB
# at a time, a context switch each, where the file is one write and one read. A batch larger than
# BATCH_PIPE_MAX goes the same way, so that writing it rarely waits for the worker (the pipe holds
# 64 KB; what it cannot take yet waits in `_outbox`).
SPOOL_MIN_BYTES = 64 * 1024
BATCH_PIPE_MAX = 48 * 1024
IN_FLIGHT = 8  # batches in the worker's hands at once (see AnalysisProcess)
# Analysis is behind when this many turns are in the worker's hands (the batch sent included): its
# batches then run at the event loop's priority (worker_main.NICENESS). One conversation's turns are analysed
# one at a time, so a few busy conversations never reach it; the soak's 400 reach the 64 the
# aftermath's workers can hand over (aftermath.DEFAULT_WORKERS) within seconds.
BEHIND_JOBS = 16
READ_CHUNK = 1 << 20


def _take_frame(buf: bytearray) -> tuple[bytes, int] | None:
    """One message of multiprocessing.Connection's framing from the front of `buf` (its payload and
    the bytes it took), or None while it is incomplete: a big-endian int32 length, or -1 and a
    uint64 length for messages over 2 GiB."""
    if len(buf) < 4:
        return None
    (size,) = struct.unpack_from("!i", buf)
    start = 4
    if size == -1:
        if len(buf) < 12:
            return None
        (size,) = struct.unpack_from("!Q", buf, 4)
        start = 12
    if len(buf) < start + size:
        return None
    return bytes(buf[start:start + size]), start + size


class WorkerDied(Exception):
    """The analysis worker process died with jobs in its hands."""


class AnalysisProcess:
    """The worker process and its pipe, driven by the event loop itself.

    A concurrent.futures process pool took two threads of the gateway (a queue feeder and a result
    manager) and four thread hand-offs per round trip: gateway CPU on every small request, and GIL
    switches with the event loop besides. Here a batch is
    one `send_bytes` on the worker's pipe, and the answer is read when the loop sees the pipe
    readable. The worker's death is seen on its process sentinel.

    Up to IN_FLIGHT batches are in the worker's hands: the next ones wait in the pipe while it works
    on the current one. With one at a time the worker slept between batches until a busy event loop
    got round to reading its answer and sending more: asleep while turns waited (bench/soak.py).
    """

    def __init__(self, spool_parent: str | None = None, settings: Settings | None = None) -> None:
        """`settings`: the gateway's, handed to the worker when it is spawned (None: the defaults)."""
        self.settings = settings
        self._proc: Any = None
        self._conn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: list[tuple[Job | str, asyncio.Future[Outcome]]] = []
        self._in_hand: collections.deque[list[tuple[Job | str, asyncio.Future[Outcome]]]] = collections.deque()
        # (the batches sent, oldest first: the worker answers them in order)
        self._inbox = bytearray()  # what the pipe has given of the worker's answer so far
        self._outbox = bytearray()  # a batch the pipe has not taken yet
        self._flush_soon = False  # a send is scheduled for the end of this turn of the loop
        self.batches = 0
        self.behind_batches = 0  # sent at the event loop's priority (BEHIND_JOBS)
        self.jobs = 0
        self._preload: list[RenderOptions] = []
        # Made when the worker first starts, not here: a process never started (`gateway check`, a
        # composition built and dropped) leaves no directory behind in /dev/shm.
        self._spool_parent = spool_parent
        self._spool: str | None = None
        self._spool_made = False
        self._ring: handoff.BodyRing | None = None  # large bodies, without pickling them (made at start)
        self._jobs = itertools.count()
        self.starts = 0
        self.deaths = 0

    def start(self, preload_renders: list[RenderOptions]) -> None:
        """Spawn the worker and have it load tokenizers and templates; returns at once."""
        self._preload = preload_renders
        self._make_spool()
        if self._ring is None:  # here, not when built: a process never started leaves no 32 MiB behind
            ring_mb = self.settings.analysis_ring_mb if self.settings is not None else handoff.DEFAULT_RING_MB
            self._ring = handoff.BodyRing.create(self._spool, ring_mb)
        self._ensure()

    def _make_spool(self) -> None:
        if not self._spool_made:
            self._spool_made = True
            self._spool = _spool_dir(self._spool_parent)

    def _ensure(self) -> None:
        if self._proc is not None:
            return
        self._make_spool()
        ctx = multiprocessing.get_context("spawn")  # not forked: the gateway runs threads
        ours, theirs = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=serve, args=(theirs, os.getpid(), self._spool, self._preload, self.settings),
                           name="analysis-worker", daemon=True)
        proc.start()
        theirs.close()
        self._proc, self._conn = proc, ours
        self.starts += 1
        loop = self._loop = asyncio.get_running_loop()
        loop.add_reader(ours.fileno(), self._readable)
        loop.add_reader(proc.sentinel, self._died)

    async def run(self, job: Job) -> Outcome:
        """The job's outcome. The jobs of one turn of the event loop leave together, in one batch (one
        write for many), and so do those that arrive while IN_FLIGHT batches are in the worker's hands."""
        ring = self._ring
        job.body = handoff.pack(job.body, ring)
        path = self._spooled(job)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._batch.append((path if path is not None else job, future))
        if not self._flush_soon and len(self._in_hand) < IN_FLIGHT:
            self._flush_soon = True
            loop.call_soon(self._flush)
        try:
            return await future
        finally:
            if isinstance(job.body, handoff.InRing) and ring is not None and not future.cancelled():
                # Answered (or failed with the worker): it has read the body, or never will. A job
                # cancelled here (the gateway stopping) may still be read: its place stays taken.
                ring.free(job.body)
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # the worker removes it once read; not if it died first

    def _flush(self) -> None:
        self._flush_soon = False
        if len(self._in_hand) < IN_FLIGHT:
            self._send()

    def _send(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        self._ensure()
        behind = len(batch) + sum(map(len, self._in_hand)) >= BEHIND_JOBS
        data = pickle.dumps([item for item, _ in batch], protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > BATCH_PIPE_MAX:
            path = self._spool_bytes(data)
            if path is not None:
                data = pickle.dumps(path)
        self._in_hand.append(batch)
        self.batches += 1
        self.behind_batches += behind
        self.jobs += len(batch)
        # The framing the worker's recv_bytes reads, around a byte that says whether analysis is behind.
        self._outbox += struct.pack("!ic", len(data) + 1, b"\x01" if behind else b"\x00")
        self._outbox += data
        self._write()

    def _write(self) -> None:
        """Write what the pipe takes now; the rest when it is writable again (its end is
        non-blocking: see `_readable`). A batch is small and the worker waits for it, so the rest
        is rare."""
        if self._conn is None or self._loop is None:
            return
        fd = self._conn.fileno()
        try:
            while self._outbox:
                n = os.write(fd, self._outbox)
                del self._outbox[:n]
        except (BlockingIOError, InterruptedError):
            self._loop.add_writer(fd, self._write)
            return
        except OSError:
            self._died()
            return
        self._loop.remove_writer(fd)

    def _readable(self) -> None:
        """Read what the pipe holds. The event loop made its end non-blocking (libuv does, for any fd
        it polls), so an answer larger than one read comes in pieces: gathered here, frame by frame
        (multiprocessing's framing, as the worker's `send_bytes` writes it)."""
        try:
            chunk = os.read(self._conn.fileno(), READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._died()
            return
        if not chunk:
            self._died()
            return
        self._inbox += chunk
        while True:
            frame = _take_frame(self._inbox)
            if frame is None:
                return
            payload, used = frame
            del self._inbox[:used]
            self._answered(pickle.loads(payload))

    def _answered(self, results: list[tuple[bool, Any]]) -> None:
        batch = self._in_hand.popleft() if self._in_hand else []
        for (_, future), (ok, value) in zip(batch, results):
            if not future.done():
                future.set_result(value) if ok else future.set_exception(value)
        if self._batch and len(self._in_hand) < IN_FLIGHT:
            self._send()

    def _died(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._detach()
        if proc.exitcode is None:  # its pipe broke but it lives on: it is of no use without its pipe
            proc.terminate()
        self.deaths += 1
        log.error("the analysis worker process died (exit code %s); starting a new one", proc.exitcode)
        while self._in_hand:
            self._fail(self._in_hand.popleft(), WorkerDied("the analysis worker process died"))
        if self._batch:
            self._send()  # a new worker for the jobs that waited

    def _fail(self, batch: list, exc: BaseException) -> None:
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)

    def _detach(self) -> None:
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        self._inbox, self._outbox = bytearray(), bytearray()
        if self._loop is not None and conn is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(conn.fileno())
            with contextlib.suppress(Exception):
                self._loop.remove_writer(conn.fileno())
            with contextlib.suppress(Exception):
                self._loop.remove_reader(proc.sentinel)
        if conn is not None:
            conn.close()

    def _spooled(self, job: Job) -> str | None:
        """The job written to the spool directory, if it is large and there is one."""
        if self._spool is None or not isinstance(job.body, bytes) or len(job.body) < SPOOL_MIN_BYTES:
            return None
        return self._spool_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))

    def _spool_bytes(self, data: bytes) -> str | None:
        if self._spool is None:
            return None
        path = os.path.join(self._spool, str(next(self._jobs)))
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError:  # full or gone: the pipe still works
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        return path

    def idle(self) -> bool:
        """Nothing in the worker's hands and nothing waiting to be sent (conversations/inline.py)."""
        return not self._in_hand and not self._batch

    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        proc = self._proc
        self._detach()
        if proc is not None:
            proc.terminate()  # a render in hand is not worth waiting for at shutdown
        for batch in (*self._in_hand, self._batch):
            self._fail(batch, WorkerDied("the gateway is stopping"))
        self._in_hand.clear()
        self._batch = []
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None


def _spool_dir(parent: str | None) -> str | None:
    """A private directory in memory (/dev/shm) for large jobs; None when there is no such place."""
    parent = parent or "/dev/shm"
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        return None
    try:
        return tempfile.mkdtemp(prefix=f"gateway-analysis-{os.getpid()}-", dir=parent)
    except OSError:
        return None
