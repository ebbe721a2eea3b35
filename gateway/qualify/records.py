"""Qualification records: JSON documents in a directory (default `qualifications/` beside
routes.yaml) or in Redis, plus the in-memory index the gate consults at load time.

A record is written once and never edited. Its top level carries what the gate needs (lane,
identity, hashes, passed, at, by); the rest (outputs, samples, verdicts) is for people and for
the next run's comparisons. Layout on disk: ``<dir>/<lane>/<UTC stamp>-<identity hash 8>.json``.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Protocol

import orjson

from .identity import LaneIdentity

SCHEMA = 1
REDIS_RECORDS_KEY = "gateway:qualify:records"
REDIS_VERSION_KEY = "gateway:qualify:version"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
# `<lane>/<name>`: two plain segments, neither starting with a dot (no `..`, no hidden files), no
# absolute path, no backslash; what record_id_for makes and nothing a path could be built from.
_RECORD_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}/[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class InvalidRecordId(ValueError):
    """A record id that is not `<lane>/<name>` of plain characters, or resolves outside the folder."""


def check_record_id(record_id: object) -> str:
    if not isinstance(record_id, str) or not _RECORD_ID.fullmatch(record_id):
        shown = record_id[:80] if isinstance(record_id, str) else type(record_id).__name__
        raise InvalidRecordId(f"invalid record id {shown!r}: expected <lane>/<name> of letters, digits, '.', '_', '-'")
    return record_id


@dataclass(frozen=True)
class Summary:
    """The part of a record the gate needs, kept in memory."""

    id: str
    lane: str
    passed: bool
    at: float
    by: str
    config_hash: str
    identity_hash: str
    revision: str | None
    identity: dict[str, Any]
    failures: tuple[str, ...] = ()

    @classmethod
    def of(cls, record_id: str, rec: dict[str, Any]) -> "Summary":
        return cls(
            id=record_id,
            lane=str(rec.get("lane", "")),
            passed=bool(rec.get("passed")),
            at=float(rec.get("at_unix") or 0.0),
            by=str(rec.get("by", "")),
            config_hash=str(rec.get("config_hash", "")),
            identity_hash=str(rec.get("identity_hash", "")),
            revision=(rec.get("identity") or {}).get("revision"),
            identity=dict(rec.get("identity") or {}),
            failures=tuple(rec.get("failures") or ()),
        )

    @property
    def when(self) -> str:
        return iso(self.at)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def lane_folder(lane: str) -> str:
    """The first part of a lane's record ids."""
    return _SAFE.sub("_", lane)


def record_id_for(lane: str, identity_hash: str, at: float) -> str:
    dt = datetime.fromtimestamp(at, timezone.utc)
    stamp = dt.strftime("%Y%m%dT%H%M%S") + f"{dt.microsecond // 1000:03d}Z"
    return f"{lane_folder(lane)}/{stamp}-{identity_hash[:8]}"


class RecordStore(Protocol):
    def save(self, record: dict[str, Any]) -> str: ...

    def load(self, record_id: str) -> dict[str, Any] | None: ...

    def summaries(self) -> list[Summary]: ...

    def signature(self) -> Any:
        """Changes whenever a record is added (cheap: polled by a running gateway)."""
        ...

    def describe(self) -> str: ...


class DirStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._cache: dict[Path, tuple[tuple[int, int], Summary | None]] = {}

    def describe(self) -> str:
        return str(self.root)

    def _files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(self.root.glob("*/*.json"))

    def _path(self, record_id: str) -> Path:
        """The record's file, which must resolve inside the folder (a symlinked lane folder may not
        lead out of it)."""
        check_record_id(record_id)
        root = self.root.resolve()
        path = (root / (record_id + ".json")).resolve()
        if not path.is_relative_to(root):
            raise InvalidRecordId(f"record id {record_id[:80]!r} resolves outside the records folder")
        return path

    def save(self, record: dict[str, Any]) -> str:
        record_id = record.get("id") or record_id_for(record["lane"], record["identity_hash"], record["at_unix"])
        self._path(record_id)  # checked before anything is created
        record["id"] = record_id
        lane_dir = self.root / record_id.split("/")[0]
        lane_dir.mkdir(parents=True, exist_ok=True)
        path = self._path(record_id)  # again, now that the lane folder exists (it may be a symlink)
        data = orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)  # readers never see half a record
        except BaseException:
            with _suppress():
                os.unlink(tmp)
            raise
        return record_id

    def load(self, record_id: str) -> dict[str, Any] | None:
        """The record, or None (also for an id that is not one: see check_record_id)."""
        try:
            path = self._path(record_id)
        except InvalidRecordId:
            return None
        try:
            return orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None

    def summaries(self) -> list[Summary]:
        out = []
        seen = set()
        for path in self._files():
            seen.add(path)
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            cached = self._cache.get(path)
            if cached is None or cached[0] != key:
                summary: Summary | None
                try:
                    rec = orjson.loads(path.read_bytes())
                    rid = str(path.relative_to(self.root).with_suffix(""))
                    summary = Summary.of(rid, rec) if isinstance(rec, dict) else None
                except (OSError, orjson.JSONDecodeError, TypeError, ValueError):
                    summary = None  # a broken file qualifies nothing
                cached = (key, summary)
                self._cache[path] = cached
            if cached[1] is not None:
                out.append(cached[1])
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        return out

    def signature(self) -> Any:
        sig = []
        for path in self._files():
            try:
                st = path.stat()
            except OSError:
                continue
            sig.append((str(path), st.st_mtime_ns, st.st_size))
        return tuple(sig)


