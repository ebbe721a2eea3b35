"""One Settings holds every environment switch (gateway/core/settings.py): nothing else in the package
reads a GATEWAY_* variable but the secrets, a variable that does not read is refused by name, and the
defaults Settings documents are the ones the parts use when they are built without it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from gateway.core.settings import Settings, SettingsError

PACKAGE = Path(__file__).resolve().parents[1] / "gateway"
SECRETS = {"GATEWAY_ADMIN_KEY", "GATEWAY_API_KEY", "GATEWAY_QUALIFY_TOKEN"}  # read where they are checked


def _environ_reads(tree: ast.AST) -> list[str]:
    """The GATEWAY_* names read through os.environ.get(...), os.getenv(...) or os.environ[...] (not written)."""
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = ast.unparse(node.func)
            if func in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
                name = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                ast.unparse(node.value) in ("os.environ", "environ") and isinstance(node.slice, ast.Constant):
            name = node.slice.value
        if isinstance(name, str) and name.startswith("GATEWAY_"):
            found.append(name)
    return found


def test_no_module_but_settings_reads_a_switch() -> None:
    stray = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "core" / "settings.py":
            continue
        names = set(_environ_reads(ast.parse(path.read_text(encoding="utf-8")))) - SECRETS
        if names:
            stray[str(path.relative_to(PACKAGE.parent))] = sorted(names)
    assert stray == {}


def test_every_switch_is_documented_with_its_variable() -> None:
    for f in dataclasses.fields(Settings):
        assert f.metadata.get("env"), f"Settings.{f.name} names no environment variable"


def test_a_variable_that_does_not_read_is_refused_by_name(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_AFTERMATH_WORKERS", "many")
    with pytest.raises(SettingsError, match="GATEWAY_AFTERMATH_WORKERS='many'"):
        Settings()
    monkeypatch.delenv("GATEWAY_AFTERMATH_WORKERS")
    monkeypatch.setenv("GATEWAY_ACCESS_LOG_FORMAT", "xml")
    with pytest.raises(SettingsError, match="GATEWAY_ACCESS_LOG_FORMAT"):
        Settings()


def test_read_once_when_made(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_HISTORY_MEMO_MB", "8")
    settings = Settings()
    monkeypatch.setenv("GATEWAY_HISTORY_MEMO_MB", "16")
    assert settings.history_memo_mb == 8.0 and Settings().history_memo_mb == 16.0


def test_deadlines_are_positive_seconds_or_the_default(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_HEADER_TIMEOUT_S", "0")
    monkeypatch.setenv("GATEWAY_BODY_TIMEOUT_S", "soon")
    settings = Settings()
    assert (settings.header_timeout_s, settings.body_timeout_s) == (10.0, 60.0)


def test_the_parts_defaults_are_the_settings_defaults(monkeypatch) -> None:
    """A part built without Settings (tests, benchmarks) runs as the gateway does by default."""
    from gateway.cli.main import DEMO_DECODE_TPS, DEMO_PREFILL_TPS
    from gateway.conversations import handoff, memo, worker_main
    from gateway.observe import aftermath
    from gateway.pipeline import history_memo
    from gateway.records import store_redis
    from gateway.render import cache
    from gateway.server import serving
    from gateway.store import memory

    for f in dataclasses.fields(Settings):
        for name, *_ in f.metadata["env"]:
            monkeypatch.delenv(name, raising=False)
    s = Settings()
    assert s.state_max_bytes == memory.DEFAULT_MAX_BYTES
    assert s.analysis_memo_bytes == memo.DEFAULT_MAX_BYTES
    assert s.analysis_ring_mb == handoff.DEFAULT_RING_MB
    assert s.analysis_nice == worker_main.NICENESS
    assert (s.aftermath_workers, s.aftermath_coalesce, s.aftermath_max_coalesced, s.aftermath_max_bytes) == (
        aftermath.DEFAULT_WORKERS, aftermath.DEFAULT_COALESCE, aftermath.DEFAULT_MAX_COALESCED,
        aftermath.DEFAULT_MAX_QUEUE_BYTES)
    assert int(s.history_memo_mb * 2**20) == history_memo.DEFAULT_MAX_BYTES
    assert s.render_cache_bytes == cache.DEFAULT_BUDGET_BYTES
    assert s.records_stream == store_redis.DEFAULT_KEY
    assert (s.header_timeout_s, s.body_timeout_s) == (serving.HEADER_TIMEOUT_S, serving.BODY_TIMEOUT_S)
    assert (s.demo_decode_tps, s.demo_prefill_tps) == (DEMO_DECODE_TPS, DEMO_PREFILL_TPS)


def test_settings_reach_the_analysis_worker_as_they_are() -> None:
    import pickle

    settings = Settings(analysis_nice=7, render_native=False)
    assert pickle.loads(pickle.dumps(settings)) == settings
