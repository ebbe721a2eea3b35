"""What a reader asks of the records: one filter shape for SQLite, PostgreSQL, the admin API and the CLIs.

Each store turns a `Filters` into a WHERE clause with its own placeholder (`?` or `%s`); values
always travel as parameters, never inside the SQL text.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

# Filters that compare one column for equality, in the order they are applied.
EQUAL = ("lane", "tenant", "client", "conversation", "cause", "verdict", "gateway")


@dataclass(frozen=True)
class Filters:
    lane: str | None = None
    tenant: str | None = None
    client: str | None = None  # the client program (see record.client_of)
    user_agent: str | None = None  # a substring of the User-Agent header
    conversation: str | None = None
    cause: str | None = None
    verdict: str | None = None
    gateway: str | None = None
    verdicts: tuple[str, ...] = ()  # any of these verdicts
    since: float | None = None  # epoch seconds, inclusive
    until: float | None = None  # epoch seconds, exclusive

    def with_(self, **kw: Any) -> "Filters":
        return replace(self, **kw)

    def as_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v not in (None, ()):
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


def where(f: Filters, mark: str = "?") -> tuple[str, list[Any]]:
    """(" WHERE ...", args) for `f`; ("", []) when it filters nothing."""
    clauses: list[str] = []
    args: list[Any] = []
    for name in EQUAL:
        v = getattr(f, name)
        if v:
            clauses.append(f'"{name}" = {mark}')
            args.append(v)
    if f.user_agent:
        # Substring match, with LIKE's wildcards in the client's text taken literally.
        esc = f.user_agent.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        clauses.append(f"user_agent LIKE {mark} ESCAPE '\\'")
        args.append(f"%{esc}%")
    if f.verdicts:
        clauses.append("verdict IN (" + ", ".join(mark for _ in f.verdicts) + ")")
        args.extend(f.verdicts)
    if f.since is not None:
        clauses.append(f"ts >= {mark}")
        args.append(float(f.since))
    if f.until is not None:
        clauses.append(f"ts < {mark}")
        args.append(float(f.until))
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def matches(row: dict[str, Any], f: Filters) -> bool:
    """The same filter in Python, for records read back from the Redis stream."""
    for name in EQUAL:
        v = getattr(f, name)
        if v and row.get(name) != v:
            return False
    if f.user_agent and f.user_agent not in (row.get("user_agent") or ""):
        return False
    if f.verdicts and row.get("verdict") not in f.verdicts:
        return False
    ts = row.get("ts") or 0.0
    if f.since is not None and ts < f.since:
        return False
    return not (f.until is not None and ts >= f.until)