class RedisStore:
    """Records in one Redis hash (id -> JSON) and a version counter bumped on every write."""

    def __init__(self, url: str) -> None:
        import redis

        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._cache: tuple[Any, list[Summary]] | None = None

    def describe(self) -> str:
        return f"redis {self.url.split('@')[-1]}"

    def save(self, record: dict[str, Any]) -> str:
        record_id = check_record_id(
            record.get("id") or record_id_for(record["lane"], record["identity_hash"], record["at_unix"]))
        record["id"] = record_id
        pipe = self.client.pipeline()
        pipe.hset(REDIS_RECORDS_KEY, record_id, orjson.dumps(record, option=orjson.OPT_SORT_KEYS))
        pipe.incr(REDIS_VERSION_KEY)
        pipe.execute()
        return record_id

    def load(self, record_id: str) -> dict[str, Any] | None:
        try:
            check_record_id(record_id)
        except InvalidRecordId:
            return None
        raw = self.client.hget(REDIS_RECORDS_KEY, record_id)
        return orjson.loads(raw) if raw else None

    def summaries(self) -> list[Summary]:
        version = self.signature()
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        out = []
        for key, raw in self.client.hgetall(REDIS_RECORDS_KEY).items():
            try:
                out.append(Summary.of(key.decode() if isinstance(key, bytes) else key, orjson.loads(raw)))
            except (orjson.JSONDecodeError, TypeError, ValueError):
                continue
        self._cache = (version, out)
        return out

    def signature(self) -> Any:
        return self.client.get(REDIS_VERSION_KEY)


class LayeredStore:
    """Writes go to the first store; reads see all (Redis for new records, the shipped directory below)."""

    def __init__(self, stores: list[RecordStore]) -> None:
        self.stores = stores

    def describe(self) -> str:
        return " + ".join(s.describe() for s in self.stores)

    def save(self, record: dict[str, Any]) -> str:
        return self.stores[0].save(record)

    def load(self, record_id: str) -> dict[str, Any] | None:
        for s in self.stores:
            rec = s.load(record_id)
            if rec is not None:
                return rec
        return None

    def summaries(self) -> list[Summary]:
        seen: dict[str, Summary] = {}
        for s in self.stores:
            for summary in s.summaries():
                seen.setdefault(summary.id, summary)
        return list(seen.values())

    def signature(self) -> Any:
        return tuple(s.signature() for s in self.stores)


def default_records_dir(routes_path: str | Path | None) -> Path:
    """qualifications/ beside routes.yaml (GATEWAY_QUALIFICATIONS, Settings.qualifications, is passed
    to open_store as `records_dir` by the gateway and the command line)."""
    base = Path(routes_path).resolve().parent if routes_path else Path.cwd()
    return base / "qualifications"


def open_store(routes_path: str | Path | None = None, records_dir: str | Path | None = None,
               redis_url: str | None = None) -> RecordStore:
    directory = DirStore(records_dir or default_records_dir(routes_path))
    if redis_url:
        return LayeredStore([RedisStore(redis_url), directory])
    return directory


class RecordIndex:
    """All summaries, grouped for O(1)-ish questions at load time."""

    def __init__(self, summaries: Iterable[Summary]) -> None:
        self.by_config: dict[str, list[Summary]] = {}
        self.by_lane: dict[str, list[Summary]] = {}
        for s in sorted(summaries, key=lambda s: s.at, reverse=True):  # newest first
            self.by_config.setdefault(s.config_hash, []).append(s)
            self.by_lane.setdefault(s.lane, []).append(s)

    def passing_for(self, identity: LaneIdentity) -> Summary | None:
        """The newest passing record for this identity. An unknown revision on either side matches."""
        rev = identity.revision
        for s in self.by_config.get(identity.config_hash, ()):
            if s.passed and (rev is None or s.revision is None or s.revision == rev):
                return s
        return None

    def passing_config_only(self, identity: LaneIdentity) -> Summary | None:
        """A passing record for this configuration whose revision differs (to explain a refusal)."""
        for s in self.by_config.get(identity.config_hash, ()):
            if s.passed:
                return s
        return None

    def latest_passing_for_lane(self, lane: str) -> Summary | None:
        return next((s for s in self.by_lane.get(lane, ()) if s.passed), None)

    def latest_for_lane(self, lane: str) -> Summary | None:
        runs = self.by_lane.get(lane)
        return runs[0] if runs else None


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return True


def now() -> float:
    return time.time()
