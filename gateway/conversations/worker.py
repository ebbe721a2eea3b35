"""The analysis worker process: renders, tokenizes and compares turns where the event loop's GIL
is not. The hot path's process then spends no CPU on analysis at all (an append-only turn of a
470K-token session is 15-25 ms of mostly pure-Python work that, run in a thread, slowed every
request in flight by taking turns at the GIL with it).

One process per gateway process: its render cache (what earlier turns rendered and tokenized) is
what makes an append-only turn cheap, so every turn goes to the same one. It is spawned (not
forked: the gateway runs threads) when the gateway starts and loads the lanes' tokenizers and
templates before its first job; if it dies, the job in hand fails as "analysis failed" and the
next job starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..render.renderer import Renderer, RenderOptions
from .job import Job, Outcome

log = logging.getLogger("gateway.drift")

# -- in the worker process ---------------------------------------------------------------------------

_renderers: dict[str, Renderer] = {}
_estimators: dict[str, Any] = {}  # per engine: Estimator, or None if it cannot be made


# The worker runs at a lower priority than the gateway's event loop: when both want the CPU (a burst
# on a 2-core machine), the requests in flight go first and analysis takes what is left (it sheds
# per conversation when it falls behind: aftermath.py).
NICENESS = 10


def _init(parent: int, spool: str | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the gateway, which stops this process
    with contextlib.suppress(OSError):
        os.nice(int(os.environ.get("GATEWAY_ANALYSIS_NICE") or NICENESS))
    # One core at most: the tokenizer's thread pool would spread a big render over every core (the hot
    # path's too), and its idle threads spin between the small batches of an agent's turn.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s analysis-worker: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(parent, spool), name="parent-watch", daemon=True).start()


def _exit_with_parent(parent: int, spool: str | None) -> None:
    """A gateway killed outright cannot stop its worker, and the worker never sees its job queue
    close (it holds a copy of the writing end itself): it leaves once it has been orphaned, and
    removes the spool directory the gateway could not."""
    while os.getppid() == parent:
        time.sleep(0.5)
    if spool is not None:
        shutil.rmtree(spool, ignore_errors=True)
    os._exit(0)


def _renderer(options: RenderOptions | None) -> Renderer | None:
    if options is None:
        return None
    key = repr(options)
    renderer = _renderers.get(key)
    if renderer is None:
        renderer = _renderers[key] = Renderer(options)
    return renderer


def _estimator_once(engine: str = "openai") -> Any:
    if engine not in _estimators:
        try:
            from ..render.estimate import Estimator

            _estimators[engine] = Estimator(engine=engine)
        except ImportError:
            _estimators[engine] = None
    return _estimators[engine]


def preload(renders: list[RenderOptions]) -> int:
    from ..render.template import load_template
    from ..render.tokenizer import load_tokenizer

    for options in renders:
        load_tokenizer(options.tokenizer_path)
        load_template(options.template)
        _renderer(options)
    from .. import gc_tuning

    gc_tuning.settle()  # as in the gateway process: a request body's parse must not set off full collections
    return len(renders)


def run(job: Job) -> Outcome:
    from .analyzer import analyse_job

    renderer = _renderer(job.lane_render)
    return analyse_job(job, renderer, _estimator_once(job.engine) if renderer is None else None)


def run_spooled(path: str) -> Outcome:
    with open(path, "rb") as f:
        job = pickle.loads(f.read())
    with contextlib.suppress(OSError):
        os.unlink(path)
    return run(job)


def run_batch(items: list[Job | str]) -> list[tuple[bool, Any]]:
    """Several jobs in one round trip: (True, Outcome) or (False, the exception) each, in order."""
    out: list[tuple[bool, Any]] = []
    for item in items:
        try:
            out.append((True, run_spooled(item) if isinstance(item, str) else run(item)))
        except Exception as exc:  # one bad job fails alone
            out.append((False, exc))
    return out


# -- in the gateway process ----------------------------------------------------------------------------


# Jobs larger than this go through a file in memory (tmpfs) instead of the executor's pipe: 1.76 MB
# through the pipe took ~15 ms on a 2-core machine (64 KB at a time, a context switch each), a
# write and a read of the file well under 1 ms.
SPOOL_MIN_BYTES = 64 * 1024


class AnalysisProcess:
    def __init__(self, spool_parent: str | None = None) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._batch: list[tuple[Job | str, asyncio.Future[Outcome]]] = []
        self._sending = 0  # batches in the worker's hands
        self.batches = 0
        self.jobs = 0
        self._preload: list[RenderOptions] = []
        self._spool = _spool_dir(spool_parent)
        self._jobs = itertools.count()
        self.starts = 0
        self.deaths = 0

    def start(self, preload_renders: list[RenderOptions]) -> None:
        """Spawn the worker and have it load tokenizers and templates; returns at once."""
        self._preload = preload_renders
        self._ensure()

    def _ensure(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                             initargs=(os.getpid(), self._spool))
            self.starts += 1
            self._pool.submit(preload, self._preload).add_done_callback(_log_failure)
        return self._pool

    async def run(self, job: Job) -> Outcome:
        """The job's outcome. Jobs that arrive while the worker is busy leave together, in one batch,
        when it is free: one round trip (two pipe messages, two wake-ups) for many, where a round trip
        each left the worker idle between jobs, waiting for the event loop to send the next."""
        path = self._spooled(job)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._batch.append((path if path is not None else job, future))
        if not self._sending:
            self._send()
        try:
            return await future
        finally:
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # the worker removes it once read; not if it died first

    def _send(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        pool = self._ensure()
        self._sending += 1
        self.batches += 1
        self.jobs += len(batch)
        try:
            done = asyncio.wrap_future(pool.submit(run_batch, [item for item, _ in batch]))
        except (BrokenProcessPool, RuntimeError) as exc:  # dead, or shut down
            self._sending -= 1
            self._broken(pool, batch, exc)
            return
        done.add_done_callback(lambda f: self._returned(pool, batch, f))

    def _returned(self, pool: ProcessPoolExecutor, batch: list, done: asyncio.Future) -> None:
        self._sending -= 1
        exc = RuntimeError("the analysis process stopped") if done.cancelled() else done.exception()
        if exc is not None:
            self._broken(pool, batch, exc)
        else:
            for (_, future), (ok, value) in zip(batch, done.result()):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        if self._batch:
            self._send()

    def _broken(self, pool: ProcessPoolExecutor, batch: list, exc: BaseException) -> None:
        if isinstance(exc, BrokenProcessPool):
            self.deaths += 1
            log.error("the analysis worker process died; starting a new one")
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)

    def _spooled(self, job: Job) -> str | None:
        """The job written to the spool directory, if it is large and there is one."""
        if self._spool is None or len(job.body) < SPOOL_MIN_BYTES:
            return None
        path = os.path.join(self._spool, str(next(self._jobs)))
        try:
            with open(path, "wb") as f:
                f.write(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # full or gone: the pipe still works
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        return path

    def pid(self) -> int | None:
        processes = getattr(self._pool, "_processes", None) or {}
        return next(iter(processes), None)

    def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:  # a render in hand is not worth waiting for at shutdown
                process.terminate()
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


def _log_failure(future: Any) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("the analysis worker could not load tokenizers and templates: %s", future.exception())
