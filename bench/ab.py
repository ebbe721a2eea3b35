#!/usr/bin/env python3
"""A/B of one hot-path choice in one process: bench/steps.py's steps and the event loop's CPU per
request for two variants, alternated block by block.

Separate steps.py runs differ by more than the variants do on a shared machine (20-40% between runs);
alternating blocks in one process (same gateway, same stub, same warm caches) leaves only the variant
to differ. CPU of the event-loop thread (thread_time) from the request's body to the end of its
aftermath (analysis hand-off, records, metrics: everything the loop does for it), on uvloop as the
gateway serves. The choices (the change first, what it replaced second):

  chunk-shapes      stream chunks recognised from their bytes (chunk_shape.py) / each one parsed
  ring              large bodies to the analysis worker through shared memory (handoff.py) / pickled
  parts             the forwarded body in parts, written with writelines (body_parts.py) / joined

The gateway's own upstream client and the runs of chunks were compared here with what they replaced
(aiohttp's client, the event-by-event relay) until those were removed; their figures are in
docs/performance.md.

    python bench/ab.py parts                         # 6 blocks each way
    python bench/ab.py chunk-shapes --blocks 10
    python bench/ab.py ring --scenario "2 MB new conversation" --blocks 12 --per-block 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import steps  # noqa: E402  (bench/steps.py: its gateway on the stub, bodies, timers and instrumentation)

from gateway.relay import chunk_shape  # noqa: E402
from gateway.pipeline.body_parts import whole  # noqa: E402
from gateway.pipeline.history_memo import HistoryMemo  # noqa: E402

_clock = time.thread_time
Switch = Callable[[bool], None]  # True: the change, False: what it replaced


def _shapes(gw: Any) -> Switch:
    tries = chunk_shape.MAX_TRIES

    def set_(on: bool) -> None:
        chunk_shape.MAX_TRIES = tries if on else 0  # read at every parsed chunk
    return set_


def _ring(gw: Any) -> Switch:
    process = gw.aftermath.analyzers[0].process
    ring = process._ring

    def set_(on: bool) -> None:
        process._ring = ring if on else None
    return set_


def _parts(gw: Any) -> Switch:
    parts = HistoryMemo.__dict__["forward_body"]

    def joined(parsed: Any, out: dict[str, Any]) -> Any:
        body = parts.__func__(parsed, out)
        return None if body is None else whole(body)

    def set_(on: bool) -> None:
        HistoryMemo.forward_body = parts if on else staticmethod(joined)  # type: ignore[method-assign]
    return set_


@dataclass(frozen=True)
class Choice:
    switch: Callable[[Any], Switch]  # given the built gateway
    scenarios: tuple[str, ...]  # labels of steps.bodies()


CHOICES = {
    "chunk-shapes": Choice(_shapes, ("stream 256",)),
    "ring": Choice(_ring, ("2 MB resent (large_c4)", "2 MB new conversation")),
    "parts": Choice(_parts, ("2 MB resent (large_c4)", "2 MB new conversation")),
}


async def _one(gw: Any, body: bytes, timer: steps.Timer) -> float:
    t = _clock()
    await steps.one(gw, body, timer)  # the answer, then the aftermath drained
    return _clock() - t


async def run(choice: Choice, scenarios: tuple[str, ...], blocks: int, per_block: int) -> None:
    async with steps.gateway_on_stub("gw-ab-") as (gw, tmp):
        set_ = choice.switch(gw)
        all_bodies = steps.bodies(tmp / "corpus.json")
        for label in scenarios:
            variants = all_bodies[label]
            for on in (True, False):  # warm: each variant's pooled connection, caches
                set_(on)
                for body in variants[:3]:
                    await steps.one(gw, body, steps.Timer())
            totals: dict[bool, list[float]] = {False: [], True: []}
            timers = {False: steps.Timer(), True: steps.Timer()}
            k = 0
            for b in range(blocks):
                for on in (True, False) if b % 2 == 0 else (False, True):
                    set_(on)
                    steps.instrument_once(gw, timers[on])
                    for _ in range(per_block):
                        totals[on].append(await _one(gw, variants[k % len(variants)], timers[on]))
                        k += 1
            set_(True)
            _print(label, blocks, per_block, totals, timers)


def _print(label: str, blocks: int, per_block: int, totals: dict[bool, list[float]],
           timers: dict[bool, steps.Timer]) -> None:
    n = blocks * per_block
    print(f"\n{label}: {blocks} blocks of {per_block} requests each way, alternated")
    print("| step | the change | without it | ratio |\n|---|---|---|---|")
    for step in [*steps.STEPS, "loop per request, median"]:
        if step == "loop per request, median":
            b, a = (statistics.median(totals[on]) * 1e3 for on in (True, False))
            unit = "ms"
        elif step == "relay/chunk":
            if not timers[True].count.get(step):
                continue
            b, a = (timers[on].spent[step] / max(1, timers[on].count[step]) * 1e6 for on in (True, False))
            unit = "µs"
        elif step in timers[False].spent or step in timers[True].spent:
            b, a = (timers[on].spent.get(step, 0.0) / n * 1e3 for on in (True, False))
            unit = "ms"
        else:
            continue
        print(f"| {step} | {b:.3f} {unit} | {a:.3f} {unit} | {b / a if a else float('nan'):.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("choice", choices=sorted(CHOICES))
    ap.add_argument("--scenario", action="append", help="a label of bench/steps.py (default: the choice's own)")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=20)
    a = ap.parse_args()
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as `gateway serve`
    choice = CHOICES[a.choice]
    asyncio.run(run(choice, tuple(a.scenario or choice.scenarios), a.blocks, a.per_block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
