#!/usr/bin/env python3
"""The upstream client's A/B in one process: bench/steps.py's "forward" step (and the hot path
total) for the gateway's own client (upstream_client.py) and aiohttp's, alternated round by round.

Separate steps.py runs under GATEWAY_UPSTREAM_CLIENT=raw and =aiohttp differ by more than the
clients do on a shared machine; alternating rounds in one process (same gateway, same stub, same
warm caches) leaves only the client to differ. CPU of the event-loop thread (thread_time), as in
steps.py; the loop is asyncio's, as in steps.py (the gateway itself runs on uvloop).

    python bench/upstream_client_ab.py              # 6 rounds, ~20 s
    python bench/upstream_client_ab.py --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import steps  # noqa: E402  (bench/steps.py: its gateway, stub, timer and instrumentation)

from gateway import upstream as upstream_mod  # noqa: E402

SMALL = orjson.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "Say hello."}],
                      "max_tokens": 16})
STREAM = orjson.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 256, "stream": True, "stream_options": {"include_usage": True}})


async def run(rounds: int) -> dict[tuple[str, str, str], list[float]]:
    up_port = steps.free_port()
    mock = subprocess.Popen([sys.executable, str(steps.SHARED / "tools" / "mock_upstream.py"), "--port",
                             str(up_port), "--chunks", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix="gw-upstream-ab-"))
    routes = tmp / "routes.yaml"
    routes.write_text(yaml.safe_dump(steps._routes(f"http://127.0.0.1:{up_port}")))
    os.environ.setdefault("GATEWAY_ACCESS_LOG_FILE", str(tmp / "access.log"))
    results: dict[tuple[str, str, str], list[float]] = {}
    try:
        steps.wait_http(f"http://127.0.0.1:{up_port}/v1/models", 10)
        gw = steps.build(steps.Settings(routes_path=routes, data_dir=tmp / "data", watch_routes=False,
                                        log_level="warning"))
        await gw.start()
        try:
            for i in range(rounds):
                for client in ("raw", "aiohttp") if i % 2 == 0 else ("aiohttp", "raw"):
                    upstream_mod.CLIENT = client  # read on every send
                    for label, body, n in (("small", SMALL, 100), ("stream 256", STREAM, 30)):
                        for _ in range(3):  # warm: this client's pooled connection
                            await steps.one(gw, body, steps.Timer())
                        timer = steps.Timer()
                        steps.instrument_once(gw, timer)
                        totals = [await steps.one(gw, body, timer) for _ in range(n)]
                        results.setdefault((label, "forward", client), []).append(timer.spent["forward"] / n * 1000)
                        results.setdefault((label, "hot path total", client), []).append(
                            statistics.median(totals) * 1000)
        finally:
            await gw.stop()
    finally:
        mock.terminate()
        mock.wait(5)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    results = asyncio.run(run(ap.parse_args().rounds))
    print("| scenario | step | raw (median of rounds) | aiohttp | raw / aiohttp |")
    print("|---|---|---|---|---|")
    for label, step in dict.fromkeys((k[0], k[1]) for k in results):
        raw = statistics.median(results[(label, step, "raw")])
        aio = statistics.median(results[(label, step, "aiohttp")])
        print(f"| {label} | {step} | {raw:.3f} ms | {aio:.3f} ms | {raw / aio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
