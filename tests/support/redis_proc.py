"""A private redis-server on a free loopback port, for tests that must not touch the machine's Redis."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from typing import Iterator

import pytest

from tests.support.emulator_proc import free_port


@contextlib.contextmanager
def run_redis() -> Iterator[int]:
    """Yield the port of a fresh redis-server (skips the test when redis-server is not installed)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
