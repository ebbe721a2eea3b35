"""PostgreSQL for tests: a fresh database on the machine's server, or a private server to stop.

- `fresh_database()`: creates a uniquely named database on 127.0.0.1:5432 (trust auth, user
  postgres; `.ci/run` starts the server when it is not running) and drops it afterwards.
- `run_private_postgres()`: initdb + pg_ctl of Debian's PostgreSQL on a free port in a temp dir,
  for the tests that stop the database mid-traffic (never the shared server other tests use).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.emulator_proc import free_port

SERVER = "postgresql://postgres@127.0.0.1:5432"


def _admin(url: str = SERVER + "/postgres"):
    psycopg = pytest.importorskip("psycopg")
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {url} ({str(exc).strip()[:120]}); .ci/run starts one")


@contextlib.contextmanager
def fresh_database(server: str = SERVER) -> Iterator[str]:
    """Yield the URL of a new, empty database; dropped (with its connections) afterwards."""
    name = "gwtest_" + uuid.uuid4().hex[:12]
    with _admin(server + "/postgres") as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with _admin(server + "/postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


@dataclass
class PrivatePostgres:
    port: int
    data: Path
    sock: Path
    _as: list[str]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self._as, _bin("pg_ctl") or "pg_ctl", "-D", str(self.data), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=16MB"
        self._ctl("-o", opts, "-l", str(self.data.parent / "log"), "-w", "start")

    def stop(self) -> None:
        """Fast shutdown: open sessions are terminated, new connections refused."""
        self._ctl("-m", "fast", "-w", "stop")


@contextlib.contextmanager
def run_private_postgres() -> Iterator[PrivatePostgres]:
    initdb = _bin("initdb")
    if initdb is None:
        pytest.skip("PostgreSQL's initdb is not installed (Debian: postgresql)")
    root = Path(tempfile.mkdtemp(prefix="gw-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: run it as the postgres user
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    pg = PrivatePostgres(free_port(), root / "data", root, run_as)
    subprocess.run([*run_as, initdb, "-D", str(pg.data), "-A", "trust", "-U", "postgres", "--no-sync"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    pg.start()
    try:
        yield pg
    finally:
        with contextlib.suppress(Exception):
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)
