"""Requests on their way to the upstream go before the aftermath (gateway/observe/aftermath.py FirstBytes)."""

from __future__ import annotations

import asyncio
import time

from gateway.observe.aftermath import FirstBytes


async def test_quiet_returns_at_once_when_nothing_is_held() -> None:
    fb = FirstBytes(max_wait_s=5)
    t = time.monotonic()
    await fb.quiet()
    assert time.monotonic() - t < 1


async def test_quiet_waits_for_the_release_and_a_hold_releases_once() -> None:
    fb = FirstBytes(max_wait_s=5)
    hold = fb.hold()
    other = fb.hold()
    waiter = asyncio.create_task(fb.quiet())
    await asyncio.sleep(0.01)  # the scenario: the waiter has time to (wrongly) finish before the releases
    hold.release()  # a second release of the same hold changes nothing
    assert fb.held == 1
    await asyncio.sleep(0.01)  # the scenario: time for the waiter to (wrongly) finish
    assert not waiter.done(), "another request is still held"
    other.release()
    await asyncio.wait_for(waiter, 1)
    assert fb.held == 0


async def test_a_steady_stream_of_requests_cannot_starve_the_aftermath() -> None:
    fb = FirstBytes(max_wait_s=0.05)
    fb.hold()  # never released
    t = time.monotonic()
    await asyncio.wait_for(fb.quiet(), 5)
    assert time.monotonic() - t >= 0.04
