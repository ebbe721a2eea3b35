"""Prometheus metrics at GET /metrics: per-lane histograms and counters, live gauges.

Counters and histograms are fed by an aftermath sink (after the response, off the hot path), through
plain dicts applied to the registry at each scrape and within FLUSH_S (1 s) otherwise;
in-flight and replica-health gauges are read from the runtime at scrape time, so the request
path pays nothing for them. Labels are bounded: lane, replica, status class, verdict, cause,
limit name, effort action; free-form values beyond a small set fold into "other".

Several worker processes: set PROMETHEUS_MULTIPROC_DIR (an empty directory) before start and
counters/histograms are summed across workers; live gauges then show the answering worker only.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, GCCollector,
                               Histogram, PlatformCollector, ProcessCollector, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from ..core.exchange import Exchange
from ..core.verdict import VERDICTS, CacheVerdict
from ..records.record import decode_speed, reasoning_tokens, reported_cached_tokens

if TYPE_CHECKING:
    from .aftermath import Aftermath
    from ..conversations.analyzer import Analyzer
    from ..records.feature import Records
    from ..core.runtime import LaneRuntime, Runtime

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
DECODE_BUCKETS = (1, 2, 5, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150, 200, 300, 500)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)
DURATION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
OVERHEAD_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
REWRITE_ACTION = "pinned"  # the effort policy changed the request to the conversation's pinned effort
FLUSH_S = 1.0  # requests' counts reach the registry within this, and at every scrape
MAX_GAPS_PER_REQUEST = 64  # sample long streams evenly: the distribution, at bounded cost
STATUS_CLASSES = ("2xx", "4xx", "5xx", "cancelled")
EFFORT_ACTIONS = ("first", "kept", "pinned", "repinned", "warned", "off")


class BoundedLabel:
    """Turns free-form values into label values from a set of at most `limit` distinct names."""

    _clean = re.compile(r"[^A-Za-z0-9_.:/-]+")

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        # What each string value became, for the values seen before: the same answer without the
        # regular expression (a few calls per request). Bounded like `seen`.
        self._known: dict[str, str] = {}

    def __call__(self, value: Any) -> str:
        known = self._known.get(value) if type(value) is str else None
        if known is not None:
            return known
        text = self._clean.sub("_", str(value))[:64] or "none"
        if text in self.seen:
            label = text
        elif len(self.seen) >= self.limit:
            return "other"  # not remembered: a later value may not take a place that frees (none does)
        else:
            self.seen.add(text)
            label = text
        if type(value) is str and len(self._known) < 4 * self.limit:
            self._known[value] = label
        return label


class _Observed:
    """A histogram child's observations since the last flush, as counts per bucket and a sum: what
    `observe` adds one value at a time (prometheus_client 0.26: the first bucket whose bound is at
    least the value, and the sum), applied in one `inc` per bucket. A value that is not a number, or
    a child without those parts, is observed as it came."""

    __slots__ = ("child", "bounds", "counts", "total", "odd")

    def __init__(self, child: Any) -> None:
        self.child = child
        bounds = getattr(child, "_upper_bounds", None)
        parts = hasattr(child, "_buckets") and hasattr(child, "_sum")
        self.bounds: list[float] | None = list(bounds) if bounds and parts else None
        self.counts = [0] * len(self.bounds) if self.bounds is not None else []
        self.total = 0.0
        self.odd: list[float] = []

    def add(self, value: float) -> None:
        bounds = self.bounds
        if bounds is not None and value == value and value <= bounds[-1]:  # not NaN, within the last bound
            self.counts[bisect_left(bounds, value)] += 1
            self.total += value
        else:
            self.odd.append(value)

    def apply(self) -> None:
        child = self.child
        if any(self.counts):
            child._sum.inc(self.total)
            for bucket, n in zip(child._buckets, self.counts):
                if n:
                    bucket.inc(n)
        for value in self.odd:
            child.observe(value)


def status_class(ex: Exchange) -> str:
    if ex.cancelled or ex.status == 499:
        return "cancelled"
    if ex.status < 100:
        return "none"
    return f"{ex.status // 100}xx"


class Metrics:
    """The counters and histograms, and the sink that feeds them."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry
        L = ["lane"]
        self.requests = Counter("gateway_requests", "Finished requests", ["lane", "status_class"], registry=r)
        self.prompt_tokens = Counter("gateway_prompt_tokens", "Prompt tokens (usage)", L, registry=r)
        self.prompt_tokens_reported = Counter(
            "gateway_prompt_tokens_cache_reported", "Prompt tokens of requests whose cached tokens were reported",
            L, registry=r)
        self.cached_reported = Counter("gateway_cached_tokens_reported", "Cached prompt tokens the engine reported",
                                       L, registry=r)
        self.cached_predicted = Counter("gateway_cached_tokens_predicted", "Cached prompt tokens the gateway predicted",
                                        L, registry=r)
        self.completion_tokens = Counter("gateway_completion_tokens", "Completion tokens (usage)", L, registry=r)
        self.reasoning_tokens = Counter("gateway_reasoning_tokens", "Reasoning tokens (usage)", L, registry=r)
        self.verdicts = Counter("gateway_cache_verdicts", "Cache verdicts", ["lane", "verdict"], registry=r)
        self.drift_tokens = Counter("gateway_drift_tokens_lost", "Prompt tokens re-prefilled because of drift",
                                    ["lane", "cause"], registry=r)
        self.drift_seconds = Counter("gateway_drift_seconds_lost", "Estimated prefill seconds lost to drift",
                                     ["lane", "cause"], registry=r)
        self.evictions = Counter("gateway_eviction_misses", "Cache misses with a stable prefix (evictions)",
                                 L, registry=r)
        self.eviction_tokens = Counter("gateway_eviction_tokens_lost", "Prompt tokens re-prefilled after eviction",
                                       L, registry=r)
        self.effort_rewrites = Counter("gateway_effort_rewrites", "Requests whose reasoning effort the gateway pinned",
                                       L, registry=r)
        self.effort_actions = Counter("gateway_effort_actions", "Effort policy decisions (first, kept, pinned, ...)",
                                      ["lane", "action"], registry=r)
        self.limits_fired = Counter("gateway_limits_fired", "Lane limits that fired (any policy)",
                                    ["lane", "limit"], registry=r)
        self.limit_rejections = Counter("gateway_limit_rejections", "Requests refused by a lane limit",
                                        ["lane", "limit"], registry=r)
        self.upstream_errors = Counter("gateway_upstream_errors", "Upstream failures and error answers",
                                       ["lane", "replica", "status_class"], registry=r)
        self.heals = Counter("gateway_heals", "Drifted messages the gateway repaired before forwarding",
                             ["lane", "kind"], registry=r)
        self.healed_tokens = Counter("gateway_healed_tokens", "Cached prompt tokens kept by drift healing "
                                     "(the prefix kept beyond what the client's bytes would have kept)",
                                     ["lane", "kind"], registry=r)
        self.retries = Counter("gateway_upstream_retries", "Failovers to another replica before the first byte",
                               L, registry=r)
        self.ttft = Histogram("gateway_ttft_seconds", "Time to first content byte (streaming, successful)",
                              L, buckets=TTFT_BUCKETS, registry=r)
        self.ttfb = Histogram("gateway_ttfb_seconds", "Time to the upstream's first byte (successful)",
                              L, buckets=TTFT_BUCKETS, registry=r)
        self.decode = Histogram("gateway_decode_tokens_per_second", "Decode speed, first to last content byte",
                                L, buckets=DECODE_BUCKETS, registry=r)
        self.gaps = Histogram("gateway_inter_chunk_gap_seconds", "Gaps between token-bearing chunks (sampled)",
                              L, buckets=GAP_BUCKETS, registry=r)
        self.duration = Histogram("gateway_request_duration_seconds", "Whole request, start to end",
                                  L, buckets=DURATION_BUCKETS, registry=r)
        self.overhead = Histogram("gateway_overhead_seconds", "Gateway time before forwarding",
                                  L, buckets=OVERHEAD_BUCKETS, registry=r)
        self.model_requests = Counter("gateway_model_requests", "Finished requests per public model (names from "
                                      "routes.yaml; any other name counts as 'unknown')",
                                      ["model", "lane", "status_class"], registry=r)
        self.fallbacks = Counter("gateway_fallbacks", "Requests served by a fallback lane",
                                 ["model", "from_lane", "lane"], registry=r)
        self.admissions = Counter("gateway_admissions", "New conversations judged by cache-protecting admission, "
                                  "by decision (admitted, admitted_after_hold, admitted_after_timeout, refused, "
                                  "refused_after_hold, diverted), on the lane that decided", ["lane", "decision"],
                                  registry=r)
        self.admission_wait = Counter("gateway_admission_wait_seconds", "Seconds new conversations were held",
                                      ["lane"], registry=r)
        self.rate_limited = Counter("gateway_rate_limited", "Requests refused by a per-tenant rate limit",
                                    ["tenant", "limit"], registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # What the requests since the last flush added, per labelled child: a dict update each, where
        # the child's own inc() or observe() takes its lock (some 15 a request). Applied at a scrape
        # (MetricsExport), within FLUSH_S otherwise (a multi-process scrape reads the other processes'
        # files), and at once without an event loop.
        self._counts: dict[Any, float] = {}
        self._observed: dict[Any, _Observed] = {}
        self._flush_due = False
        self.known_models: frozenset[str] = frozenset()
        self.primed: Any = None
        self._cause = BoundedLabel(48)
        self._limit = BoundedLabel(32)
        self._action = BoundedLabel(16)
        self._lane = BoundedLabel(256)  # lanes come from routes.yaml; the bound is a safety net
        self._replica = BoundedLabel(512)
        self._model_label = BoundedLabel(512)  # only names from routes.yaml reach it (see _model)

    def _c(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), memoised: `labels()` validates and locks on every call."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def prime(self, config: Any) -> None:
        """Every label value known from routes.yaml starts at 0, so a dashboard shows 0, not "No data"."""
        self.primed = config
        self.known_models = frozenset(config.models)
        for name in config.lanes:
            lane = self._lane(name)
            for sc in STATUS_CLASSES:
                self._c(self.requests, lane, sc)
            for metric in (self.prompt_tokens, self.prompt_tokens_reported, self.cached_reported,
                           self.cached_predicted, self.completion_tokens, self.reasoning_tokens, self.evictions,
                           self.eviction_tokens, self.effort_rewrites, self.retries):
                self._c(metric, lane)
            for verdict in VERDICTS:
                self._c(self.verdicts, lane, verdict)
            for action in EFFORT_ACTIONS:
                self._c(self.effort_actions, lane, self._action(action))
        for model, lane_name in config.models.items():
            for sc in STATUS_CLASSES:
                self._c(self.model_requests, self._model(model), self._lane(lane_name), sc)

    def _inc(self, child: Any, amount: float = 1.0) -> None:
        if amount < 0:  # a counter never goes down (inc() refused it); nothing the engines send is negative
            return
        counts = self._counts
        counts[child] = counts.get(child, 0.0) + amount

    def _obs(self, child: Any, value: float) -> None:
        pending = self._observed.get(child)
        if pending is None:
            pending = self._observed[child] = _Observed(child)
        pending.add(value)

    def flush(self) -> None:
        """Apply what the requests since the last flush added (a scrape calls this first)."""
        self._flush_due = False
        counts, self._counts = self._counts, {}
        observed, self._observed = self._observed, {}
        for child, amount in counts.items():
            child.inc(amount)
        for pending in observed.values():
            pending.apply()

    def _flush_soon(self) -> None:
        if self._flush_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a tool, a test): now
            self.flush()
            return
        self._flush_due = True
        loop.call_later(FLUSH_S, self.flush)

    def _model(self, name: Any) -> str:
        return self._model_label(name) if name in self.known_models else "unknown"

    def observe(self, ex: Exchange, lane_rt: "LaneRuntime | None" = None) -> None:
        lane = self._lane(ex.lane or "none")
        sc = status_class(ex)
        ok = 100 <= ex.status < 400 and not ex.cancelled
        self._inc(self._c(self.requests, lane, sc))
        model = self._model(ex.public_model)
        self._inc(self._c(self.model_requests, model, lane, sc))
        if ex.fallback_from:
            self._inc(self._c(self.fallbacks, model, self._lane(ex.fallback_from), lane))
        if ex.admission is not None:  # counted on the lane that decided (a diverted newcomer is served elsewhere)
            decided = self._lane(ex.admission.lane) if ex.admission.lane else lane
            self._inc(self._c(self.admissions, decided, ex.admission.decision))
            if ex.admission.waited_s:
                self._inc(self._c(self.admission_wait, decided), ex.admission.waited_s)
        if ex.rate_limits is not None and ex.rate_limits.refused is not None:
            self._inc(self._c(self.rate_limited, ex.tenant, ex.rate_limits.refused.split(" ")[0]))
        usage = ex.usage if isinstance(ex.usage, dict) else {}
        prompt = usage.get("prompt_tokens")
        if isinstance(prompt, int):
            self._inc(self._c(self.prompt_tokens, lane), prompt)
        cached = reported_cached_tokens(usage)
        if cached is not None:
            self._inc(self._c(self.cached_reported, lane), cached)
            if isinstance(prompt, int):
                self._inc(self._c(self.prompt_tokens_reported, lane), prompt)
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            self._inc(self._c(self.completion_tokens, lane), completion)
        reasoning = reasoning_tokens(usage)
        if reasoning:
            self._inc(self._c(self.reasoning_tokens, lane), reasoning)
        self._observe_cache(lane, ex.cache)
        if ex.effort_action:
            self._inc(self._c(self.effort_actions, lane, self._action(ex.effort_action)))
            if ex.effort_action == REWRITE_ACTION:
                self._inc(self._c(self.effort_rewrites, lane))
        for name in ex.limits_fired:
            limit = self._limit(name)
            self._inc(self._c(self.limits_fired, lane, limit))
            if ex.status >= 400:
                self._inc(self._c(self.limit_rejections, lane, limit))
        if ex.upstream_error:
            self._inc(self._c(self.upstream_errors, lane, self._replica(ex.replica or "none"), sc))
        if ex.retries:
            self._inc(self._c(self.retries, lane), ex.retries)
        for healed in ex.healed:  # kinds are the config's fixed names
            self._inc(self._c(self.heals, lane, healed.kind), len(healed.indices))
            if healed.tokens_saved:
                self._inc(self._c(self.healed_tokens, lane, healed.kind), healed.tokens_saved)
        self._observe_timing(ex, lane, ok, completion if isinstance(completion, int) else None)
        self._flush_soon()

    def _observe_cache(self, lane: str, cache: CacheVerdict | None) -> None:
        if cache is None:
            self._inc(self._c(self.verdicts, lane, "unknown"))
            return
        verdict = cache.verdict if cache.verdict in VERDICTS else "unknown"
        self._inc(self._c(self.verdicts, lane, verdict))
        predicted = cache.predicted_cached_tokens
        if predicted is not None:
            self._inc(self._c(self.cached_predicted, lane), predicted)
        lost = cache.tokens_lost
        if verdict == "drift":
            cause = self._cause(cache.cause or "unknown")
            self._inc(self._c(self.drift_tokens, lane, cause), lost)
            self._inc(self._c(self.drift_seconds, lane, cause), cache.seconds_lost)
        elif verdict == "eviction":
            self._inc(self._c(self.evictions, lane))
            self._inc(self._c(self.eviction_tokens, lane), lost)

    def _observe_timing(self, ex: Exchange, lane: str, ok: bool, completion: int | None) -> None:
        start = ex.started
        if ex.t_end is not None:
            self._obs(self._c(self.duration, lane), ex.t_end - start)
        if ex.t_forwarded is not None:
            self._obs(self._c(self.overhead, lane), ex.t_forwarded - start)
        if not ok:
            return
        if ex.t_first_byte is not None:
            self._obs(self._c(self.ttfb, lane), ex.t_first_byte - start)
        if ex.stream and ex.t_first_token is not None:
            self._obs(self._c(self.ttft, lane), ex.t_first_token - start)
        times = ex.token_chunk_times
        tps, _ = decode_speed(ex.t_first_token, ex.t_last_token, completion, len(times))
        if tps is not None:
            self._obs(self._c(self.decode, lane), tps)
        if len(times) > 1:
            hist = self._c(self.gaps, lane)
            step = max(1, (len(times) - 1) // MAX_GAPS_PER_REQUEST)
            for i in range(step, len(times), step):
                self._obs(hist, times[i] - times[i - 1])


class LiveCollector(Collector):
    """Gauges read from the running gateway at scrape time: in-flight, replica health, store health."""

    def __init__(self, runtime: "Runtime", aftermath: "Aftermath", analyzer: "Analyzer",
                 records: "Records") -> None:
        self.runtime = runtime
        self.aftermath = aftermath
        self.analyzer = analyzer
        self.records = records

    def collect(self) -> Iterator[Any]:
        snap = self.runtime.snapshot
        now = time.monotonic()
        inflight = GaugeMetricFamily("gateway_inflight_requests", "Requests in flight per lane", labels=["lane"])
        rep_inflight = GaugeMetricFamily("gateway_replica_inflight", "Upstream requests in flight per replica",
                                         labels=["lane", "replica"])
        up = GaugeMetricFamily("gateway_replica_up", "1 when the replica's circuit breaker is closed",
                               labels=["lane", "replica"])
        fails = GaugeMetricFamily("gateway_replica_consecutive_failures", "Consecutive failures per replica",
                                  labels=["lane", "replica"])
        for name, lane in snap.lanes.items():
            inflight.add_metric([name], lane.inflight)
            for rep in lane.upstream.replicas:
                rep_inflight.add_metric([name, rep.url], rep.inflight)
                up.add_metric([name, rep.url], 1.0 if rep.available(now) else 0.0)
                fails.add_metric([name, rep.url], rep.consecutive_failures)
        yield from (inflight, rep_inflight, up, fails)
        yield GaugeMetricFamily("gateway_config_version", "routes.yaml version loaded", value=snap.version)
        am = self.aftermath
        yield CounterMetricFamily("gateway_aftermath_processed", "Exchanges analysed and recorded",
                                  value=am.processed)
        yield CounterMetricFamily("gateway_aftermath_skipped_analysis", "Exchanges that skipped analysis (shed)",
                                  value=am.skipped_analysis)
        shed = CounterMetricFamily("gateway_analysis_shed", "Turns recorded without analysis, by why: superseded "
                                   "(the conversation's newer turn took its place) or queue_full", labels=["reason"])
        shed.add_metric(["superseded"], am.shed_superseded)
        shed.add_metric(["queue_full"], am.shed_queue_full)
        yield shed
        analyzer = self.analyzer
        yield CounterMetricFamily("gateway_analysis_failures", "Turns whose analysis failed (verdict unknown)",
                                  value=analyzer.failures)
        if analyzer.process is not None:
            yield CounterMetricFamily("gateway_analysis_worker_deaths", "Analysis worker processes that died",
                                      value=analyzer.process.deaths)
        records = self.records
        fam = CounterMetricFamily("gateway_records", "Request records by store and outcome",
                                  labels=["store", "outcome"])
        for key, value in records.counters().items():
            store, _, outcome = key.partition("_")
            if store not in ("sqlite", "redis", "postgres") or not outcome:  # built, build_failed: the builder
                store, outcome = "builder", key
            fam.add_metric([store, outcome], value)
        yield fam


class MetricsExport:
    """GET /metrics: the request metrics (fed by the aftermath) and the live gauges, one registry."""

    def __init__(self, metrics: Metrics, registry: CollectorRegistry, live: LiveCollector) -> None:
        self.metrics = metrics
        self.registry = registry
        self.live = live
        registry.register(live)
        metrics.prime(live.runtime.snapshot.config)

    async def route(self, request: Request) -> Response:
        config = self.live.runtime.snapshot.config
        if config is not self.metrics.primed:  # routes.yaml was reloaded: its new lanes and models start at 0
            self.metrics.prime(config)
        self.metrics.flush()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def build_metrics() -> tuple[Metrics, CollectorRegistry]:
    """The request metrics and their registry (multi-process when PROMETHEUS_MULTIPROC_DIR is set)."""
    disable_created_metrics()  # the *_created series double the output and no dashboard reads them
    multiproc = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))  # prometheus_client's variable, read by it too
    registry = CollectorRegistry(auto_describe=False)
    metrics = Metrics(None if multiproc else registry)
    if multiproc:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    # Process metrics (CPU seconds, RSS, open fds, start time), the Python runtime and GC: the
    # default registry has them, this registry of our own did not.
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    return metrics, registry
