"""Fixtures shared by the suite's files: services every file starts the same way.

A fixture whose knobs differ from file to file stays in its file, built with tests/support's builders
(run_emulator, run_gateway, routes.lane); only fixtures that are the same everywhere live here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.emulator_proc import AGENT_EMULATOR, LIMITED_EMULATOR, EmulatorProc, run_emulator
from tests.support.engine_proc import EngineProc, engine_fixture
from tests.support.redis_proc import run_redis


@pytest.fixture(scope="session")
def engine() -> EngineProc:
    """The real vLLM engine, one per pytest session (skipped when it is not installed)."""
    return engine_fixture()


@pytest.fixture(scope="module")
def agent_emulator() -> Iterator[EmulatorProc]:
    """The agent emulator (AGENT_EMULATOR: vLLM-shaped DeepSeek-V4.1 that thinks), one per test file:
    a file's module-scoped gateway stands on it; a test that needs an empty prefix cache asks for
    `agent_emu` instead, which hands it over reset."""
    with run_emulator(**AGENT_EMULATOR) as emu:
        yield emu


@pytest.fixture()
def agent_emu(agent_emulator: EmulatorProc) -> EmulatorProc:
    """The file's agent emulator with an empty prefix cache, zeroed stats and the knobs it started
    with: an earlier test's identical first turn would otherwise be a hit."""
    agent_emulator.reset(config=True)
    return agent_emulator


@pytest.fixture(scope="module")
def limited_emu() -> Iterator[EmulatorProc]:
    """The lane-limit tests' emulator (LIMITED_EMULATOR: an engine that refuses what a lane's limits
    should have refused first), one per test file."""
    with run_emulator(**LIMITED_EMULATOR) as emu:
        yield emu


@pytest.fixture()
def redis_url() -> Iterator[str]:
    """A private redis-server for this test (never the machine's), as a URL."""
    with run_redis() as port:
        yield f"redis://127.0.0.1:{port}/0"
