"""The KV-event part of the gateway: one subscriber, index and pressure book per replica with a
`kv_events` entry, kept in step with routes.yaml; the analyzer's hook; the admin view and metrics.

Everything here runs on the event loop but off the request path: subscribers in their own tasks,
`judge` in the aftermath (after the response ended), the admin view on request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..core.config import KVEvents, KVEventsPublisher
from ..core.verdict import KvNote
from .index import ReplicaIndex
from ..routing import prefix_index
from .placement import Boundaries
from .pool import fetch_pool_tokens
from .pressure import Pressure
from .subscriber import Subscriber
from .verdict import Question, Verdict, explain

if TYPE_CHECKING:
    from ..core.exchange import Exchange
    from ..core.runtime import LaneRuntime, Runtime
    from ..conversations.job import Outcome
    from ..conversations.state import ConversationState

log = logging.getLogger("gateway.kvevents")

POOL_RETRY_S = 30.0  # ask the engine's /metrics again this often until it answers
MAX_WARNINGS = 200
LOOP_MAX_KEYS = 2048  # a turn with more blocks is walked on the judge's thread


def _walk(index: ReplicaIndex, q: Question | None, keys: Sequence[int], cid: str) -> Verdict | None:
    """What the index says of the turn's blocks (no question: the stream is not live); then they are the
    conversation's, where no one stored them before."""
    verdict = explain(index, q) if q is not None else None
    index.attribute(keys, cid)
    return verdict


@dataclass
class ReplicaKV:
    lane: str
    url: str
    publisher: KVEventsPublisher
    settings: KVEvents
    index: ReplicaIndex
    subscriber: Subscriber
    pressure: Pressure
    api_key: str | None = None
    pool_tokens: int | None = None
    pool_source: str = "unknown"  # config | engine | unknown
    pool_asked_at: float = 0.0
    warned: set[str] = field(default_factory=set)  # conversations currently forecast to be evicted

    @property
    def key(self) -> tuple[str, str]:
        return self.lane, self.url


