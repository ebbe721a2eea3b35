"""A TCP proxy on loopback that delays what the client sends by a fixed time (a store far away)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Iterator

from tests.support.gateway_proc import free_port


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while data := await reader.read(65536):
            if delay:
                await asyncio.sleep(delay)  # the scenario: a far store, its bytes late
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


@contextlib.contextmanager
def latency_proxy(target_port: int, delay_s: float) -> Iterator[int]:
    """Yield a port that forwards to 127.0.0.1:target_port, each client write `delay_s` late."""
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(_pipe(reader, up_writer, delay_s), _pipe(up_reader, writer, 0.0))

    stop = asyncio.Event()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        ready.set()
        async with server:
            await stop.wait()
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()  # the connections' pipes

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
