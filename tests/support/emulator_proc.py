"""Run the upstream emulator as a real subprocess on a free loopback port, for tests.

    with run_emulator(flavour="sglang", decode_tps=200) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key="x")
        ...
        emu.stats()["cancelled"]

As a pytest fixture: `yield from emulator_fixture(flavour="vllm")` inside a fixture function, or use
the context manager directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(method: str, url: str, body: Any = None, timeout: float = 5.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
        raw = resp.read()
    return json.loads(raw) if raw else None


@dataclass
class EmulatorProc:
    url: str  # http://127.0.0.1:PORT
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def base_url(self) -> str:
        """What an OpenAI client wants as base_url."""
        return self.url + "/v1"

    def stats(self) -> dict[str, Any]:
        return _request("GET", self.url + "/emulator/stats")

    def reset(self, *, config: bool = True) -> dict[str, Any]:
        """Clear cache and stats; with config=True also restore the knobs it was started with."""
        return _request("POST", self.url + "/emulator/reset" + ("?config=1" if config else ""), {})

    def configure(self, **knobs: Any) -> dict[str, Any]:
        return _request("POST", self.url + "/emulator/config", knobs)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode} before {url}/health answered")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:  # noqa: S310
                if resp.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.03)
    raise TimeoutError(f"emulator at {url} not healthy within {timeout}s ({last})")


@contextlib.contextmanager
def run_emulator(*, port: int | None = None, extra_args: list[str] | None = None,
                 **knobs: Any) -> Iterator[EmulatorProc]:
    """Start `python -m gateway.emulator` with `knobs` (EmulatorConfig fields); kill it on exit."""
    port = port or free_port()
    log_path = Path(tempfile.mkdtemp(prefix="emu-test-")) / "emulator.log"
    cmd = [sys.executable, "-m", "gateway.emulator", "--host", "127.0.0.1", "--port", str(port)]
    if knobs:
        cmd += ["--config-json", json.dumps(knobs)]
    cmd += extra_args or []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield EmulatorProc(url, port, proc, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def emulator_fixture(**knobs: Any) -> Iterator[EmulatorProc]:
    """Body of a pytest fixture: `yield from emulator_fixture(flavour="sglang")`."""
    with run_emulator(**knobs) as emu:
        yield emu
