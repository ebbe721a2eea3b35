"""A private redis-server on a free loopback port, for tests that must not touch the machine's Redis."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from typing import Iterator

import pytest

from tests.support.emulator_proc import free_port
from tests.support.poll import wait_until


@contextlib.contextmanager
def run_redis(port: int | None = None) -> Iterator[int]:
    """Yield the port of a fresh redis-server, on `port` if given (a test that restarts it there), else
    on a free one; skips the test when redis-server is not installed."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    port = port or free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening() -> bool:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True

    wait_until(listening, what=f"redis-server on port {port}", ignore=(OSError,))
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
