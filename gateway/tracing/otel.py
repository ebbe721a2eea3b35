"""Tracing with the OpenTelemetry SDK, exported over OTLP/HTTP (the `otel` extra).

Configured the standard way: the exporter reads `OTEL_EXPORTER_OTLP_ENDPOINT` / `..._TRACES_ENDPOINT` and
`..._HEADERS`, the provider `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, the batch processor
`OTEL_BSP_*`, the propagators `OTEL_PROPAGATORS`. Spans are built from the exchange's own timings when it
ends, so the request path pays only for starting the server span and the upstream one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from .attributes import operation, outcome_attributes, request_attributes

if TYPE_CHECKING:
    from ..core.exchange import Exchange
    from ..core.config import Lane
    from ..core.runtime import LaneRuntime


class _HeaderGetter(Getter[Any]):
    """Reads the client's headers (Starlette's or the wire path's case-insensitive mapping)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = carrier.get(key) if carrier is not None else None
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return list(carrier.keys()) if carrier is not None else []


_GETTER = _HeaderGetter()


def _ns(ex: "Exchange", t: float) -> int:
    """A perf_counter reading of this exchange as Unix nanoseconds."""
    return int((ex.started_wall + (t - ex.started)) * 1e9)


class OtelTrace:
    def __init__(self, tracer: trace.Tracer, ex: "Exchange") -> None:
        self.tracer = tracer
        parent = propagate.extract(ex.request_headers, getter=_GETTER)
        self.server = tracer.start_span(f"{operation(ex.path)}", context=parent, kind=SpanKind.SERVER,
                                        start_time=_ns(ex, ex.started))
        self.upstream: trace.Span | None = None

    def upstream_started(self, ex: "Exchange", lane: "Lane") -> str:
        ctx = trace.set_span_in_context(self.server)
        name = f"{operation(ex.path)} {lane.upstream_model}"
        self.upstream = self.tracer.start_span(name, context=ctx, kind=SpanKind.CLIENT,
                                               attributes=request_attributes(ex, lane))
        span_ctx = self.upstream.get_span_context()
        return f"00-{span_ctx.trace_id:032x}-{span_ctx.span_id:016x}-{int(span_ctx.trace_flags):02x}"

    def finish(self, ex: "Exchange", lane: "Lane | None") -> None:
        server = self.server
        if server.is_recording():
            server.update_name(f"{operation(ex.path)} {ex.public_model}" if ex.public_model else operation(ex.path))
            server.set_attributes(outcome_attributes(ex, lane))
            self._children(ex)
            for name, t in (("gateway.first_byte", ex.t_first_byte), ("gateway.first_token", ex.t_first_token)):
                if t is not None:
                    server.add_event(name, timestamp=_ns(ex, t))
            if ex.status >= 500 or ex.status == 0:
                server.set_status(Status(StatusCode.ERROR, ex.error_code or None))
        end = _ns(ex, ex.t_end) if ex.t_end is not None else None
        if self.upstream is not None:
            if ex.upstream_error:
                self.upstream.set_status(Status(StatusCode.ERROR, "upstream_error"))
            if ex.replica:
                self.upstream.set_attribute("server.address", ex.replica)
            self.upstream.end(end_time=end)
        server.end(end_time=end)

    def _children(self, ex: "Exchange") -> None:
        """The gateway's own steps as child spans, from the exchange's timings."""
        ctx = trace.set_span_in_context(self.server)
        spans: Iterable[tuple[str, float | None, float | None]] = (
            ("gateway.prepare", ex.started, ex.t_forwarded),  # read, parse, limits, policies, queueing
        )
        for name, start, end in spans:
            if start is not None and end is not None:
                self.tracer.start_span(name, context=ctx, start_time=_ns(ex, start)).end(end_time=_ns(ex, end))
        if ex.analysis_ms is not None and ex.t_end is not None:
            start = _ns(ex, ex.t_end)
            span = self.tracer.start_span("gateway.analysis", context=ctx, start_time=start)
            span.end(end_time=start + int(ex.analysis_ms * 1e6))


class OtelTracing:
    enabled = True

    def __init__(self, service_name: str) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("lane-gateway")

    def begin(self, ex: "Exchange") -> None:
        ex.trace = OtelTrace(self.tracer, ex)

    def exchange_done(self, ex: "Exchange", lane: "LaneRuntime | None") -> None:
        if ex.trace is not None:
            ex.trace.finish(ex, lane.config if lane is not None else None)

    def shutdown(self) -> None:
        self.provider.shutdown()
