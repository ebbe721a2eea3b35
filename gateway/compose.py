"""The composition root: the one place where the gateway's parts are built and wired.

Every part gets what it needs through its constructor; nothing registers itself anywhere. The order
below is the order of dependence, and it is the order of the request path:

    gates       qualification (refuse an unqualified lane)
    policies    limits -> restate (Responses items vLLM refuses) -> conversation (identity, effort pin)
                -> heal (drift repairs) -> routing lookups
    forward     proxy.forward
    finishers   turn end (head and anchors at once) -> heal turn end (the message as relayed)
                -> aftermath (analysis, then metrics and records)

and `endpoints()` is the one route table, with who may call each route (access.py: admin unless
declared otherwise). A part that cannot be built or started stops the gateway with a message that
names it (`StartupError`), never a half-working gateway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Protocol, TypeVar

from .server.access import Access, Endpoint
from .observe.access_log import AccessLog, build_access_log
from .observe.aftermath import Aftermath, FirstBytes, Step
from .admin.feature import AdminAPI
from .admission.policy import AdmissionPolicy
from .ratelimits import RateLimits
from .ratelimits.counters import RedisCounters
from .core.config import ConfigError, load_routes
from .core.errors import AnthropicError
from .conversations.feature import TTL_S, Conversations
from .heal.book import RelayedBook
from .heal.policy import HealPolicy
from .heal.restate import RestatePolicy
from .heal.turn_end import HealTurnEnd
from .upstream.health import HealthProber, HealthService
from .kvevents.feature import KVEventsAdmin
from .kvevents.service import KVEventsService
from .limits.feature import LimitsWarmup
from .limits.policy import LimitsPolicy
from .observe.metrics import LiveCollector, Metrics, MetricsExport, build_metrics
from .api.openapi import OpenAPI
from .pipeline.history_memo import HistoryMemo
from .pipeline.flow import Pipeline
from .qualify.feature import LaneAddressed, QualificationService
from .records.feature import Records, build_records
from .render.feature import RenderPreload, attach as attach_renderer
from .routing import make_policy
from .routing.feature import Routing
from .core.runtime import Runtime
from .server.security import Security, SecurityConfigError
from .server.wire import link_of
from .core.settings import Settings
from . import process_switches
from .api.status import Status
from .store import StateStore
from .store.feature import build_store
from .tracing import build_tracing
from .tracing.feature import TracingService

log = logging.getLogger("gateway")

T = TypeVar("T")


class Service(Protocol):
    """A part with work of its own beside requests (tasks, files, a process): started before serving,
    stopped after the last request, in reverse order."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StartupError(RuntimeError):
    """A part of the gateway could not be built or started; the message names the part."""


def _part(name: str, build: Callable[[], T]) -> T:
    try:
        return build()
    except (StartupError, ConfigError, SecurityConfigError):
        raise  # these already say where (a key path, a file and line)
    except Exception as exc:
        raise StartupError(f"{name}: {type(exc).__name__}: {exc}") from exc


@dataclass
class StoreService:
    store: StateStore

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        await self.store.close()


