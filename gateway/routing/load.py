"""The load every gateway process puts on each replica, as one process sees it.

Each process knows its own in-flight requests per replica exactly (`Replica.inflight`). Several
processes on one store publish theirs every `interval_s` and read the others', so bounded load
compares a replica's whole in-flight count with the lane's mean (the others' part is at most one
interval old). With the memory store (one process) nothing is published.

Smoothed load: every `sample_s` the board also folds each replica's whole in-flight count into an
exponential moving average (time constant: the lane's `load_window_s`). Bounded load re-homes a
conversation only when its home is over the bound now *and* on that average, so the ordinary
jitter of a few agents' turns does not move conversations (each move costs a cold prefill), while
a home that stays overloaded sheds conversations until it is not.

Homes: how many conversations each replica is home to (placements, decayed with a half-life, since
conversations end without saying so). New conversations go where fewer live, so the replicas'
prefix-cache pools fill evenly, not just their queues.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from typing import Any

import orjson

log = logging.getLogger("gateway.routing")

PROCS_INDEX = "route:procs"
LOAD_PREFIX = "route:load:"


class Homes:
    """Decayed count of conversations placed per replica, per lane (this process's placements)."""

    def __init__(self, half_life_s: float = 900.0) -> None:
        self.rate = math.log(2) / half_life_s
        self._counts: dict[tuple[str, str], tuple[float, float]] = {}  # (lane, url) -> (value, at)

    def get(self, lane: str, url: str, now: float | None = None) -> float:
        item = self._counts.get((lane, url))
        if item is None:
            return 0.0
        value, at = item
        now = time.monotonic() if now is None else now
        return value * math.exp(-self.rate * (now - at))

    def add(self, lane: str, url: str, delta: float) -> None:
        now = time.monotonic()
        self._counts[(lane, url)] = (max(0.0, self.get(lane, url, now) + delta), now)

    def snapshot(self) -> dict[str, dict[str, float]]:
        now = time.monotonic()
        out: dict[str, dict[str, float]] = {}
        for (lane, url) in self._counts:
            out.setdefault(lane, {})[url] = round(self.get(lane, url, now), 3)
        return out


class LoadBoard:
    """This process's view of every process's in-flight requests and homes, per lane and replica."""

    def __init__(self, store: Any = None, interval_s: float = 0.5, ttl_s: float = 3.0, sample_s: float = 0.1) -> None:
        self.store = store
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.sample_s = sample_s
        self.windows: dict[str, float] = {}  # lane -> load_window_s
        self._ewma: dict[tuple[str, str], float] = {}
        self._sampled_at: float | None = None
        self.proc = uuid.uuid4().hex[:12]
        self.homes = Homes()
        # Other processes' figures: lane -> url -> value.
        self.remote_inflight: dict[str, dict[str, float]] = {}
        self.remote_homes: dict[str, dict[str, float]] = {}
        self.peers = 0
        self.published = 0
        self.read_failures = 0
        self._lanes: Any = None  # callable returning {lane: [Replica]}
        self._task: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        return self.store is not None and self.store.name != "memory"

    def inflight(self, lane: str, url: str, local: int) -> float:
        return local + self.remote_inflight.get(lane, {}).get(url, 0.0)

    def smoothed(self, lane: str, url: str) -> float | None:
        """The replica's in-flight count averaged over the lane's window; None before the first sample."""
        return self._ewma.get((lane, url))

    def sample(self, now: float | None = None) -> None:
        """Fold the current in-flight counts into the moving averages (called every `sample_s`)."""
        now = time.monotonic() if now is None else now
        dt = self.sample_s if self._sampled_at is None else now - self._sampled_at
        self._sampled_at = now
        lanes = self._lanes() if self._lanes is not None else {}
        for lane, replicas in lanes.items():
            window = self.windows.get(lane, 2.0)
            alpha = 1.0 if window <= 0 else 1.0 - math.exp(-dt / window)
            for r in replicas:
                key = (lane, r.url)
                value = self.inflight(lane, r.url, r.inflight)
                old = self._ewma.get(key)
                self._ewma[key] = value if old is None else old + alpha * (value - old)

    def home_count(self, lane: str, url: str) -> float:
        return self.homes.get(lane, url) + self.remote_homes.get(lane, {}).get(url, 0.0)

    # -- publishing ---------------------------------------------------------------------------------

    def start(self, lanes) -> None:
        """`lanes()` -> {lane name: [Replica]}: what to publish. Runs until stop()."""
        self._lanes = lanes
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            if self.shared:
                try:
                    await self.store.delete(LOAD_PREFIX + self.proc)
                except Exception:  # noqa: BLE001 - shutting down anyway
                    pass

    async def _run(self) -> None:
        next_exchange = 0.0
        while True:
            now = time.monotonic()
            if self.shared and now >= next_exchange:
                next_exchange = now + self.interval_s
                try:
                    await self.exchange()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - a hiccup must never stop the board
                    self.read_failures += 1
                    log.debug("load board exchange failed", exc_info=True)
            self.sample()
            await asyncio.sleep(self.sample_s)

    def mine(self) -> dict[str, Any]:
        lanes = self._lanes() if self._lanes is not None else {}
        inflight = {lane: {r.url: r.inflight for r in replicas} for lane, replicas in lanes.items()}
        return {"t": time.time(), "i": inflight, "h": self.homes.snapshot()}

    async def exchange(self) -> None:
        """Publish this process's figures and read everybody else's (3 store calls)."""
        store = self.store
        await store.set(LOAD_PREFIX + self.proc, orjson.dumps(self.mine()), self.ttl_s)
        await store.index_add(PROCS_INDEX, self.proc, time.time(), 256)
        self.published += 1
        procs = [p for p in await store.index_newest(PROCS_INDEX, 64) if p != self.proc]
        values = await store.mget([LOAD_PREFIX + p for p in procs]) if procs else []
        inflight: dict[str, dict[str, float]] = {}
        homes: dict[str, dict[str, float]] = {}
        now = time.time()
        peers = 0
        for raw in values:
            if raw is None:
                continue  # that process stopped (its entry expired)
            try:
                d = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if now - float(d.get("t", 0)) > self.ttl_s:
                continue
            peers += 1
            for target, figures in ((inflight, d.get("i") or {}), (homes, d.get("h") or {})):
                for lane, per in figures.items():
                    slot = target.setdefault(lane, {})
                    for url, v in per.items():
                        slot[url] = slot.get(url, 0.0) + float(v)
        self.remote_inflight, self.remote_homes, self.peers = inflight, homes, peers

    def describe(self) -> dict[str, Any]:
        return {"process": self.proc, "shared": self.shared, "peers": self.peers, "published": self.published,
                "remote_inflight": self.remote_inflight, "homes": self.homes.snapshot(),
                "smoothed": {f"{lane} {url}": round(v, 2) for (lane, url), v in self._ewma.items()},
                "remote_homes": self.remote_homes}
