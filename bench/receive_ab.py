#!/usr/bin/env python3
"""What receiving a large request body costs the gateway's event loop, A/B alternated in one server.

The gateway's HTTP protocol (gateway/server/serving.py, uvloop, the wire path of gateway/server/wire.py) serves
a handler that only reads the body (as the pipeline does) and answers `{}`; a client process
sends the same ~2 MB body at concurrency 1. The server's event-loop thread CPU (thread_time) per
request, with the body read one way or the other, alternated in blocks:

    python bench/receive_ab.py                    # A: uvicorn's receive() per read, B: WireRequest.stream()
    python bench/receive_ab.py --requests 400 --bytes 2000000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import uvicorn  # noqa: E402
from starlette.responses import Response  # noqa: E402

from tests.support.gateway_proc import free_port  # noqa: E402

CLIENT = textwrap.dedent("""
    import asyncio, sys, aiohttp
    url, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    body = b'{"model":"m","messages":[' + b'{"role":"user","content":"' + b"x" * (size - 64) + b'"}]}'
    async def main():
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                async with s.post(url, data=body, headers={"content-type": "application/json"}) as r:
                    assert r.status == 200, r.status
                    await r.read()
    asyncio.run(main())
""")


async def _by_receive(request):
    """The body as WireRequest.stream() read it before: uvicorn's receive(), a bytes copy per read."""
    receive = request.receive
    while True:
        message = await receive()
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


class App:
    """An app whose POSTs the gateway's protocol serves on the wire path (gateway/server/wire.py)."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.spent: dict[str, list[float]] = {"A": [], "B": []}
        self.n = 0

    def wire_handler(self, path: str):
        return self.handle

    async def handle(self, request) -> Response:
        way = "A" if (self.n // self.block) % 2 == 0 else "B"
        self.n += 1
        t = time.thread_time()
        if way == "A":
            body = b"".join([c async for c in _by_receive(request)])
        else:
            body = b"".join([c async for c in request.stream()])  # as the pipeline reads it
        spent = time.thread_time() - t
        self.spent[way].append(spent)
        assert body[:1] == b"{" and body[-1:] == b"}"
        return Response(b"{}", media_type="application/json")

    async def __call__(self, scope, receive, send) -> None:  # lifespan and the rest
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--bytes", type=int, default=2_000_000)
    ap.add_argument("--block", type=int, default=10)
    a = ap.parse_args()
    port = free_port()
    app = App(a.block)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", log_level="warning",
                            http="gateway.server.serving:DeadlineHttpToolsProtocol", lifespan="on")
    server = uvicorn.Server(config)

    async def run() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 - uvicorn's Server has a flag, no event to wait on
            await asyncio.sleep(0.05)
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}/v1/chat/completions", str(a.requests),
            str(a.bytes), env=dict(os.environ))
        await client.wait()
        server.should_exit = True
        await serving

    asyncio.run(run())
    for way in "AB":
        v = app.spent[way][a.block:]  # the first block warms up
        print(f"{way}: {len(v)} requests, loop CPU reading the body: median {statistics.median(v) * 1e3:.3f} ms, "
              f"mean {statistics.fmean(v) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
