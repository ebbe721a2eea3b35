"""The analysis worker process's side (worker.py starts it and holds its pipe): load the lanes'
tokenizers and templates, then answer batches of turns until the pipe closes. Run there, the
analysis takes no CPU from the event loop's process; its render cache stays warm across turns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import shutil
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from ..render import tokenizer
from ..render.renderer import Renderer
from ..render.result import RenderOptions
from . import handoff
from .job import Job, Outcome

if TYPE_CHECKING:
    from ..core.settings import Settings

log = logging.getLogger("gateway.drift")

_renderers: dict[str, Renderer] = {}
_estimators: dict[str, Any] = {}  # per engine: Estimator, or None if it cannot be made


# Two priorities. While analysis keeps up, the worker runs its batches at a lower priority than the
# gateway's event loop (niceness 5, GATEWAY_ANALYSIS_NICE): when both want the CPU (a burst on a
# 2-core machine), the requests in flight go first. When it has fallen behind (the gateway marks a
# batch `behind`: BEHIND_JOBS or more turns in its hands), it runs at the event loop's priority, so
# that the verdicts do not thin out while the machine is busy. One priority for every batch fails
# one side: niced, a busy machine's turns lose their verdicts (bench/soak.py); not niced, the
# analysis slows the requests where it is not behind, large ones most (bench/anchors.py; the figures
# are in docs/performance.md). Linux gives each thread its own niceness, and an unprivileged process
# cannot lower its niceness again: so the main thread, niced,
# runs the polite batches itself (no hand-off while analysis keeps up), and a thread made before it
# was niced (`_Prompt`) runs the batches that are behind (large ones: the hand-off is shared).
NICENESS = 5


def _init(parent: int, spool: str | None, settings: Settings | None) -> None:
    """`settings`: the gateway's (None: a worker made without them, in tests, runs with the defaults)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the gateway, which stops this process
    if settings is not None:
        from .. import process_switches

        process_switches.apply(settings)  # as the gateway's process: before the first render
    with contextlib.suppress(OSError, ValueError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                       settings.analysis_nice if settings is not None else NICENESS)
    if settings is not None and settings.analysis_sched_batch and hasattr(os, "SCHED_BATCH"):
        # CPU-bound, never latency-sensitive: the scheduler does not let it preempt a task that wakes up
        # (the event loop's), though it keeps its share by niceness.
        with contextlib.suppress(OSError):
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_BATCH, os.sched_param(0))
    # One core at most: the tokenizer's thread pool would spread a big render over every core (the hot
    # path's too), and its idle threads spin between the small batches of an agent's turn. (Profiled in
    # the soak, an agent's turn spent most of its time in the tokenizer call and the Jinja macro, its
    # worker preempted often: render/pieces.py and render/native.py take both off an agent's turn.)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizers library's own variable
    tokenizer.PIECES_MAX_CHARS = None  # this process's GIL keeps no event loop waiting (render/tokenizer.py)
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


def preload(renders: list[RenderOptions], gc_thresholds: str = "") -> int:
    from ..render.template import load_template
    from ..render.tokenizer import load_tokenizer

    for options in renders:
        load_tokenizer(options.tokenizer_path).spelling()  # for the engine's prompt ids (render/engine_ids.py)
        if options.template:
            load_template(options.template)
        _renderer(options)
    from ..observe import gc_tuning

    # As in the gateway process: a request body's parse must not set off full collections.
    gc_tuning.settle(gc_thresholds)
    return len(renders)


def run(job: Job) -> Outcome:
    from .analysis import analyse_job

    if isinstance(job.body, handoff.InRing):  # a large body, in shared memory (handoff.py)
        job.body = handoff.take(job.body)

    renderer = _renderer(job.lane_render)
    return analyse_job(job, renderer, _estimator_once(job.engine) if renderer is None else None)


def run_spooled(path: str) -> Outcome:
    return run(pickle.loads(_take_file(path)))


def run_batch(items: list[Job | str]) -> list[tuple[bool, Any]]:
    """Several jobs in one round trip: (True, Outcome) or (False, the exception) each, in order."""
    out: list[tuple[bool, Any]] = []
    for item in items:
        try:
            out.append((True, run_spooled(item) if isinstance(item, str) else run(item)))
        except Exception as exc:  # one bad job fails alone
            out.append((False, exc))
    return out


class _Prompt:
    """A thread at the worker's first niceness (made before the main thread is niced: see above)
    that runs the batches sent behind while the main thread waits."""

    def __init__(self) -> None:
        self._todo: queue.SimpleQueue[list] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[list] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="analysis-prompt", daemon=True).start()

    def run(self, items: list) -> list[tuple[bool, Any]]:
        self._todo.put(items)
        return self._done.get()

    def _loop(self) -> None:
        while True:
            items = self._todo.get()
            try:
                out = run_batch(items)
            except BaseException as exc:  # run_batch answers each job; never leave the main thread waiting
                out = [(False, RuntimeError(f"analysis failed: {type(exc).__name__}"))] * len(items)
            self._done.put(out)


def serve(conn: Any, parent: int, spool: str | None, renders: list[RenderOptions],
          settings: Settings | None = None) -> None:
    """The worker's life: load, then answer batches of jobs from the gateway until its pipe closes."""
    prompt = _Prompt()  # first: it keeps the niceness the process started with
    _init(parent, spool, settings)
    try:
        preload(renders, settings.gc_thresholds if settings is not None else "")
    except Exception:  # the jobs will say what is missing
        log.exception("the analysis worker could not load tokenizers and templates")
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        behind = data[:1] == b"\x01"  # (worker.AnalysisProcess._send)
        items = pickle.loads(memoryview(data)[1:])
        if isinstance(items, str):  # a large batch, through the spool
            items = pickle.loads(_take_file(items))
        results = prompt.run(items) if behind else run_batch(items)
        try:
            out = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an exception that does not pickle: say so instead
            out = pickle.dumps([(False, RuntimeError(f"analysis result could not be sent: {exc}"))] * len(results))
        try:
            conn.send_bytes(out)
        except (EOFError, OSError):
            return


def _take_file(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    with contextlib.suppress(OSError):
        os.unlink(path)
    return data
