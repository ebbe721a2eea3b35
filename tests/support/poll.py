"""Waiting for something a server does after it has answered: poll until true, never a fixed sleep."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
