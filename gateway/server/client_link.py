"""How the pipeline learns that its client went away while it waits for the upstream.

Waiting for an upstream (its first byte, a whole answer) must end as soon as the client leaves,
or a cancelled agent turn would keep an engine slot busy until it finished. Two ways to learn it:

- `AsgiLink`: under ASGI, only by calling `receive()` until it says `http.disconnect`; that takes
  one watcher task per wait (a task created and cancelled for every upstream wait).
- the wire path (gateway/server/wire.py) hears it from the connection itself (`connection_lost`) and
  cancels the waiting task directly: no watcher at all.

Both raise `ClientGone` in the waiter; the pipeline turns it into a 499 record.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Protocol, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class ClientLink(Protocol):
    async def race(self, awaitable: Awaitable[T]) -> T:
        """`await awaitable`, or raise ClientGone (cancelling it) as soon as the client leaves."""
        ...


class AsgiLink:
    __slots__ = ("receive",)

    def __init__(self, receive: Receive) -> None:
        self.receive = receive

    async def race(self, awaitable: Awaitable[T]) -> T:
        current = asyncio.current_task()
        gone = False

        def on_watcher_done(task: asyncio.Task[Any]) -> None:
            nonlocal gone
            if not task.cancelled() and task.exception() is None and current is not None:
                gone = True
                current.cancel()

        watcher = asyncio.ensure_future(_wait_disconnect(self.receive))
        watcher.add_done_callback(on_watcher_done)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if gone:
                raise ClientGone() from None
            raise
        finally:
            watcher.remove_done_callback(on_watcher_done)
            watcher.cancel()


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
