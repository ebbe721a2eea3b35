"""The gateway under uvicorn directly (a process manager of the operator's own), not `gateway serve`:
without the gateway's HTTP protocol it says so at start; with it (`--http ...DeadlineHttpToolsProtocol`),
a request whose headers never finish is answered 408 within the deadline, as under `gateway serve`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from tests.support.gateway_proc import REPO, free_port, wait_http
from tests.support.routes import lane, routes

WARNING = "serving without the gateway's HTTP protocol"
ROUTES = routes({"a": lane("http://127.0.0.1:9", upstream_model="m")}, {"m": "a"})


@contextmanager
def uvicorn(*extra: str) -> Iterator[tuple[int, Path]]:
    tmp = Path(tempfile.mkdtemp(prefix="gw-uvicorn-"))
    (tmp / "routes.yaml").write_text(yaml.safe_dump(ROUTES), encoding="utf-8")
    port = free_port()
    env = dict(os.environ, GATEWAY_ROUTES=str(tmp / "routes.yaml"), GATEWAY_DATA_DIR=str(tmp / "data"),
               GATEWAY_HEADER_TIMEOUT_S="1", PYTHONUNBUFFERED="1")
    log = tmp / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "gateway.app:create_app", "--factory",
                                 "--host", "127.0.0.1", "--port", str(port), *extra],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", 30.0, proc)
        yield port, log
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def half_sent(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        return s.recv(4096)


def test_plain_uvicorn_warns_that_it_has_no_read_deadlines() -> None:
    with uvicorn() as (_, log):
        assert WARNING in log.read_text()


def test_uvicorn_with_the_gateway_protocol_keeps_the_deadlines() -> None:
    with uvicorn("--http", "gateway.server.serving:DeadlineHttpToolsProtocol") as (port, log):
        answer = half_sent(port)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert WARNING not in log.read_text()