class KVEventsService:
    def __init__(self, runtime: "Runtime", clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.clock = clock
        self.replicas: dict[tuple[str, str], ReplicaKV] = {}
        self.warnings: deque[dict[str, Any]] = deque(maxlen=MAX_WARNINGS)  # forecasts and alerts, newest last
        self.judged = 0
        self.judged_off_loop = 0  # long prompts, walked on the judge's thread
        self.disagreements = 0
        self.boundaries = Boundaries()
        self.judge_ms_total = 0.0  # time the analyzer's hook spent on the event loop
        self.judge_ms_max = 0.0
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reconciling = asyncio.Lock()
        # Long prompts' walks of the index, one at a time, while their replica's index_busy is held.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-judge")

    # -- keeping subscribers in step with routes.yaml ----------------------------------------------

    def lane_changed(self, lane: "LaneRuntime") -> None:
        """Lane hook (runtime.lane_hooks): a reload may add, move or drop streams."""
        if self._started:
            self._spawn(self.reconcile())

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started = True
        await self.reconcile()

    async def stop(self) -> None:
        self._started = False
        for task in list(self._tasks):
            task.cancel()
        for r in list(self.replicas.values()):
            await r.subscriber.stop()
        self.replicas.clear()

    async def reconcile(self) -> None:
        async with self._reconciling:  # a reload calls the lane hook once per lane
            await self._reconcile()

    async def _reconcile(self) -> None:
        wanted: dict[tuple[str, str], tuple[KVEventsPublisher, KVEvents, str | None]] = {}
        for name, lane in self.runtime.snapshot.lanes.items():
            kv = lane.config.kv_events
            if kv is None:
                continue
            for url, pub in kv.replicas.items():
                wanted[(name, url)] = (pub, kv, lane.config.upstream_api_key())
        for key, r in list(self.replicas.items()):
            w = wanted.get(key)
            if w is None or w[0] != r.publisher or w[1].max_blocks != r.settings.max_blocks:
                await r.subscriber.stop()
                del self.replicas[key]
            else:
                r.settings, r.api_key = w[1], w[2]
                r.pressure.half_life_s, r.pressure.live_for_s = w[1].half_life_s, w[1].live_for_s
                r.pressure.rate_window_s = w[1].rate_window_s
                if w[0].pool_tokens is not None:
                    r.pool_tokens, r.pool_source = w[0].pool_tokens, "config"
        for key, (pub, kv, api_key) in wanted.items():
            if key in self.replicas:
                continue
            index = ReplicaIndex(kv.max_blocks)
            sub = Subscriber(key[1], pub.endpoint, pub.replay, pub.topic, index, clock=self.clock, bind=pub.bind)
            r = ReplicaKV(key[0], key[1], pub, kv, index, sub,
                          Pressure(kv.half_life_s, kv.live_for_s, kv.rate_window_s), api_key)
            if pub.pool_tokens is not None:
                r.pool_tokens, r.pool_source = pub.pool_tokens, "config"
            self.replicas[key] = r
            sub.start()
            if r.pool_tokens is None:
                self._spawn(self._ask_pool(r))

    def _spawn(self, coro: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a reload from another thread (SIGHUP handler, a test): hand it to our loop
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._spawn, coro)
            else:
                coro.close()
            return
        task = loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask_pool(self, r: ReplicaKV) -> None:
        r.pool_asked_at = self.clock()
        tokens = await fetch_pool_tokens(r.url, r.api_key)
        if tokens is not None and r.pool_source != "config":
            r.pool_tokens, r.pool_source = tokens, "engine"

    def _pool(self, r: ReplicaKV) -> int | None:
        if r.pool_tokens is None and self._started and self.clock() - r.pool_asked_at > POOL_RETRY_S:
            self._spawn(self._ask_pool(r))
        return r.pool_tokens

    def replica(self, lane: str, url: str | None) -> ReplicaKV | None:
        return self.replicas.get((lane, url)) if url else None

    # -- the analyzer's hook -----------------------------------------------------------------------

    def stream_ok(self, r: ReplicaKV, since: float | None, until: float) -> bool:
        """Live now, live since before `since` (the index saw everything in between), no unfilled gap."""
        sub = r.subscriber
        start = since if since is not None else until
        if sub.state != "live" or sub.since > start:
            return False
        return sub.last_gap_at is None or sub.last_gap_at < start

    async def judge(self, ex: "Exchange", lane: "LaneRuntime", state: "ConversationState",
                    outcome: "Outcome") -> Verdict | None:
        """Adds `kv` to the turn's cache verdict (and refines an eviction's cause); records the turn. The
        index is asked and the turn's blocks attributed while no one else changes it (`index_busy`: its
        subscriber waits): a long prompt on the service's own thread, the event loop free meanwhile; a
        short one on the loop."""
        t0 = time.perf_counter()
        on_loop = 0.0
        try:
            asked = self._question(ex, lane, state, outcome)
            if asked is None:
                return None
            r, keys, q = asked
            async with r.subscriber.index_busy:
                if len(keys) > LOOP_MAX_KEYS:
                    on_loop += time.perf_counter() - t0
                    verdict = await asyncio.get_running_loop().run_in_executor(
                        self._thread, _walk, r.index, q, keys, state.id)
                    self.judged_off_loop += 1
                    t0 = time.perf_counter()
                else:
                    verdict = _walk(r.index, q, keys, state.id)
            self._conclude(ex, lane, outcome, r, keys, state.id, verdict)
            return verdict
        finally:
            ms = (on_loop + time.perf_counter() - t0) * 1000
            self.judge_ms_max = max(self.judge_ms_max, ms)
            self.judge_ms_total += ms

    def _question(self, ex: "Exchange", lane: "LaneRuntime", state: "ConversationState",
                  outcome: "Outcome") -> tuple[ReplicaKV, "array[int]", Question | None] | None:
        """The replica's index and what to ask it of this turn (no question: the stream is not live); None
        when the index cannot be asked at all (the verdict's `kv` says why)."""
        r = self.replica(lane.name, ex.replica)
        if r is None:
            return None
        cache = outcome.cache
        cid = state.id
        raw = outcome.kv_keys
        keys = array("Q", raw if raw else b"")
        # The conversation moved: its prefix no longer counts in another replica's working set.
        for other in self.replicas.values():
            if other is not r and other.lane == r.lane:
                other.pressure.forget(cid)
        sub = r.subscriber
        kv = cache.kv = KvNote(r.url, sub.state)
        if not keys:
            kv.note = "no exact render of this turn: the index cannot be asked"
            return None
        engine_block = r.index.block_size
        if engine_block is not None and engine_block != lane.config.cache.block_size:
            kv.note = (f"the lane's cache.block_size is {lane.config.cache.block_size}, the engine's blocks are "
                       f"{engine_block} tokens: fix routes.yaml; verdict from counts only")
            return None
        if sub.state != "live":
            kv.note = f"the replica's KV-event stream is {sub.state}: verdict from counts only"
            return r, keys, None
        live = r.pressure.live.get(cid)
        since = live.last_t if live is not None else (state.updated if state.turn else None)
        ok = self.stream_ok(r, since, ex.started_wall)
        return r, keys, Question(cid, keys, cache.rendered_prompt_tokens or 0, cache.predicted_cached_tokens or 0,
                                 cache.reported_cached_tokens, ex.started_wall, since, ok)

    def _conclude(self, ex: "Exchange", lane: "LaneRuntime", outcome: "Outcome", r: ReplicaKV,
                  keys: "array[int]", cid: str, verdict: Verdict | None) -> None:
        """The index's answer into the turn's verdict; the replica's pressure after the turn."""
        cache = outcome.cache
        kv = cache.kv
        assert kv is not None  # set by _question
        if verdict is not None:
            kv.evidence = verdict.as_dict()
            self.judged += 1
            if verdict.agrees is False:
                self.disagreements += 1
                log.info("kv index of %s held %d tokens of %s, the engine reported %s", r.url,
                         verdict.held_tokens, ex.request_id, cache.reported_cached_tokens)
            if cache.verdict == "eviction":
                if verdict.cause == "never_stored":
                    cache.verdict, cache.cause = "cold", "never_stored"
                elif verdict.cause != "held":
                    cache.cause = verdict.cause
        block = r.index.block_size or 1
        self._note_boundaries(ex, lane.name, keys, outcome.kv_ends, block)
        now = self.clock()
        r.pressure.turn(cid, len(keys) * block, now)
        kv.pressure = self._after_turn(r, now)

    def _note_boundaries(self, ex: "Exchange", lane: str, keys: Sequence[int], ends_raw: bytes | None,
                         block: int) -> None:
        body = ex.chat or {}
        messages = body.get("messages")
        if not ends_raw or not isinstance(messages, list) or not messages:
            return
        head = prefix_index.seed(lane, ex.tenant, ex.thinking_applied, ex.effort_applied, body.get("tools"))
        self.boundaries.note(lane, messages, head, array("I", ends_raw).tolist(), keys, block)

    # -- what routers ask (routing/conversation_affinity.py, prefix_source: kv_events) --------------

    def prefix_hint(self, lane: str, messages: list[Any], head: int, urls: list[str]) -> dict[str, tuple[float, int]]:
        """Per replica URL whose pool holds a prefix of `messages`: (share of their characters, characters),
        as routing/prefix_index.Lookup.best answers; only replicas with a live stream are asked."""
        indexes = {u: r.index for u in urls if (r := self.replicas.get((lane, u))) is not None
                   and r.subscriber.healthy}
        held = self.boundaries.held(lane, messages, head, indexes)
        if not held:
            return {}
        sizes = [prefix_index.message_chars(m) for m in messages]
        total = sum(sizes) or 1
        return {u: (sum(sizes[: p + 1]) / total, sum(sizes[: p + 1])) for u, (p, _) in held.items()}

    def room(self, lane: str, url: str) -> int | None:
        """Pool tokens not claimed by the replica's working set (None: no stream or no pool size)."""
        r = self.replicas.get((lane, url))
        if r is None or not r.subscriber.healthy or r.pool_tokens is None:
            return None
        weighted, _, _ = r.pressure.working_set(self.clock())
        return int(r.pool_tokens - weighted)

    def tokens_of(self, lane: str, conversation: str) -> int | None:
        for r in self.replicas.values():
            if r.lane == lane and (c := r.pressure.live.get(conversation)) is not None:
                return c.tokens
        return None

    def _after_turn(self, r: ReplicaKV, now: float) -> dict[str, Any]:
        summary = r.pressure.summary(r.index, self._pool(r), now)
        doomed = {f["conversation"] for f in summary["forecast"] if f["will_be_evicted"]}
        for cid in sorted(doomed - r.warned):
            f = next(f for f in summary["forecast"] if f["conversation"] == cid)
            self.warnings.append({"at": now, "kind": "forecast_eviction", "lane": r.lane, "replica": r.url,
                                  "conversation": cid, **f})
            log.warning("kv pool of %s: conversation %s will be evicted before its next turn (%s)", r.url, cid, f)
        r.warned = doomed
        alert = summary["alert"]
        if alert is not None:
            alert["options"]["move_to"] = self._moves(r, alert["largest"])
        if alert is not None and alert["since"] == now:
            self.warnings.append({"at": now, "kind": "working_set_exceeds_pool", "lane": r.lane, "replica": r.url,
                                  **alert})
            log.warning("kv pool of %s: %s", r.url, alert["message"])
        return {"pool_tokens": summary["pool_tokens"], "working_set_tokens": summary["working_set_tokens"],
                "forecast_evictions": sorted(doomed), "alert": alert is not None}

    def _moves(self, r: ReplicaKV, largest: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Where the largest conversations of an over-full pool would fit: replicas of the same lane with room."""
        rooms = {o.url: self.room(o.lane, o.url) for o in self.replicas.values() if o.lane == r.lane and o is not r}
        room = {u: v for u, v in rooms.items() if v is not None}
        out = []
        for c in largest:
            fits = [u for u, v in room.items() if v >= c["tokens"]]
            if fits:
                best = max(fits, key=lambda u: room[u])
                room[best] -= c["tokens"]
                out.append({"conversation": c["conversation"], "tokens": c["tokens"], "to": best})
        return out

    # -- views -------------------------------------------------------------------------------------

    def overview(self, lane: str | None = None) -> dict[str, Any]:
        now = self.clock()
        out = []
        for r in self.replicas.values():
            if lane is not None and r.lane != lane:
                continue
            summary = r.pressure.summary(r.index, self._pool(r), now)
            if summary["alert"] is not None:
                summary["alert"]["options"]["move_to"] = self._moves(r, summary["alert"]["largest"])
            out.append({"lane": r.lane, "replica": r.url, "pool_source": r.pool_source,
                        "stream": r.subscriber.snapshot(), "index": r.index.counters(), **summary})
        return {"now": now, "replicas": out, "judged": self.judged, "judged_off_loop": self.judged_off_loop,
                "disagreements": self.disagreements,
                "judge_ms_mean": round(self.judge_ms_total / self.judged, 3) if self.judged else None,
                "judge_ms_max": round(self.judge_ms_max, 3),
                "warnings": list(self.warnings)[-50:]}

    def collect(self) -> Iterator[Any]:
        labels = ["lane", "replica"]
        fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "up": GaugeMetricFamily("gateway_kv_stream_up", "1 when the replica's KV-event stream is live",
                                    labels=labels),
            "pool": GaugeMetricFamily("gateway_kv_pool_tokens", "KV pool size in tokens", labels=labels),
            "held": GaugeMetricFamily("gateway_kv_held_tokens", "Tokens the index says the pool holds", labels=labels),
            "occ": GaugeMetricFamily("gateway_kv_pool_occupancy", "Held tokens / pool tokens", labels=labels),
            "ws": GaugeMetricFamily("gateway_kv_working_set_tokens",
                                    "Live conversations' prefix tokens weighted by recency", labels=labels),
            "fc": GaugeMetricFamily("gateway_kv_forecast_evictions",
                                    "Live conversations forecast to be evicted before their next turn", labels=labels),
            "alert": GaugeMetricFamily("gateway_kv_pressure_alert", "1 when the working set exceeds the pool",
                                       labels=labels),
            "bytes": GaugeMetricFamily("gateway_kv_index_bytes", "Approximate memory of the replica's index",
                                       labels=labels),
            "events": CounterMetricFamily("gateway_kv_events", "KV events applied", labels=labels),
            "gaps": CounterMetricFamily("gateway_kv_sequence_gaps", "Jumps in the event sequence", labels=labels),
            "lost": CounterMetricFamily("gateway_kv_batches_lost", "Event batches neither received nor replayed",
                                        labels=labels),
            "restarts": CounterMetricFamily("gateway_kv_engine_restarts", "Engine restarts seen in the event stream",
                                            labels=labels),
        }
        now = self.clock()
        for r in self.replicas.values():
            lv = [r.lane, r.url]
            pool = r.pool_tokens
            weighted, _, _ = r.pressure.working_set(now)
            doomed = sum(1 for f in r.pressure.forecast(r.index, pool, now) if f.will_be_evicted)
            fams["up"].add_metric(lv, 1.0 if r.subscriber.healthy else 0.0)
            if pool:
                fams["pool"].add_metric(lv, pool)
                fams["occ"].add_metric(lv, r.index.held_tokens / pool)
                fams["alert"].add_metric(lv, 1.0 if weighted > pool else 0.0)
            fams["held"].add_metric(lv, r.index.held_tokens)
            fams["ws"].add_metric(lv, weighted)
            fams["fc"].add_metric(lv, doomed)
            fams["bytes"].add_metric(lv, r.index.approx_bytes())
            s = r.subscriber
            fams["events"].add_metric(lv, s.events)
            fams["gaps"].add_metric(lv, s.gaps)
            fams["lost"].add_metric(lv, s.unfilled)
            fams["restarts"].add_metric(lv, s.restarts)
        yield from fams.values()
        yield CounterMetricFamily("gateway_kv_turns_judged", "Turns explained from the KV-event index",
                                  value=self.judged)
        yield CounterMetricFamily("gateway_kv_index_disagreements",
                                  "Turns where the index's held tokens differed from the engine's cached tokens",
                                  value=self.disagreements)
