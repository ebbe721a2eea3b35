"""Every benchmark script still starts: its imports of the gateway and of tests/support resolve and its
arguments parse (`--help`), so a move in the code cannot leave a benchmark broken until someone runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "bench").glob("*.py"))


def test_every_benchmark_script_starts() -> None:
    assert len(SCRIPTS) > 10
    procs = {p.name: subprocess.Popen([sys.executable, str(p), "--help"], cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE) for p in SCRIPTS}
    failed = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0 or b"usage" not in out.lower():
            failed[name] = err.decode(errors="replace")[-400:]
    assert not failed, failed


def test_the_per_step_benchmark_runs_a_few_requests() -> None:
    """bench/steps.py drives the pipeline in process (its answer, its aftermath): a change of those
    interfaces must not leave it broken."""
    if not (REPO.parent / "shared" / "tools" / "mock_upstream.py").exists():
        pytest.skip("../shared/tools/mock_upstream.py not found")
    out = subprocess.run([sys.executable, str(REPO / "bench" / "steps.py"), "--only", "small", "--requests", "5"],
                         cwd=REPO, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    assert b"hot path total" in out.stdout
