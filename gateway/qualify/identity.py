"""What a qualification vouches for: the lane's identity, hashed.

A record is valid for a lane only while these fields are unchanged: the engine, the upstream
model, its revision (configured, or the `root` a replica reports on GET /v1/models), the replica
URLs, the template variant (the render section) and the limits; for emulated demo lanes also the
emulator section, which plays the part of the engine build. Timeouts, routing and cache modelling
are gateway-side and do not count.

Only values that differ from the defaults enter the hash (``exclude_defaults``), so a new optional
setting added to the code does not silently invalidate every record.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import xxhash

from ..core.config import Lane

# The order shown to humans.
FIELDS = ("engine", "upstream_model", "revision", "replicas", "template", "limits", "emulator")


def _hash(obj: Any) -> str:
    return xxhash.xxh3_128_hexdigest(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS))


@dataclass(frozen=True)
class LaneIdentity:
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def revision(self) -> str | None:
        return self.fields.get("revision")

    @property
    def config_hash(self) -> str:
        """Everything but the revision: known from routes.yaml alone, so the gate can match at load."""
        return _hash({k: v for k, v in self.fields.items() if k != "revision"})

    @property
    def hash(self) -> str:
        return _hash(self.fields)

    def with_revision(self, revision: str | None) -> "LaneIdentity":
        return LaneIdentity({**self.fields, "revision": revision})

    def changed_fields(self, other: dict[str, Any]) -> list[str]:
        """Names of the fields that differ from another identity's fields (revision: only when both known)."""
        out = []
        for name in FIELDS:
            mine, theirs = self.fields.get(name), other.get(name)
            if name == "revision" and (mine is None or theirs is None):
                continue
            if mine != theirs:
                out.append(name)
        return out

    def describe(self) -> str:
        f = self.fields
        rev = f.get("revision") or "unknown"
        return (f"engine {f.get('engine')}, model {f.get('upstream_model')}, revision {rev}, "
                f"{len(f.get('replicas') or ())} replica(s)")


def lane_identity(lane: Lane, revision: str | None = None) -> LaneIdentity:
    """The identity of a lane as configured; `revision` is what a replica reported, if known.

    A `revision:` written in routes.yaml wins over what the replica reports.
    """
    configured = lane.revision
    fields: dict[str, Any] = {
        "engine": lane.engine,
        "upstream_model": lane.upstream_model,
        "revision": configured or revision,
        "replicas": sorted(lane.replicas),
        "template": _render_identity(lane),
        "limits": lane.limits.model_dump(mode="json", exclude_defaults=True),
        "emulator": lane.emulator.model_dump(mode="json", exclude_defaults=True) if lane.emulator else None,
    }
    return LaneIdentity(fields)


def _render_identity(lane: Lane) -> dict[str, Any]:
    """The render section; a lane's own template file counts by its name and content, not where it lies
    (the same file moved keeps its records; an edited one needs a new run)."""
    out = lane.render.model_dump(mode="json", exclude_defaults=True)
    from ..render.template import is_file_reference

    for key in ("template", "tokenizer_path"):
        path = out.get(key)
        if isinstance(path, str) and (key == "tokenizer_path" or is_file_reference(path)):
            try:
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
            except OSError:
                digest = "missing"
            out[key] = f"{Path(path).name}@sha256:{digest}"
    return out


def revision_is_configured(lane: Lane) -> bool:
    return bool(lane.revision)
