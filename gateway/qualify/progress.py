"""Progress bars on stderr (tqdm); silent when stderr is not a terminal or when asked."""

from __future__ import annotations

import sys
from typing import Any


class _Null:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Null":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class Progress:
    def __init__(self, enabled: bool | None = None) -> None:
        # None: only on a terminal (tqdm's own rule).
        self.enabled = enabled

    def bar(self, desc: str, total: int) -> Any:
        if self.enabled is False:
            return _Null()
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            return _Null()
        return tqdm(total=total, desc=f"{desc:<24}", unit="req", file=sys.stderr, leave=True,
                    disable=None if self.enabled is None else not self.enabled, dynamic_ncols=True)


SILENT = Progress(False)
