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
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.poll import TIMEOUT_S, wait_until

REPO = Path(__file__).resolve().parents[2]
# The conversation tests' engine: a vLLM-shaped DeepSeek-V4.1 engine that thinks, with 16-token cache
# blocks (the lane they talk through: tests/support/routes.agent_lane).
AGENT_EMULATOR: dict[str, Any] = {"flavour": "vllm", "tokenizer": "dsv41", "default_thinking": True, "block_size": 16}
# The lane-limit tests' engine: vLLM's own limits (images, top_logprobs, a 4096-token window), counted with
# the real DeepSeek-V4.1 renderer and tokenizer; their lanes state the same limits.
# The KV-event tests' engine (run_kv_emulator): short answers without reasoning, 16-token blocks.
KV_EMULATOR: dict[str, Any] = {"flavour": "vllm", "tokenizer": "dsv41", "block_size": 16, "output_tokens": 8,
                               "reasoning_tokens": 0}
LIMITED_EMULATOR: dict[str, Any] = {"flavour": "vllm", "tokenizer": "dsv41", "max_images": 4, "max_top_logprobs": 32,
                                    "max_model_len": 4096}


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


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = TIMEOUT_S) -> None:
    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode} before {url}/health answered")
        with urllib.request.urlopen(url + "/health", timeout=1) as resp:  # noqa: S310
            return resp.status == 200

    wait_until(healthy, timeout, f"the emulator at {url} healthy", interval=0.03, ignore=(OSError,))


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


@contextlib.contextmanager
def run_kv_emulator(**knobs: Any) -> Iterator[tuple[EmulatorProc, dict[str, Any]]]:
    """An emulator that publishes its prefix cache's KV events as vLLM does (on two free ports), and what
    a lane's `kv_events.replicas` says of it (add `pool_tokens` to taste)."""
    port, replay = free_port(), free_port()
    with run_emulator(kv_events_port=port, kv_events_replay_port=replay, **knobs) as emu:
        yield emu, {"endpoint": f"tcp://127.0.0.1:{port}", "replay": f"tcp://127.0.0.1:{replay}"}


def emulator_fixture(**knobs: Any) -> Iterator[EmulatorProc]:
    """Body of a pytest fixture: `yield from emulator_fixture(flavour="sglang")`."""
    with run_emulator(**knobs) as emu:
        yield emu
