"""Process settings: where routes.yaml is, which state backend, where records go. From env or CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload


@overload
def _env(name: str, default: str) -> str: ...


@overload
def _env(name: str, default: None = None) -> str | None: ...


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _tracing_configured() -> bool:
    if (_env("OTEL_SDK_DISABLED", "false") or "").lower() == "true":
        return False
    if (_env("OTEL_TRACES_EXPORTER", "otlp") or "").lower() == "none":
        return False
    return bool(_env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


@dataclass
class Settings:
    routes_path: Path = field(default_factory=lambda: Path(_env("GATEWAY_ROUTES", "routes.yaml")))
    redis_url: str | None = field(default_factory=lambda: _env("GATEWAY_REDIS_URL"))
    data_dir: Path = field(default_factory=lambda: Path(_env("GATEWAY_DATA_DIR", "var")))
    host: str = field(default_factory=lambda: _env("GATEWAY_HOST", "127.0.0.1") or "127.0.0.1")
    port: int = field(default_factory=lambda: int(_env("GATEWAY_PORT", "8080") or 8080))
    production: bool = field(default_factory=lambda: _env("GATEWAY_PRODUCTION", "0") == "1")
    watch_routes: bool = field(default_factory=lambda: _env("GATEWAY_WATCH_ROUTES", "1") == "1")
    log_level: str = field(default_factory=lambda: _env("GATEWAY_LOG_LEVEL", "info") or "info")
    # Analysis (render, drift) runs in a worker process ("process") or in this many threads of the
    # gateway's own process ("thread": no extra process, but it takes turns at the GIL with requests).
    analysis: str = field(default_factory=lambda: _env("GATEWAY_ANALYSIS", "process") or "process")
    analysis_threads: int = field(default_factory=lambda: int(_env("GATEWAY_ANALYSIS_THREADS", "1") or 1))
    # A tiny turn on a quiet lane is analysed on the event loop, not in the worker: its request's bytes
    # and its answer's characters together at most this many (conversations/inline.py; 0: never).
    analysis_inline_bytes: int = field(
        default_factory=lambda: max(0, int(_env("GATEWAY_ANALYSIS_INLINE_BYTES", "2048") or 0)))
    capture_bodies: bool = field(default_factory=lambda: _env("GATEWAY_CAPTURE", "0") == "1")
    # OpenTelemetry traces (gateway/tracing/): on when an OTLP endpoint is configured the standard way and
    # the SDK is not disabled; the exporter, sampler and batch settings are read by the SDK itself.
    tracing: bool = field(default_factory=lambda: _tracing_configured())
    tracing_service_name: str = field(
        default_factory=lambda: _env("OTEL_SERVICE_NAME", "lane-gateway") or "lane-gateway")
