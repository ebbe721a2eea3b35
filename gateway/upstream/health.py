"""Active replica health: per lane, GET a cheap path on every replica every so often.

Passive health comes from real traffic (gateway.upstream.replicas: consecutive connection failures,
timeouts and 5xx open a replica's breaker). A lane may add an active probe in routes.yaml::

    breaker: {failures: 3, cool_down_s: 5, probe_interval_s: 2, probe_path: /health}

A failed probe (no connection, a timeout, a 5xx) counts as one failure of the replica, so a dead
replica's breaker opens before real requests pay for finding out. A passed probe on an open
replica ends its cool-down at once: the next real request is its half-open probe. A probe never
closes a breaker by itself: a replica that answers /health but fails every generation stays out.

Results are kept per replica URL in ``HealthProber.results``; ``GET /admin/api/health``
(admin key) shows every replica's breaker state (closed, open, half_open) and its last probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response

if TYPE_CHECKING:
    from ..core.runtime import LaneRuntime, Runtime
    from .replicas import Replica

log = logging.getLogger("gateway.health")

IDLE_WAKE_S = 1.0  # how often the loop looks for lanes that gained a probe through a reload
MAX_PROBE_TIMEOUT_S = 5.0


class HealthProber:
    def __init__(self, runtime: "Runtime") -> None:
        self.runtime = runtime
        self.results: dict[str, dict[str, Any]] = {}
        self.probes = 0
        self._due: dict[int, float] = {}
        self._pending: dict[int, asyncio.Task[None]] = {}

    def _settled(self, key: int, task: asyncio.Task[None]) -> None:
        self._pending.pop(key, None)

    def _targets(self) -> list[tuple["LaneRuntime", "Replica", float]]:
        out: list[tuple["LaneRuntime", "Replica", float]] = []
        for lane in self.runtime.snapshot.lanes.values():
            interval = lane.config.breaker.probe_interval_s
            if interval:
                out.extend((lane, rep, interval) for rep in lane.upstream.replicas)
        return out

    def tick(self, now: float) -> float:
        """Start the probes that are due; return when the next one is."""
        targets = self._targets()
        live = {id(rep) for _, rep, _ in targets}
        for key in [k for k in self._due if k not in live]:  # lanes reloaded away
            self._due.pop(key, None)
        wake = now + IDLE_WAKE_S
        for lane, rep, interval in targets:
            key = id(rep)
            due = self._due.get(key, 0.0)
            if due <= now and key not in self._pending:
                self._due[key] = due = now + interval
                task = asyncio.get_running_loop().create_task(self.probe(lane, rep, interval))
                self._pending[key] = task
                task.add_done_callback(functools.partial(self._settled, key))
            wake = min(wake, due)
        return wake

    async def probe(self, lane: "LaneRuntime", rep: "Replica", interval: float) -> None:
        upstream = lane.upstream
        path = lane.config.breaker.probe_path
        timeout = min(MAX_PROBE_TIMEOUT_S, max(interval, lane.config.timeouts.connect + 0.5))
        headers = {"Authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
        t0 = time.perf_counter()
        result: dict[str, Any] = {"lane": lane.name, "path": path, "at": time.time()}
        try:
            async with asyncio.timeout(timeout):
                async with upstream.session().get(rep.url + path, headers=headers) as resp:
                    await resp.read()
                    status = resp.status
            result.update(ok=status < 500, status=status)
        except TimeoutError:
            result.update(ok=False, error=f"no answer within {timeout:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            result.update(ok=False, error=type(exc).__name__)
        result["ms"] = round((time.perf_counter() - t0) * 1000, 2)
        self.probes += 1
        self.results[rep.url] = result
        if result["ok"]:
            upstream.probe_passed(rep)
        else:
            why = result.get("error") or f"HTTP {result.get('status')}"
            upstream.record_failure(rep, f"health probe {path}: {why}")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                wake = self.tick(time.monotonic())
            except Exception:  # a bad tick must not end health checking
                log.exception("health probe scheduling failed")
                wake = time.monotonic() + IDLE_WAKE_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.01, wake - time.monotonic()))

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        lanes: dict[str, Any] = {}
        for name, lane in self.runtime.snapshot.lanes.items():
            lanes[name] = [{
                "url": r.url, "state": r.state(now), "inflight": r.inflight,
                "consecutive_failures": r.consecutive_failures, "opened": r.opened,
                "last_error": r.last_error, "probe": self.results.get(r.url),
            } for r in lane.upstream.replicas]
        return {"probes": self.probes, "lanes": lanes}


class HealthService:
    """The prober's loop as a part of the gateway: started and stopped with it."""

    def __init__(self, prober: HealthProber) -> None:
        self.prober = prober
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.prober.run(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        tasks = list(self.prober._pending.values()) + ([self._task] if self._task else [])
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def route(self, request: Request) -> Response:
        return Response(orjson.dumps(self.prober.snapshot()), media_type="application/json",
                        headers={"Cache-Control": "no-store"})
