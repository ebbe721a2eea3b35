"""A lane's qualification state, decided at load time from routes.yaml and the record index.

The result lands in ``lane.qualification`` where the gate (hot path: one dict lookup),
/readyz, `gateway check` and the admin page read it:

    {"state": "qualified" | "unqualified" | "overridden" | "not_required",
     "reason": "...", "record": "<lane>/<stamp>-<hash8>" | None, "override": "<reason>" | None, ...}
"""

from __future__ import annotations

from typing import Any

from ..core.config import Lane
from .identity import lane_identity
from .records import RecordIndex

STATES = ("qualified", "unqualified", "overridden", "not_required")


def evaluate(name: str, lane: Lane, index: RecordIndex, observed_revision: str | None = None,
             index_error: str | None = None) -> dict[str, Any]:
    identity = lane_identity(lane, observed_revision)
    configured = bool(lane.revision)
    override = lane.override.reason if lane.override is not None else None
    out: dict[str, Any] = {
        "state": "unqualified",
        "reason": "",
        "record": None,
        "override": override,
        "identity": identity.hash,
        "config_hash": identity.config_hash,
        "revision": identity.revision,
        "revision_source": "routes.yaml" if configured else ("replica" if observed_revision else None),
    }
    if lane.qualification == "not_required":
        out.update(state="not_required", reason="routes.yaml says qualification: not_required")
        return out

    record = index.passing_for(identity)
    if record is not None:
        out.update(state="qualified", record=record.id, qualified_at=record.when, qualified_by=record.by,
                   reason=f"passed {record.when} by {record.by} ({record.id})")
        if identity.revision is None and record.revision is not None:
            out["reason"] += f"; revision not yet verified (recorded: {record.revision})"
        return out

    reason = _why_not(name, identity, index)
    if index_error:
        reason = f"{reason} (records unavailable: {index_error})"
    if override is not None:
        out.update(state="overridden", reason=f"override: {override} (otherwise refused: {reason})",
                   unqualified_reason=reason)
    else:
        out.update(state="unqualified", reason=reason)
    latest = index.latest_for_lane(name)
    if latest is not None:
        out["latest_run"] = {"record": latest.id, "passed": latest.passed, "at": latest.when,
                             "failures": list(latest.failures)[:3]}
    return out


def _why_not(name: str, identity, index: RecordIndex) -> str:
    hint = f"run `gateway qualify {name}`"
    other_rev = index.passing_config_only(identity)
    if other_rev is not None:
        return (f"the upstream revision changed: qualified with {other_rev.revision!r} ({other_rev.id}), "
                f"the replicas now report {identity.revision!r}; {hint}")
    last_pass = index.latest_passing_for_lane(name)
    if last_pass is not None:
        changed = identity.changed_fields(last_pass.identity) or ["identity"]
        return (f"the lane changed since its last passing record {last_pass.id} "
                f"({', '.join(changed)} differ); {hint}")
    latest = index.latest_for_lane(name)
    if latest is not None and not latest.passed:
        first = latest.failures[0] if latest.failures else "failed"
        return f"its qualification run {latest.id} failed ({first}); {hint}"
    return f"no qualification record for this lane ({identity.describe()}); {hint}"
