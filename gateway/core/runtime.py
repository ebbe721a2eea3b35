"""The live configuration: lanes built from routes.yaml, swapped atomically on reload.

A request takes the current `Snapshot` once at its start and keeps it to the end, so a stream
that began on a lane finishes there even if routes.yaml moves its alias meanwhile. Upstream
connection pools survive a reload when a lane's replicas and timeouts did not change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from .config import ConfigError, Lane, RoutesConfig, load_routes
from .exchange import AdmissionNote, Exchange
from ..upstream.replicas import Upstream

if TYPE_CHECKING:
    from ..limits.policy import Plan
    from ..routing.base import RoutingPolicy
    from ..render.estimate import Estimator
    from ..render.renderer import Renderer

log = logging.getLogger("gateway.runtime")


@dataclass
class LaneRuntime:
    name: str
    config: Lane
    upstream: Upstream
    router: "RoutingPolicy"
    inflight: int = 0
    # Set by the lane hooks at each (re)load (compose.py wires them): exactly one of renderer
    # (the lane has a template) and estimator (it has none); the limits' plan; the qualification state.
    renderer: "Renderer | None" = None
    estimator: "Estimator | None" = None
    limits_plan: "Plan | None" = None
    qualification: dict[str, Any] | None = None


@dataclass(frozen=True)
class Snapshot:
    config: RoutesConfig
    lanes: dict[str, LaneRuntime]
    version: int
    loaded_at: float

    def resolve(self, model: str) -> LaneRuntime | None:
        name = self.config.models.get(model)
        return self.lanes[name] if name is not None else None


class Policy(Protocol):
    """A hot-path step before forwarding (limits, effort pinning). May rewrite the body, raise GatewayError,
    or raise Reroute to hand the request to another lane."""

    name: str
    # False: what it decides does not depend on the lane (rate limits): a rerouted request keeps it.
    # True: it runs again, on a fresh exchange and the body as the client sent it, for the new lane.
    per_lane: bool

    async def apply(self, ex: Exchange, lane: LaneRuntime, body: dict[str, Any]) -> None: ...


class Reroute(Exception):
    """Raised by a policy: this request is served by `lane` (of the request's snapshot) instead. The
    pipeline runs that lane's gates and its per-lane policies again on a fresh exchange
    (Exchange.rerouted); when the lane cannot take it (a gate refuses it), `refusal` is the answer."""

    def __init__(self, lane: str, reason: str, refusal: Exception, note: AdmissionNote | None = None) -> None:
        super().__init__(f"rerouted to {lane}: {reason}")
        self.lane = lane
        self.reason = reason
        self.refusal = refusal
        self.note = note  # what the deciding policy records on the new exchange


class Finisher(Protocol):
    """Told when an exchange has ended (answered, rejected or failed). Must not block: schedule work."""

    def exchange_ended(self, ex: Exchange, lane: LaneRuntime | None) -> None: ...


LaneHook = Callable[[LaneRuntime], None]


RouterFactory = Callable[[str], "RoutingPolicy"]


class Runtime:
    def __init__(self, config: RoutesConfig, routes_path: Path | None = None, *,
                 make_router: RouterFactory) -> None:
        """`make_router`: a lane's `routing` name -> its router (routing.make_policy, passed by compose.py:
        the core does not depend on the features built on it)."""
        self.make_router = make_router
        self.routes_path = routes_path
        self.finishers: tuple[Finisher, ...] = ()
        self.lane_hooks: tuple[LaneHook, ...] = ()  # run on every new LaneRuntime (e.g. attach a renderer)
        self.last_reload_error: str | None = None
        self.last_reload_at: float | None = None
        self._retired: list[Upstream] = []
        self.snapshot = self._build(config, version=1, previous=None)

    # -- building and swapping ------------------------------------------------------------

    def _build(self, config: RoutesConfig, version: int, previous: Snapshot | None) -> Snapshot:
        lanes: dict[str, LaneRuntime] = {}
        for name, lane in config.lanes.items():
            upstream = Upstream.for_lane(lane)
            old = previous.lanes.get(name) if previous else None
            if old is not None and old.upstream.identity() == upstream.identity():
                upstream = old.upstream  # keep the warm pool and replica health
            lanes[name] = LaneRuntime(name, lane, upstream, self.make_router(lane.routing))
            for hook in self.lane_hooks:
                hook(lanes[name])
        return Snapshot(config, lanes, version, time.time())

    def wire(self, lane_hooks: Sequence[LaneHook], finishers: Sequence[Finisher]) -> None:
        """Set, once, what every lane gets at each (re)load and who hears of every ended exchange,
        in order; the lanes already built get the hooks now."""
        self.lane_hooks = tuple(lane_hooks)
        self.finishers = tuple(finishers)
        self.rerun_lane_hooks()

    def rerun_lane_hooks(self) -> None:
        for lane in self.snapshot.lanes.values():
            for hook in self.lane_hooks:
                hook(lane)

    def apply(self, config: RoutesConfig) -> Snapshot:
        old = self.snapshot
        new = self._build(config, old.version + 1, old)
        kept = {id(lane.upstream) for lane in new.lanes.values()}
        self._retired.extend(lane.upstream for lane in old.lanes.values() if id(lane.upstream) not in kept)
        self.snapshot = new  # one reference assignment: atomic for every later request
        self.last_reload_error = None
        self.last_reload_at = time.time()
        log.info("routes reloaded: version %d, %d lanes, %d models", new.version, len(new.lanes), len(config.models))
        return new

    def reload_from_disk(self) -> bool:
        """Reload routes.yaml; on any error keep serving the old config and remember why."""
        if self.routes_path is None:
            return False
        try:
            config = load_routes(self.routes_path)
        except ConfigError as exc:
            self.last_reload_error = str(exc)
            self.last_reload_at = time.time()
            log.error("routes reload refused, old config keeps serving: %s", exc)
            return False
        self.apply(config)
        return True

    async def close_retired(self, grace_s: float = 0.0) -> None:
        """Close pools of lanes that were reloaded away, once their streams have ended."""
        still: list[Upstream] = []
        for up in self._retired:
            if any(r.inflight for r in up.replicas):
                still.append(up)
            else:
                await up.close()
        self._retired = still

    async def close(self) -> None:
        for lane in self.snapshot.lanes.values():
            await lane.upstream.close()
        for up in self._retired:
            await up.close()

    # -- the end of every exchange -------------------------------------------------------

    def finish(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        if ex.t_end is None:
            ex.t_end = time.perf_counter()
        for finisher in self.finishers:
            try:
                finisher.exchange_ended(ex, lane)
            except Exception:  # a broken observer must never hurt the request path
                log.exception("finisher %r failed", finisher)


async def watch_routes(runtime: Runtime, stop: asyncio.Event,
                       also: Callable[[], Path | None] = lambda: None) -> None:
    """Reload routes.yaml when it or a file it names (`also`: the client key file) changes on disk,
    editors that replace the file included."""
    if runtime.routes_path is None:
        return
    from watchfiles import Change, awatch

    while not stop.is_set():
        files = {runtime.routes_path.resolve()}
        extra = also()
        if extra is not None:
            files.add(extra.resolve())
        # Watch the folders (an editor's rename-over replaces the file's inode) but not below them, and
        # only these files: the data directory (records, WAL files) often lives right beside routes.yaml.
        folders = sorted({str(f.parent) for f in files if f.parent.is_dir()})
        names = {str(f) for f in files}

        def named(change: Change, path: str, names: set[str] = names) -> bool:
            return str(Path(path).resolve()) in names

        async for _ in awatch(*folders, stop_event=stop, debounce=200, step=50, recursive=False,
                              watch_filter=named):
            runtime.reload_from_disk()
            await runtime.close_retired()
            now = also()
            if (now.resolve() if now is not None else None) != (extra.resolve() if extra is not None else None):
                break  # the configuration names another key file: watch that one
