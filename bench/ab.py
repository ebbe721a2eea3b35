#!/usr/bin/env python3
"""A/B of one hot-path choice in one process: bench/steps.py's steps and hot path total for two
variants, alternated round by round.

Separate steps.py runs differ by more than the variants do on a shared machine; alternating rounds
in one process (same gateway, same stub, same warm caches) leaves only the variant to differ. CPU of
the event-loop thread (thread_time), as in steps.py; the loop is asyncio's, as in steps.py (the
gateway itself runs on uvloop). The choices:

  upstream-client   the gateway's own client (upstream_client.py) against aiohttp's
  chunk-shapes      stream chunks recognised from their bytes (chunk_shape.py) against parsing each

    python bench/ab.py upstream-client              # 6 rounds, ~20 s
    python bench/ab.py chunk-shapes --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import steps  # noqa: E402  (bench/steps.py: its gateway, stub, timer and instrumentation)

from gateway import chunk_shape  # noqa: E402
from gateway import upstream as upstream_mod  # noqa: E402

SMALL = orjson.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "Say hello."}],
                      "max_tokens": 16})
STREAM = orjson.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 256, "stream": True, "stream_options": {"include_usage": True}})


@dataclass(frozen=True)
class Choice:
    variants: tuple[str, str]
    choose: Callable[[str], None]  # read by the gateway on every request
    step: str  # the step that differs, shown beside the hot path total
    scenarios: tuple[tuple[str, bytes, int], ...]


def _client(name: str) -> None:
    upstream_mod.CLIENT = name


def _shapes(name: str) -> None:
    chunk_shape.MAX_TRIES = 16 if name == "shapes" else 0


CHOICES = {
    "upstream-client": Choice(("raw", "aiohttp"), _client, "forward",
                              (("small", SMALL, 100), ("stream 256", STREAM, 30))),
    "chunk-shapes": Choice(("shapes", "parse"), _shapes, "relay/chunk", (("stream 256", STREAM, 30),)),
}


async def run(choice: Choice, rounds: int) -> dict[tuple[str, str, str], list[float]]:
    up_port = steps.free_port()
    mock = subprocess.Popen([sys.executable, str(steps.SHARED / "tools" / "mock_upstream.py"), "--port",
                             str(up_port), "--chunks", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix="gw-ab-"))
    routes = tmp / "routes.yaml"
    routes.write_text(yaml.safe_dump(steps._routes(f"http://127.0.0.1:{up_port}")))
    os.environ.setdefault("GATEWAY_ACCESS_LOG_FILE", str(tmp / "access.log"))
    results: dict[tuple[str, str, str], list[float]] = {}
    a, b = choice.variants
    try:
        steps.wait_http(f"http://127.0.0.1:{up_port}/v1/models", 10)
        gw = steps.build(steps.Settings(routes_path=routes, data_dir=tmp / "data", watch_routes=False,
                                        log_level="warning"))
        await gw.start()
        try:
            for i in range(rounds):
                for variant in (a, b) if i % 2 == 0 else (b, a):
                    choice.choose(variant)
                    for label, body, n in choice.scenarios:
                        for _ in range(3):  # warm: this variant's pooled connection, caches
                            await steps.one(gw, body, steps.Timer())
                        timer = steps.Timer()
                        steps.instrument_once(gw, timer)
                        totals = [await steps.one(gw, body, timer) for _ in range(n)]
                        count = timer.count[choice.step] if choice.step == "relay/chunk" else n
                        scale = 1e6 if choice.step == "relay/chunk" else 1000
                        results.setdefault((label, choice.step, variant), []).append(
                            timer.spent[choice.step] / max(1, count) * scale)
                        results.setdefault((label, "hot path total", variant), []).append(
                            statistics.median(totals) * 1000)
        finally:
            await gw.stop()
    finally:
        mock.terminate()
        mock.wait(5)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("choice", choices=sorted(CHOICES))
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    choice = CHOICES[args.choice]
    results = asyncio.run(run(choice, args.rounds))
    a, b = choice.variants
    print(f"| scenario | step | {a} (median of rounds) | {b} | {a} / {b} |")
    print("|---|---|---|---|---|")
    for label, step in dict.fromkeys((k[0], k[1]) for k in results):
        unit = "µs" if step == "relay/chunk" else "ms"
        va = statistics.median(results[(label, step, a)])
        vb = statistics.median(results[(label, step, b)])
        print(f"| {label} | {step} | {va:.3f} {unit} | {vb:.3f} {unit} | {va / vb:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
