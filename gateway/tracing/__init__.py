"""OpenTelemetry traces of each request: off unless an OTLP endpoint is configured the standard way.

`build_tracing(settings)` gives `NO_TRACING` (nothing is done per request) or, with the `otel` extra
installed and `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) set, an OTLP/HTTP exporter.
"""

from __future__ import annotations

import logging

from ..core.settings import Settings
from .base import NO_TRACING, Trace, Tracing

log = logging.getLogger("gateway.tracing")


def build_tracing(settings: Settings) -> Tracing:
    if not settings.tracing:
        return NO_TRACING
    try:
        from .otel import OtelTracing
    except ImportError as exc:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but tracing is off: the otel extra is not installed "
                    "(pip install 'lane-gateway[otel]'): %s", exc)
        return NO_TRACING
    return OtelTracing(settings.tracing_service_name)


__all__ = ["NO_TRACING", "Trace", "Tracing", "build_tracing"]
