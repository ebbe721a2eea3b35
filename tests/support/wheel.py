"""Build the project's wheel and install it, alone, into a fresh virtualenv (the way users install it).

Dependencies come from a wheelhouse kept between runs (`$GATEWAY_WHEELHOUSE`, default
~/.cache/lane-gateway/wheelhouse): a warm run installs offline in about 20 s; a cold one fills it from
PyPI first (about a minute). The source is copied first, so the build leaves nothing in the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = Path(os.environ.get("GATEWAY_WHEELHOUSE") or Path.home() / ".cache" / "lane-gateway" / "wheelhouse")
_SKIP = shutil.ignore_patterns(".venv", ".git", "var", "__pycache__", "*.egg-info", "build", "dist",
                               ".pytest_cache", ".hypothesis", "*.pyc")


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n"
                             f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def build_wheel(work: Path) -> Path:
    src = work / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=_SKIP)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", src])
    (wheel,) = (work / "dist").glob("lane_gateway-*.whl")
    return wheel


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell with only this venv on PATH: no PYTHONPATH, no checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST", "GATEWAY_"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A fresh venv holding the wheel and its dependencies only; returns its bin directory."""
    _run([sys.executable, "-m", "venv", venv])
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    offline = subprocess.run([str(c) for c in [*pip, "--no-index", "--find-links", WHEELHOUSE, wheel]],
                             capture_output=True, text=True, env=clean_env(venv))
    if offline.returncode != 0:  # a cold or outdated wheelhouse: fill it from the index, then install offline
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "wheel", "-q", "-w", WHEELHOUSE, wheel])
        for own in WHEELHOUSE.glob("lane_gateway-*.whl"):
            own.unlink()  # always the wheel just built, never an older one of the same version
        _run([*pip, "--no-index", "--find-links", WHEELHOUSE, wheel], env=clean_env(venv))
    return venv / "bin"
