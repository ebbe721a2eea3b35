"""Fixtures shared by the suite's files."""

from __future__ import annotations

import pytest

from tests.support.engine_proc import EngineProc, engine_fixture


@pytest.fixture(scope="session")
def engine() -> EngineProc:
    """The real vLLM engine, one per pytest session (skipped when it is not installed)."""
    return engine_fixture()