@dataclass
class Gateway:
    """Everything one gateway process holds, typed."""

    settings: Settings
    runtime: Runtime
    store: StateStore
    security: Security
    status: Status
    conversations: Conversations
    routing: Routing
    limits: LimitsPolicy
    qualification: QualificationService
    metrics: Metrics
    records: Records
    aftermath: Aftermath
    pipeline: Pipeline
    health: HealthService
    admin: AdminAPI
    openapi: OpenAPI
    metrics_export: MetricsExport
    kv_events: KVEventsService  # the engines' KV-cache events
    kv_admin: KVEventsAdmin
    rate_limits: RateLimits
    access_log: AccessLog | None = None  # also writes the lines of requests outside the proxy path
    services: tuple[Service, ...] = ()
    _started: list[Service] = field(default_factory=list)

    def endpoints(self) -> list[Endpoint]:
        """Every route the gateway serves. Admin unless declared otherwise (access.py)."""
        public = Access.PUBLIC
        client = Access.CLIENT
        qualify = Access.QUALIFY
        status, conv, q, admin = self.status, self.conversations, self.qualification, self.admin
        return [
            # Clients (a client key; the tenant is known from it)
            Endpoint("/v1/chat/completions", self.pipeline.chat, ("POST",), client),  # type: ignore[arg-type]
            Endpoint("/v1/completions", self.pipeline.completions, ("POST",), client),  # type: ignore[arg-type]
            # Passed through to the lane (passthrough.py): model mapping, gates, fallbacks, records
            Endpoint("/v1/responses", self.pipeline.responses, ("POST",), client),  # type: ignore[arg-type]
            Endpoint("/v1/messages", self.pipeline.messages, ("POST",), client,  # type: ignore[arg-type]
                     errors=AnthropicError.of),
            Endpoint("/v1/messages/count_tokens", self.pipeline.count_tokens, ("POST",), client,  # type: ignore[arg-type]
                     errors=AnthropicError.of),
            Endpoint("/v1/embeddings", self.pipeline.embeddings, ("POST",), client),  # type: ignore[arg-type]
            Endpoint("/tokenize", self.pipeline.tokenize, ("POST",), client),  # type: ignore[arg-type]
            Endpoint("/detokenize", self.pipeline.detokenize, ("POST",), client),  # type: ignore[arg-type]
            Endpoint("/v1/models", status.models, ("GET",), client),  # type: ignore[arg-type]
            Endpoint("/v1/models/{model:path}", status.model, ("GET",), client),  # type: ignore[arg-type]
            # Anyone
            Endpoint("/healthz", status.healthz, ("GET",), public, "says only that the process is up"),
            Endpoint("/readyz", status.readyz, ("GET",), public,
                     "says only ready or not; replicas, paths and reload errors need the admin key"),
            Endpoint("/openapi.json", self.openapi.route, ("GET",), public,
                     "describes the API; model names are listed only to a valid client key"),
            Endpoint("/admin", admin.page, ("GET",), public,
                     "the page shell: no data; every call it makes sends the admin key"),
            Endpoint("/admin/", admin.page, ("GET",), public, "the page shell (see /admin)"),
            Endpoint("/admin/static/{name}", admin.static, ("GET",), public,
                     "the page's own scripts and styles, from a fixed folder"),
            # Qualification (the qualify token or the admin key)
            Endpoint("/qualify/v1/chat/completions", q.route_chat, ("POST",), qualify),
            Endpoint("/qualify/v1/completions", q.route_completions, ("POST",), qualify),
            Endpoint("/qualify/state", q.route_state, ("GET",), qualify),
            Endpoint("/qualify/refresh", q.route_refresh, ("POST",), qualify),
            Endpoint("/qualify/records", q.route_records, ("GET", "POST"), qualify),
            # Admins
            Endpoint("/metrics", self.metrics_export.route),
            Endpoint("/admin/drift", conv.drift),
            Endpoint("/admin/conversations/{cid:path}", conv.conversation),
            Endpoint("/admin/routing", self.routing.route),
            Endpoint("/admin/api/health", self.health.route),
            Endpoint("/admin/api/overview", admin.overview),
            Endpoint("/admin/api/records", admin.records),
            Endpoint("/admin/api/stats", admin.stats),
            Endpoint("/admin/api/charts", admin.charts),
            Endpoint("/admin/api/alerts", admin.alerts),
            Endpoint("/admin/api/triage", admin.triage, ("GET", "POST")),
            Endpoint("/admin/api/triage/{rule_id}", admin.triage_delete, ("DELETE",)),
            Endpoint("/admin/api/conversations/{key:path}", admin.conversation),
            Endpoint("/admin/api/kv", self.kv_admin.route),
            Endpoint("/admin/api/ratelimits", self.rate_limits.route),
        ]

    async def start(self) -> None:
        self.aftermath.start()
        for service in self.services:
            try:
                await service.start()
            except Exception as exc:
                raise StartupError(f"{type(service).__name__} could not start: {type(exc).__name__}: {exc}") from exc
            self._started.append(service)

    async def stop(self) -> None:
        await self.aftermath.stop()  # the last records reach their stores' queues first
        if self.access_log is not None:
            self.access_log.flush()  # the last batch of lines, while their stream is still open
        while self._started:
            service = self._started.pop()
            try:
                await service.stop()
            except Exception:  # stopping the rest matters more
                log.exception("%s did not stop cleanly", type(service).__name__)
        await self.runtime.close()


