"""The read deadlines' one timer per connection (gateway/server/serving.py): a phase's deadline fires when it
is due, whatever timer an earlier phase left armed, and a phase that ended fires nothing."""

from __future__ import annotations

import asyncio
import time

from gateway.server.serving import DeadlineHttpToolsProtocol
from tests.support.poll import until


class _Timers:
    """The protocol's timer methods on a bare object: only `loop` is needed."""

    _arm = DeadlineHttpToolsProtocol._arm
    _disarm = DeadlineHttpToolsProtocol._disarm
    _check = DeadlineHttpToolsProtocol._check

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._deadline = None
        self._due = None
        self._late = None
        self.fired: list[tuple[str, float]] = []
        self.t0 = time.monotonic()

    def late(self, name: str):
        return lambda: self.fired.append((name, time.monotonic() - self.t0))


async def test_a_phase_fires_when_due() -> None:
    t = _Timers()
    t._arm(0.05, t.late("headers"))
    await until(lambda: t.fired)
    assert t.fired[0][0] == "headers" and t.fired[0][1] >= 0.05


async def test_a_shorter_later_phase_is_not_held_back_by_the_armed_timer() -> None:
    t = _Timers()
    t._arm(5.0, t.late("headers"))
    t._arm(0.05, t.late("body"))  # the armed timer would fire 5 s from now: re-armed
    await until(lambda: t.fired, 2.0, what="a phase's timer")
    assert t.fired == [("body", t.fired[0][1])] and 0.05 <= t.fired[0][1] < 2.0


async def test_a_timer_left_by_an_ended_phase_re_arms_for_the_next_one() -> None:
    t = _Timers()
    t._arm(0.05, t.late("first"))
    t._disarm()  # the request was complete at once
    await asyncio.sleep(0.02)  # the scenario: some time passes before the next phase arms
    t._arm(0.1, t.late("second"))  # due at ~0.12; the old timer fires at ~0.05 and finds it not yet due
    await until(lambda: t.fired)
    assert [n for n, _ in t.fired] == ["second"] and t.fired[0][1] >= 0.12


async def test_an_ended_phase_fires_nothing() -> None:
    t = _Timers()
    t._arm(0.03, t.late("headers"))
    t._disarm()
    await until(lambda: t._deadline is None)  # the timer ran and found nothing due
    assert t.fired == []
