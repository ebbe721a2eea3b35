"""Refuse unqualified lanes: the gate, the state in lane.qualification, and the qualify routes.

- At every (re)load a lane hook evaluates each lane against the record index and stores the state
  in ``lane.qualification``; the gate on the hot path reads only that dict.
- A background task re-reads the records when they change (a new `gateway qualify` run), checks
  the revision the replicas report on GET /v1/models, and re-evaluates.
- ``POST /qualify/v1/chat/completions`` addresses a lane by its name (``"model": "<lane>"``), for
  `gateway qualify --gateway URL`. Like every /qualify route it needs the qualify token (header
  ``X-Gateway-Qualify``) or the admin key (declared in the route table, checked by security.py), and
  it lets an unqualified lane through, so it can be qualified. Other gates still apply; the hot-path
  policies (limits, effort pinning) do not: the engine sees the suite exactly as written, as it
  does when `gateway qualify` runs in-process.
- ``GET /qualify/state``, ``POST /qualify/refresh``, ``GET /qualify/records?lane=..``,
  ``POST /qualify/records`` for the CLI and the admin page.

The token is ``$GATEWAY_QUALIFY_TOKEN``, or the admin key (``gateway.admin_key_env``), or else a
random one the gateway writes to ``<data dir>/qualify.token`` (mode 0600) at start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..core.answer import Answer
from ..core.errors import GatewayError
from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime, Runtime, Snapshot
from ..server.security import Caller
from .client import replica_revision
from .identity import lane_identity
from .records import InvalidRecordId, RecordIndex, RecordStore, Summary, check_record_id, lane_folder, open_store
from .state import evaluate

if TYPE_CHECKING:
    from ..pipeline.flow import Pipeline
    from ..core.settings import Settings

log = logging.getLogger("gateway.qualify")

TOKEN_FILE = "qualify.token"


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _ascii(text: str, limit: int = 200) -> str:
    return text.encode("ascii", "replace").decode()[:limit]


QUALIFY_CALLER = Caller("qualify")  # the tenant of runs sent through the qualify route


class QualificationService:
    """Evaluates every lane at each (re)load (a lane hook), refuses unqualified lanes (a gate), keeps the
    record index fresh (a background watcher), and serves the /qualify routes through `pipeline`: a
    pipeline that addresses lanes by name, with no gate and no policy (see _LaneAddressed)."""

    def __init__(self, runtime: "Runtime", settings: "Settings", pipeline: "Pipeline",
                 store: RecordStore | None = None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.pipeline = pipeline
        self.store = store or open_store(settings.routes_path, settings.qualifications, settings.redis_url)
        self.observed: dict[tuple, str | None] = {}  # (lane, replicas, model) -> revision reported
        self._index = RecordIndex(())
        self._signature: Any = object()
        self._index_error: str | None = None
        self._file_token: str | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- records --------------------------------------------------------------------------------

    def reload_index(self) -> RecordIndex:
        """Re-read the records if they changed (blocking: call it from a thread once serving)."""
        try:
            sig = self.store.signature()
            if sig != self._signature:
                self._index = RecordIndex(self.store.summaries())
                self._signature = sig
            self._index_error = None
        except Exception as exc:  # noqa: BLE001 - keep the last good index
            self._index_error = f"{type(exc).__name__}: {exc}"
            log.error("qualification records unavailable (%s): keeping what was loaded", self._index_error)
        return self._index

    def changed(self) -> bool:
        try:
            return self.store.signature() != self._signature
        except Exception:  # noqa: BLE001
            return False

    # -- state ------------------------------------------------------------------------------------

    @staticmethod
    def _key(lane: LaneRuntime) -> tuple:
        return (lane.name, tuple(lane.config.replicas), lane.config.upstream_model)

    def hook(self, lane: LaneRuntime) -> None:
        """Lane hook: runs for every lane at load and reload. Memory only: the watcher keeps the index fresh."""
        state = evaluate(lane.name, lane.config, self._index, self.observed.get(self._key(lane)),
                         self._index_error)
        previous = lane.qualification
        lane.qualification = state
        if previous is None or previous.get("state") != state["state"]:
            level = logging.WARNING if state["state"] in ("unqualified", "overridden") else logging.INFO
            log.log(level, "lane %s: %s: %s", lane.name, state["state"], state["reason"])

    def refresh(self) -> None:
        self.runtime.rerun_lane_hooks()

    def states(self) -> dict[str, Any]:
        snap = self.runtime.snapshot
        out = {}
        for name, lane in snap.lanes.items():
            state = dict(lane.qualification or {})
            state["identity_fields"] = lane_identity(lane.config, self.observed.get(self._key(lane))).fields
            state["engine"] = lane.config.engine
            out[name] = state
        return {"lanes": out, "store": self.store.describe(), "config_version": snap.version}

    async def check_revisions(self) -> bool:
        """Ask each lane's replicas for their model root; True when something changed."""
        snap = self.runtime.snapshot
        changed = False

        async def one(lane: LaneRuntime) -> None:
            nonlocal changed
            rev = await replica_revision(lane.config, timeout=2.0)
            if rev is None:
                return  # unreachable: keep what was known
            key = self._key(lane)
            if self.observed.get(key) != rev:
                self.observed[key] = rev
                changed = True

        await asyncio.gather(*(one(lane) for lane in snap.lanes.values() if not lane.config.revision))
        return changed

    async def watch(self, stop: asyncio.Event) -> None:
        version = None
        loop = asyncio.get_running_loop()
        next_revision = 0.0
        while not stop.is_set():
            try:
                snap = self.runtime.snapshot
                rerun = False
                if snap.version != version or loop.time() >= next_revision:
                    version = snap.version
                    next_revision = loop.time() + self.settings.qualify_revision_s
                    rerun = await self.check_revisions()
                if await asyncio.to_thread(self.changed):
                    await asyncio.to_thread(self.reload_index)
                    rerun = True
                if rerun:
                    self.refresh()
            except Exception:  # noqa: BLE001 - the watcher must survive anything
                log.exception("qualification watcher step failed")
            try:
                await asyncio.wait_for(stop.wait(), self.settings.qualify_poll_s)
            except TimeoutError:
                pass

    # -- the gate (hot path) ------------------------------------------------------------------------

    async def gate(self, ex: Exchange, lane: LaneRuntime) -> None:
        q = lane.qualification
        if q is None:
            return
        state = q["state"]
        if state == "unqualified":
            raise GatewayError(503, f"lane '{lane.name}' is not qualified: {q['reason']}",
                               code="lane_not_qualified", type="service_unavailable")
        if state == "overridden":
            ex.qualification = "overridden"
            ex.response_headers["X-Gateway-Lane-Override"] = _ascii(q.get("override") or "")

    # -- token -----------------------------------------------------------------------------------

    def tokens(self) -> list[str]:
        # Secrets are read where they are checked, never held in Settings (settings.py): the qualify
        # token, and the admin key from the variable routes.yaml names (a reload may name another).
        out = []
        env = os.environ.get("GATEWAY_QUALIFY_TOKEN")
        if env:
            out.append(env)
        admin_env = self.runtime.snapshot.config.gateway.admin_key_env
        if admin_env and os.environ.get(admin_env):
            out.append(os.environ[admin_env])
        if self._file_token is None and not env:
            self._read_token_file()
        if self._file_token:
            out.append(self._file_token)
        return out

    def ensure_token_file(self) -> None:
        if os.environ.get("GATEWAY_QUALIFY_TOKEN"):  # a secret: not in Settings (tokens())
            return
        path = Path(self.settings.data_dir) / TOKEN_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as fh:
                    fh.write(secrets.token_urlsafe(24) + "\n")
        except OSError as exc:
            log.warning("cannot keep a qualify token in %s: %s", path, exc)
        self._read_token_file()

    def _read_token_file(self) -> None:
        try:
            self._file_token = (Path(self.settings.data_dir) / TOKEN_FILE).read_text().strip() or None
        except OSError:
            self._file_token = None

    # -- routes ----------------------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.watch(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()

    async def route_chat(self, request: Request) -> Answer:
        return await self.pipeline.chat(request, QUALIFY_CALLER)

    async def route_completions(self, request: Request) -> Answer:
        return await self.pipeline.completions(request, QUALIFY_CALLER)

    async def route_state(self, request: Request) -> Response:
        return _json(self.states())

    async def route_refresh(self, request: Request) -> Response:
        await self.check_revisions()
        await asyncio.to_thread(self.reload_index)
        self.refresh()
        return _json(self.states())

    async def route_records(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                record = orjson.loads(await request.body())
                if not isinstance(record, dict) or not record.get("lane") or not record.get("config_hash"):
                    raise ValueError("not a qualification record")
                if not isinstance(record["lane"], str) or ("id" not in record and (
                        not isinstance(record.get("identity_hash"), str)
                        or not isinstance(record.get("at_unix"), (int, float)))):
                    raise ValueError("lane and identity_hash must be strings and at_unix a number (or give an id)")
                if "id" in record and not check_record_id(record["id"]).startswith(lane_folder(record["lane"]) + "/"):
                    raise ValueError("the id must start with the record's lane")
            except (orjson.JSONDecodeError, ValueError, OverflowError) as exc:  # InvalidRecordId included
                raise GatewayError(400, f"bad record: {exc}", code="invalid_record") from None
            # The qualify token writes records for the lanes this gateway serves, and never rewrites one.
            if record["lane"] not in self.runtime.snapshot.lanes:
                raise GatewayError(404, f"no lane named {record['lane'][:80]!r}", param="lane", code="lane_not_found")
            if "id" in record and await asyncio.to_thread(self.store.load, record["id"]) is not None:
                raise GatewayError(409, f"record {record['id']!r} exists; records are never overwritten",
                                   param="id", code="record_exists")
            try:
                saved = await asyncio.to_thread(self.store.save, record)
            except (ValueError, OverflowError) as exc:
                raise GatewayError(400, f"bad record: {exc}", code="invalid_record") from None
            await asyncio.to_thread(self.reload_index)
            self.refresh()
            lane = self.runtime.snapshot.lanes.get(record["lane"])
            return _json({"id": saved, "state": lane.qualification if lane else None})
        record_id = request.query_params.get("id")
        if record_id:
            try:
                check_record_id(record_id)
            except InvalidRecordId as exc:
                raise GatewayError(400, str(exc), param="id", code="invalid_record_id") from None
            rec = await asyncio.to_thread(self.store.load, record_id)
            return _json(rec) if rec else _json({"error": {"message": "no such record", "code": "not_found"}}, 404)
        lane_name = request.query_params.get("lane")
        idx = await asyncio.to_thread(self.reload_index)
        runs: list[Summary] = (list(idx.by_lane.get(lane_name, ())) if lane_name
                               else [s for v in idx.by_lane.values() for s in v])
        if request.query_params.get("passed") in ("1", "true"):
            runs = [s for s in runs if s.passed]
        if request.query_params.get("latest") in ("1", "true"):
            if not runs:
                return _json(None)
            return _json(await asyncio.to_thread(self.store.load, runs[0].id))
        return _json([dataclasses.asdict(s) for s in runs])


class LaneAddressed:
    """The runtime seen by the qualify route: every lane answers to its own name; the rest is shared.

    Its pipeline has no policies: the engine must see the suite exactly as written, as it does
    in-process, so that hashes and numbers from both ways of qualifying compare (a pinned effort, for
    example, would switch thinking on and change every output).
    """

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._cache: tuple[Snapshot, Snapshot] | None = None

    @property
    def snapshot(self) -> Snapshot:
        snap = self._runtime.snapshot
        if self._cache is None or self._cache[0] is not snap:
            config = snap.config.model_copy(update={"models": {name: name for name in snap.lanes}})
            self._cache = (snap, Snapshot(config, snap.lanes, snap.version, snap.loaded_at))
        return self._cache[1]

    def finish(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        ex.qualification_run = True
        self._runtime.finish(ex, lane)
