"""Start the real gateway (uvicorn, a separate process) on a free loopback port for a test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from tests.support.emulator_proc import free_port
from tests.support.poll import TIMEOUT_S, wait_until
from tests.support.records import SENT

REPO = Path(__file__).resolve().parents[2]


def wait_http(url: str, timeout: float = TIMEOUT_S, proc: subprocess.Popen | None = None) -> None:
    """Until `url` answers below 500 (`proc`: the server, whose exit fails the wait at once)."""
    def answers() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback
            return resp.status < 500

    wait_until(answers, timeout, f"{url} to answer", ignore=(OSError,))


@dataclass
class GatewayProc:
    url: str
    proc: subprocess.Popen
    routes_path: Path
    data_dir: Path
    log_path: Path

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def write_routes(self, routes: dict | str) -> None:
        """Replace routes.yaml the way an editor does (write a temp file, rename over)."""
        text = routes if isinstance(routes, str) else yaml.safe_dump(routes, sort_keys=False, allow_unicode=True)
        tmp = self.routes_path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.routes_path)

    def sighup(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def run_gateway(routes: dict | str, *, env: dict[str, str] | None = None, port: int | None = None,
                workers: int = 1, data_dir: Path | None = None) -> Iterator[GatewayProc]:
    port = port or free_port()
    tmp = Path(tempfile.mkdtemp(prefix="gw-test-"))
    if data_dir is None:
        # A fresh records file: requests an earlier gateway on this (reused) port took are not its.
        SENT.pop(f"http://127.0.0.1:{port}", None)
    data_dir = data_dir or tmp / "data"
    routes_path = tmp / "routes.yaml"
    text = routes if isinstance(routes, str) else yaml.safe_dump(routes, sort_keys=False, allow_unicode=True)
    routes_path.write_text(text, encoding="utf-8")
    log_path = tmp / "gateway.log"
    full_env = dict(os.environ)
    full_env.update({"GATEWAY_LOG_LEVEL": "warning", "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--routes", str(routes_path), "--port", str(port),
           "--data-dir", str(data_dir), "--workers", str(workers)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", 30.0, proc)
        yield GatewayProc(url, proc, routes_path, data_dir, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
