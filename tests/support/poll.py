"""Waiting for something a server does after it has answered: poll until true, never a fixed sleep.

A fixed sleep is either too short on a loaded machine (a flaky test) or too long everywhere (a slow
one); a poll returns as soon as the condition holds and fails, naming what it waited for, only after a
generous timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

TIMEOUT_S = 30.0  # generous: the machine may be shared; a poll that succeeds returns at once anyway


def _failure(what: str, timeout: float, last: object, detail: Callable[[], object] | None) -> AssertionError:
    msg = f"timed out after {timeout:g}s waiting for {what}"
    if last is not None:
        msg += f" (last error: {last!r:.500})"
    if detail is not None:
        msg += f"\n{detail()}"
    return AssertionError(msg)


def wait_until(cond: Callable[[], T], timeout: float = TIMEOUT_S, what: str = "condition", *,
               interval: float = 0.05, ignore: tuple[type[BaseException], ...] = (),
               detail: Callable[[], object] | None = None) -> T:
    """Call `cond` until it returns something truthy, and return that.

    `ignore`: exceptions that mean "not yet" (a server still starting refuses connections);
    `detail`: what to add to the failure (a log's tail, say)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = cond()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            raise _failure(what, timeout, last, detail)
        time.sleep(interval)  # between two looks at the condition


async def until(cond: Callable[[], T | Awaitable[T]], timeout: float = TIMEOUT_S, what: str = "condition", *,
                interval: float = 0.005, detail: Callable[[], object] | None = None) -> T:
    """`wait_until` inside an event loop: `cond` may be a plain function or return an awaitable; the
    loop runs between two calls, so the code under test makes progress."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise _failure(what, timeout, None, detail)
        await asyncio.sleep(interval)  # the loop runs the code under test meanwhile
