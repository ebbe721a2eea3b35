#!/usr/bin/env python3
"""A/B of the large-body path's switches, alternated in one gateway process (bench/steps.py's setup).

The shared 2-core machine drifts by 20-40% between runs, so a change is measured against its
absence in the same process: blocks of requests with the switch on and off, alternated, each
request timed with this thread's CPU clock from its body to the end of its aftermath (analysis
hand-off, records, metrics: everything the event loop does for it), plus bench/steps.py's steps.

    python bench/large_ab.py --switch ring         # the analysis hand-off through shared memory
    python bench/large_ab.py --switch parts        # the forwarded body in parts (no 2 MB join)
    python bench/large_ab.py --switch ring --body new --blocks 20

Switches (B is the change, A is without it):
  ring   the analysis worker's body ring (conversations/handoff.py) vs pickling the body
  parts  HistoryMemo.forward_body's parts vs one joined bytes object
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps  # noqa: E402  (bench/steps.py: the gateway built in process, its timers)

from gateway.body_parts import whole  # noqa: E402
from gateway.compose import build  # noqa: E402
from gateway.history_memo import HistoryMemo  # noqa: E402
from gateway.settings import Settings  # noqa: E402

_clock = time.thread_time


def _switch_ring(gw: Any) -> Callable[[bool], None]:
    process = gw.aftermath.analyzers[0].process
    ring = process._ring

    def set_(on: bool) -> None:
        process._ring = ring if on else None
    return set_


def _switch_parts(gw: Any) -> Callable[[bool], None]:
    parts = HistoryMemo.__dict__["forward_body"]

    def joined(parsed: Any, out: dict[str, Any]) -> Any:
        body = parts.__func__(parsed, out)
        return None if body is None else whole(body)

    def set_(on: bool) -> None:
        HistoryMemo.forward_body = parts if on else staticmethod(joined)  # type: ignore[method-assign]
    return set_


SWITCHES = {"ring": _switch_ring, "parts": _switch_parts}


async def _one(gw: Any, body: bytes, timer: steps.Timer) -> float:
    t = _clock()
    await steps.one(gw, body, timer)  # the answer, then the aftermath drained
    return _clock() - t


async def run(switch: str, body_kind: str, blocks: int, per_block: int) -> None:
    up_port = steps.free_port()
    mock = subprocess.Popen([sys.executable, str(steps.SHARED / "tools" / "mock_upstream.py"), "--port",
                             str(up_port), "--chunks", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix="gw-large-ab-"))
    routes = tmp / "routes.yaml"
    routes.write_text(yaml.safe_dump(steps._routes(f"http://127.0.0.1:{up_port}")))
    os.environ.setdefault("GATEWAY_ACCESS_LOG_FILE", str(tmp / "access.log"))
    try:
        steps.wait_http(f"http://127.0.0.1:{up_port}/v1/models", 10)
        gw = build(Settings(routes_path=routes, data_dir=tmp / "data", watch_routes=False, log_level="warning"))
        await gw.start()
        try:
            label = {"new": "2 MB new conversation", "resent": "2 MB resent (large_c4)"}[body_kind]
            variants = steps.bodies(tmp / "corpus.json")[label]
            set_ = SWITCHES[switch](gw)
            for body in variants[:3]:
                await steps.one(gw, body, steps.Timer())
            totals: dict[bool, list[float]] = {False: [], True: []}
            timers = {False: steps.Timer(), True: steps.Timer()}
            k = 0
            for b in range(blocks):
                for on in ((False, True) if b % 2 == 0 else (True, False)):
                    set_(on)
                    steps.instrument_once(gw, timers[on])
                    for _ in range(per_block):
                        totals[on].append(await _one(gw, variants[k % len(variants)], timers[on]))
                        k += 1
            set_(True)
        finally:
            await gw.stop()
    finally:
        mock.terminate()
        mock.wait(5)
    n = blocks * per_block
    print(f"switch {switch!r}, {body_kind} 2 MB body: {blocks} blocks of {per_block} requests each way, alternated")
    print("| step | A (off) | B (on) |\n|---|---|---|")
    for step in [*steps.STEPS, "loop per request, median", "loop per request, mean"]:
        if step.startswith("loop"):
            f = statistics.median if "median" in step else statistics.fmean
            a, b = f(totals[False]) * 1e3, f(totals[True]) * 1e3
        elif step in timers[False].spent or step in timers[True].spent:
            a, b = (timers[on].spent.get(step, 0.0) / n * 1e3 for on in (False, True))
        else:
            continue
        print(f"| {step} | {a:.3f} ms | {b:.3f} ms |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--switch", choices=sorted(SWITCHES), required=True)
    ap.add_argument("--body", choices=["new", "resent"], default="resent")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--per-block", type=int, default=8)
    a = ap.parse_args()
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as `gateway serve`
    asyncio.run(run(a.switch, a.body, a.blocks, a.per_block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
