"""Any command as a background service for a test: its log in a file, stopped (then killed) at exit."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log_path: Path
    url: str = ""  # set by the caller when the service speaks HTTP

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def run_service(name: str, cmd: Sequence[str], *, env: dict[str, str], cwd: Path, log_dir: Path) -> Iterator[Service]:
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        yield Service(name, proc, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
