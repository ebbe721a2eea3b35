"""Every benchmark script still starts: its imports of the gateway and of tests/support resolve and its
arguments parse (`--help`), so a move in the code cannot leave a benchmark broken until someone runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
