"""The gateway's app built in the test's own process (no server, no port): for tests that drive it with
Starlette's TestClient or read its parts, from the same routes a served gateway would load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.app import create_app
from gateway.core.settings import Settings


def make_app(routes: dict[str, Any], folder: Path, *, name: str = "routes.yaml", data_dir: Path | None = None,
             **settings: Any):
    """The app on `routes` (written to folder/name), its data in folder/data unless `data_dir`; no file
    watcher; `settings`: other Settings fields (production, analysis, ...)."""
    path = folder / name
    path.write_text(yaml.safe_dump(routes))
    return create_app(Settings(routes_path=path, data_dir=data_dir or folder / "data", watch_routes=False,
                               **settings))