def build(settings: Settings) -> Gateway:
    """The gateway of `settings`, every part built and wired; nothing started yet."""
    process_switches.apply(settings)  # before routes.yaml's templates load and anything renders
    config = _part("routes.yaml", lambda: load_routes(settings.routes_path))
    runtime = Runtime(config, settings.routes_path, make_router=make_policy)
    store, redis_client = _part("state store", lambda: build_store(settings))
    limits = LimitsPolicy()
    kv_events = KVEventsService(runtime)  # subscribes when started; reads routes.yaml through the runtime
    routing = _part("routing", lambda: Routing(store, runtime, kv_events))
    # The qualify route's pipeline addresses lanes by name and has no gate and no policy.
    qualify_pipeline = Pipeline(LaneAddressed(runtime), link_of=link_of)
    qualification = _part("qualification", lambda: QualificationService(runtime, settings, qualify_pipeline))
    security = _part("security", lambda: Security(runtime, settings, qualification.tokens))
    security.startup_report()  # raises SecurityConfigError in production without keys
    conversations = _part("conversations", lambda: Conversations(store, runtime, settings, kv_events))
    metrics, registry = _part("metrics", build_metrics)
    records, records_service = _part("records", lambda: build_records(settings, redis_client, config.gateway.records))
    # New conversations wait, are refused or diverted while the pool is full (per lane, opt-in).
    admission = AdmissionPolicy(kv_events, lanes=lambda: runtime.snapshot.lanes)
    # Per-tenant rate limits, shared through Redis when the gateway has it (per process otherwise).
    rate_limits = RateLimits(runtime, RedisCounters(redis_client) if redis_client is not None else None)
    book = RelayedBook(store, TTL_S)
    heal = HealPolicy(book)
    access_log = _part("access log", lambda: build_access_log(settings.access_log))  # None when off
    tracing = build_tracing(settings)  # NO_TRACING unless an OTLP endpoint is configured
    sinks: list[Step] = [metrics.observe, records.sink, *([access_log] if access_log is not None else []),
                         *([tracing.exchange_done] if tracing.enabled else [])]
    first_bytes = FirstBytes()  # requests on their way to their first byte go before the aftermath
    aftermath = Aftermath(analyzers=[conversations.analyzer], sinks=sinks, first_bytes=first_bytes,
                          workers=settings.aftermath_workers, coalesce=settings.aftermath_coalesce,
                          max_coalesced=settings.aftermath_max_coalesced,
                          max_queue_bytes=settings.aftermath_max_bytes)
    qualification.reload_index()  # at start-up, before serving (blocking is fine here), before the lane hooks
    runtime.wire(
        lane_hooks=[attach_renderer, limits.attach, routing.bind, qualification.hook, kv_events.lane_changed],
        # The head first: the next turn may come at once (and may need the relayed message to be healed).
        finishers=[conversations.turn_end, HealTurnEnd(book, store, TTL_S), admission, rate_limits, aftermath],
    )
    qualification.ensure_token_file()
    pipeline = Pipeline(runtime, gates=[qualification.gate],
                        policies=[rate_limits, limits, RestatePolicy(), conversations.policy, admission, heal,
                                  routing.step],
                        memo=HistoryMemo(int(settings.history_memo_mb * 2**20)),
                        first_bytes=first_bytes, tracing=tracing, link_of=link_of)
    status = Status(runtime, settings, security)
    health = HealthService(HealthProber(runtime))
    admin = AdminAPI(runtime, status, aftermath, records, conversations.analyzer, store)
    export = MetricsExport(metrics, registry, LiveCollector(runtime, aftermath, conversations.analyzer, records))
    kv_admin = KVEventsAdmin(kv_events)
    registry.register(kv_admin)
    # Started in this order, stopped in reverse: the store outlives everything that writes to it.
    services: tuple[Service, ...] = (
        StoreService(store), RenderPreload(runtime), LimitsWarmup(runtime), conversations, routing, kv_events,
        records_service, qualification, health, TracingService(tracing),
    )
    return Gateway(settings=settings, runtime=runtime, store=store, security=security, status=status,
                   conversations=conversations, routing=routing, limits=limits, qualification=qualification,
                   metrics=metrics, records=records, aftermath=aftermath, pipeline=pipeline, health=health,
                   admin=admin, openapi=OpenAPI(runtime, security), metrics_export=export, kv_events=kv_events,
                   kv_admin=kv_admin, rate_limits=rate_limits, access_log=access_log, services=services)


__all__ = ["Gateway", "Service", "StartupError", "build"]
