#!/usr/bin/env python3
"""What each step of the hot path costs, measured in process on the real parts (the README's table).

Builds the gateway with the composition root (a DeepSeek-V4.1 lane with limits, effort pinning,
conversation analysis and SQLite records, in front of the shared stub upstream), sends requests
through its pipeline in this process one at a time, and times every step with the CPU clock of this
thread (`time.thread_time`): parse, validate, each policy (limits, conversation identity and effort
pin, healing, routing), forwarding (the upstream client's request and response, syscalls included),
the relay per stream chunk, and, after the answer, the turn-end writes, the hand-off to analysis,
records, metrics and the access log. What is left of the CPU per request measured from the outside
(bench/anchors.py) is the HTTP server: parsing the request and writing the answer.

    python bench/steps.py                 # small, stream 256, 2 MB new conversation, corpus append-only
    python bench/steps.py --requests 300
    python bench/steps.py --only "2 MB"   # the scenarios whose label contains this
    python bench/steps.py --loop asyncio  # uvloop by default, as `gateway serve`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, AsyncIterator

import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
sys.path.insert(0, str(SHARED / "tools"))

from starlette.datastructures import Headers  # noqa: E402

from gateway.observe import gc_tuning  # noqa: E402
from gateway.pipeline import flow as pipeline_mod  # noqa: E402
from gateway.relay import forward as proxy_mod  # noqa: E402
from gateway.relay import chunk_run  # noqa: E402
from gateway.relay import sse as sse_mod  # noqa: E402
from gateway.compose import build  # noqa: E402
from gateway.server.security import Caller  # noqa: E402
from gateway.core.settings import Settings  # noqa: E402
from gateway.server.wire import WireRequest  # noqa: E402
from tests.support.emulator_proc import free_port  # noqa: E402
from tests.support.gateway_proc import wait_http  # noqa: E402

ANALYSIS = "analysis: hand-off, or inline"  # a tiny turn on a quiet lane is analysed on the loop (inline.py)
STEPS = ["parse", "validate", "limits", "identity", "heal", "routing", "serialise", "forward", "relay/chunk",
         "turn end", ANALYSIS, "records", "metrics", "access log", "remember history"]
_clock = time.thread_time


class Timer:
    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def sync(self, name: str, fn: Any) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t = _clock()
            try:
                return fn(*a, **kw)
            finally:
                self.spent[name] += _clock() - t
                self.count[name] += 1
        return timed

    def coro(self, name: str, fn: Any) -> Any:
        async def timed(*a: Any, **kw: Any) -> Any:
            t = _clock()
            try:
                return await fn(*a, **kw)
            finally:
                self.spent[name] += _clock() - t
                self.count[name] += 1
        return timed


class NoDisconnect:
    async def race(self, awaitable: Any) -> Any:
        return await awaitable


class BenchRequest(WireRequest):
    """A request as the wire path hands it to the pipeline, without a connection."""

    __slots__ = ("_body",)

    def __init__(self, body: bytes) -> None:  # no super().__init__: it wants a connection's cycle
        self.scope = {}
        self.headers = Headers({"content-type": "application/json", "content-length": str(len(body))})
        self.link = NoDisconnect()  # type: ignore[assignment]
        self._body = body

    async def stream(self) -> Any:
        yield self._body


def _routes(upstream: str) -> dict:
    lane = {"engine": "vllm", "replicas": [upstream], "upstream_model": "mock-model",
            "qualification": "not_required", "render": {"template": "deepseek_v4.1"},
            "limits": {"max_context_tokens": 1_048_576}}
    return {"gateway": {"max_request_bytes": 64 * 1024 * 1024}, "lanes": {"mock": lane},
            "models": {"mock-model": "mock"}}


def instrument(gw: Any, timer: Timer) -> None:
    gw.pipeline._parse = timer.sync("parse", gw.pipeline._parse)
    gw.pipeline.memo.settle = timer.sync("remember history", gw.pipeline.memo.settle)
    pipeline_mod.check_chat = timer.sync("validate", pipeline_mod.check_chat)
    names = {"limits": "limits", "conversation": "identity", "heal": "heal", "routing": "routing"}
    for policy in gw.pipeline.policies:
        label = next((v for k, v in names.items() if k in type(policy).__name__.lower()), type(policy).__name__)
        policy.apply = timer.coro(label, policy.apply)
    gw.pipeline._upstream_body = timer.sync("serialise", gw.pipeline._upstream_body)
    upstream_send = proxy_mod.forward
    pipeline_mod.forward = timer.coro("forward", upstream_send)
    _time_relay(timer)
    am = gw.aftermath
    # An analyzer is an async function or an object whose __call__ is one.
    am.analyzers = tuple(timer.coro(ANALYSIS, a)
                         if inspect.iscoroutinefunction(a) or inspect.iscoroutinefunction(type(a).__call__)
                         else timer.sync(ANALYSIS, a) for a in am.analyzers)
    sink_names = ["metrics", "records", "access log"]
    am.sinks = tuple(timer.sync(sink_names[i] if i < 3 else f"sink{i}", s) for i, s in enumerate(am.sinks))
    for f in gw.runtime.finishers:
        if f is not am:  # the aftermath's own enqueueing is part of the hand-off
            f.exchange_ended = timer.sync("turn end", f.exchange_ended)


def _time_relay(timer: Timer) -> None:
    """'relay/chunk': the event-by-event relay (the first read's events) and every later read as a
    whole (chunk_run.Runs.relay_read: its runs and the events between them), per stream event."""
    relay, read, run = _ORIGINALS["relay"], _ORIGINALS["relay_read"], _ORIGINALS["run_relay"]
    timed = timer.sync("relay/chunk", relay)
    inside = [False]

    def observer_relay(self: Any, event: bytes) -> Any:
        if inside[0]:  # timed with its read
            timer.count["relay/chunk"] += 1
            return relay(self, event)
        return timed(self, event)

    def relay_read(self: Any, *a: Any) -> None:
        inside[0] = True
        t = _clock()
        try:
            read(self, *a)
        finally:
            inside[0] = False
            timer.spent["relay/chunk"] += _clock() - t

    def run_relay(self: Any, *a: Any) -> Any:
        out = run(self, *a)
        if out is not None:
            timer.count["relay/chunk"] += len(a[4])  # the run's events
        return out

    sse_mod.StreamObserver.relay = observer_relay  # type: ignore[method-assign]
    chunk_run.Runs.relay_read = relay_read  # type: ignore[method-assign]
    chunk_run.Runs._relay = run_relay  # type: ignore[method-assign]


async def one(gw: Any, body: bytes, timer: Timer) -> float:
    t = _clock()
    request = BenchRequest(body)
    answer = await gw.pipeline.chat(request, Caller())
    if answer.stream is not None:
        async for _ in answer.stream:
            pass
    await answer.close()
    spent = _clock() - t
    await gw.aftermath.drain(30)
    return spent


def bodies(corpus_path: Path) -> dict[str, list[bytes]]:
    from loadgen import build_messages

    small = orjson.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "Say hello."}],
                          "max_tokens": 16})
    stream = orjson.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "Say hello."}],
                           "max_tokens": 256, "stream": True, "stream_options": {"include_usage": True}})
    big = build_messages(1600, 2_000_000)
    large = [orjson.dumps({"model": "mock-model", "messages": [{**big[0], "content": f"{i} " + big[0]["content"]},
                                                               *big[1:]], "max_tokens": 16}) for i in range(64)]
    if not corpus_path.exists():
        subprocess.run([sys.executable, str(SHARED / "tools" / "make_agent_corpus.py"), "--messages", "1600",
                        "-o", str(corpus_path)], check=True, stdout=subprocess.DEVNULL)
    corpus = json.loads(corpus_path.read_text())
    msgs = corpus["messages"]
    cuts = [i for i, m in enumerate(msgs) if m["role"] == "assistant"][-40:]
    turns = [orjson.dumps({"model": "mock-model", "messages": msgs[:c], "tools": corpus.get("tools"),
                           "max_tokens": 16}) for c in cuts]
    # The anchors' large_c4 (loadgen) sends the same 2 MB bytes every time: the memo knows them.
    resent = orjson.dumps({"model": "mock-model", "messages": big, "max_tokens": 16})
    return {"small c=1": [small], "stream 256": [stream], "2 MB new conversation": large,
            "2 MB resent (large_c4)": [resent], "corpus append-only turn": turns}


@contextlib.asynccontextmanager
async def gateway_on_stub(prefix: str) -> AsyncIterator[tuple[Any, Path]]:
    """The gateway built in this process (its composition root) in front of a fresh shared stub;
    yields it and its scratch directory (bench/ab.py runs its A/Bs on the same)."""
    up_port = free_port()
    mock = subprocess.Popen(  # noqa: ASYNC220 - it returns once started; nothing else runs on the loop yet
        [sys.executable, str(SHARED / "tools" / "mock_upstream.py"), "--port", str(up_port), "--chunks", "16"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    routes = tmp / "routes.yaml"
    routes.write_text(yaml.safe_dump(_routes(f"http://127.0.0.1:{up_port}")))
    os.environ.setdefault("GATEWAY_ACCESS_LOG_FILE", str(tmp / "access.log"))
    try:
        wait_http(f"http://127.0.0.1:{up_port}/v1/models", 10)
        gw = build(Settings(routes_path=routes, data_dir=tmp / "data", watch_routes=False, log_level="warning"))
        await gw.start()
        gc_tuning.settle()  # the collector as a serving gateway sets it (app.py): CPython's defaults collected
        # within a small request's steps every request or two (identity read 0.2 ms of what is 0.03)
        try:
            yield gw, tmp
        finally:
            await gw.stop()
    finally:
        mock.terminate()
        mock.wait(5)


async def run(requests: int, only: str = "") -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    async with gateway_on_stub("gw-steps-") as (gw, tmp):
        for label, variants in bodies(tmp / "corpus.json").items():
            if only not in label:
                continue
            n = requests if len(variants) == 1 else min(requests, len(variants))
            for body in variants[:3]:  # warm-up: tokenizers, templates, connections
                await one(gw, body, Timer())
            timer = Timer()
            instrument_once(gw, timer)
            totals = [await one(gw, variants[i % len(variants)], timer) for i in range(n)]
            row = {name: timer.spent[name] / n * 1000 for name in timer.spent}
            if "relay/chunk" in timer.count and timer.count["relay/chunk"]:
                row["relay/chunk"] = timer.spent["relay/chunk"] / timer.count["relay/chunk"] * 1e6  # µs
            row["hot path total"] = statistics.median(totals) * 1000
            results[label] = row
            print(f"  done: {label} ({n} requests)", file=sys.stderr, flush=True)
    return results


_ORIGINALS: dict[str, Any] = {}


def instrument_once(gw: Any, timer: Timer) -> None:
    """Instrument afresh for each scenario (the wrappers point at the timer of that scenario)."""
    if not _ORIGINALS:
        _ORIGINALS.update(parse=gw.pipeline._parse, settle=gw.pipeline.memo.settle, check=pipeline_mod.check_chat,
                          forward=pipeline_mod.forward, relay=sse_mod.StreamObserver.relay,
                          relay_read=chunk_run.Runs.relay_read, run_relay=chunk_run.Runs._relay,
                          upstream_body=gw.pipeline._upstream_body,
                          applies=[p.apply for p in gw.pipeline.policies],
                          analyzers=gw.aftermath.analyzers, sinks=gw.aftermath.sinks,
                          finishers=[(f, f.exchange_ended) for f in gw.runtime.finishers
                                     if f is not gw.aftermath])
    gw.pipeline._parse = _ORIGINALS["parse"]
    gw.pipeline.memo.settle = _ORIGINALS["settle"]
    pipeline_mod.check_chat = _ORIGINALS["check"]
    pipeline_mod.forward = _ORIGINALS["forward"]
    proxy_mod.forward = _ORIGINALS["forward"]
    sse_mod.StreamObserver.relay = _ORIGINALS["relay"]
    chunk_run.Runs.relay_read = _ORIGINALS["relay_read"]
    chunk_run.Runs._relay = _ORIGINALS["run_relay"]
    gw.pipeline._upstream_body = _ORIGINALS["upstream_body"]
    for p, apply in zip(gw.pipeline.policies, _ORIGINALS["applies"]):
        p.apply = apply
    gw.aftermath.analyzers = _ORIGINALS["analyzers"]
    gw.aftermath.sinks = _ORIGINALS["sinks"]
    for f, ended in _ORIGINALS["finishers"]:
        f.exchange_ended = ended
    instrument(gw, timer)


def table(results: dict[str, dict[str, float]]) -> str:
    labels = list(results)
    head = f"| step | {' | '.join(labels)} |"
    lines = [head, "|" + "---|" * (len(labels) + 1)]
    for step in [*STEPS, "hot path total"]:
        cells = []
        for label in labels:
            v = results[label].get(step)
            if v is None:
                cells.append("-")
            elif step == "relay/chunk":
                cells.append(f"{v:.2f} µs")
            else:
                cells.append(f"{v:.3f} ms")
        lines.append(f"| {step} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--json-out")
    ap.add_argument("--only", default="", help="run only the scenarios whose label contains this")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                    help="the event loop (the gateway serves on uvloop, whose writelines is one writev)")
    a = ap.parse_args()
    if a.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    results = asyncio.run(run(a.requests, a.only))
    print(table(results))
    print("\nCPU of the gateway's event-loop thread per request (thread_time); 'relay/chunk' per stream event; "
          "'hot path total' = the pipeline from body to last byte handed to the server (median).")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
