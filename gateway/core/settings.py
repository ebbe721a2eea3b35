"""Process settings: every environment switch of the gateway, typed, read once when Settings is made.

One field per switch, with its variable (GATEWAY_*), the default the gateway runs with and what it
does; docs/reference/environment.md is generated from these fields (scripts/gen_docs.py). The parts
get their values from the composition root (compose.py) or from the object that receives Settings;
the analysis worker process gets the gateway's Settings when it is spawned; the command line's
options default to the same fields. Nothing else reads a GATEWAY_* switch. Read where they are
used, and never held here: secrets (the variables routes.yaml names for keys and URLs,
GATEWAY_QUALIFY_TOKEN, the command line's GATEWAY_ADMIN_KEY and GATEWAY_API_KEY), because Settings
is handed to every part and pickled to the worker; and the variables of other software
(PROMETHEUS_MULTIPROC_DIR, TOKENIZERS_PARALLELISM, USER), which that software reads itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SettingsError(ValueError):
    """An environment variable the gateway cannot read; the message names it and its value."""


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _var(name: str, default: str | None, parse: Callable[[str], Any], doc: str, shown: str | None = None) -> Any:
    """A field read from the variable `name` when Settings is made; unset or empty: `default`, as it would
    be written in the environment (None: no value). The variable, its default, `doc` and `shown` (the
    default in words, when the raw value says too little) are the field's metadata: the docs' table."""

    def read() -> Any:
        raw = _env(name, default)
        if raw is None:
            return None
        try:
            return parse(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r}: {exc}") from None

    return field(default_factory=read, metadata={"env": ((name, default, doc, shown),)})


def _on(off: str = "0") -> Callable[[str], bool]:
    return lambda v: v != off


def _is(on: str) -> Callable[[str], bool]:
    return lambda v: v == on


def _seconds(default: float) -> Callable[[str], float]:
    """A positive number of seconds; anything else is the default (a deadline must never be 0)."""

    def parse(v: str) -> float:
        try:
            value = float(v)
        except ValueError:
            return default
        return value if value > 0 else default

    return parse


def _window(v: str) -> float:
    from ..records.stats import parse_window

    return parse_window(v)


def _tracing_configured() -> bool:
    if (_env("OTEL_SDK_DISABLED", "false") or "").lower() == "true":
        return False
    if (_env("OTEL_TRACES_EXPORTER", "otlp") or "").lower() == "none":
        return False
    return bool(_env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


@dataclass(frozen=True)
class AccessLogSettings:
    enabled: bool = True
    format: str = "json"  # json | text
    sample: float = 1.0  # share of successful requests written; errors always are
    path: str | None = None  # None: stderr

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AccessLogSettings:
        fmt = (env.get("GATEWAY_ACCESS_LOG_FORMAT") or "json").lower()
        if fmt not in ("json", "text"):
            raise ValueError(f"GATEWAY_ACCESS_LOG_FORMAT={fmt!r}: expected json or text")
        try:
            sample = float(env.get("GATEWAY_ACCESS_LOG_SAMPLE") or 1.0)
        except ValueError:
            raise ValueError("GATEWAY_ACCESS_LOG_SAMPLE must be a number 0-1") from None
        if not 0.0 <= sample <= 1.0:
            raise ValueError("GATEWAY_ACCESS_LOG_SAMPLE must be a number 0-1")
        return cls(enabled=(env.get("GATEWAY_ACCESS_LOG") or "1") not in ("0", "false", "off", "no"),
                   format=fmt, sample=sample, path=env.get("GATEWAY_ACCESS_LOG_FILE") or None)


def _access_log() -> AccessLogSettings:
    try:
        return AccessLogSettings.from_env(os.environ)
    except ValueError as exc:  # its messages name the variable
        raise SettingsError(str(exc)) from None


MiB = 1024 * 1024


@dataclass
class Settings:
    # (Each `_var` is a field(default_factory=...): nothing is called when the class is made.)
    # -- files, state, start-up ---------------------------------------------------------------------
    routes_path: Path = _var("GATEWAY_ROUTES", "routes.yaml", Path, "the routes file")  # noqa: RUF009
    data_dir: Path = _var("GATEWAY_DATA_DIR", "var", Path,  # noqa: RUF009
                          "records, the qualify token, the analysis spool")
    redis_url: str | None = _var("GATEWAY_REDIS_URL", None, str, "Redis for state shared by gateway processes "
                                 "(redis://, rediss://, unix://); unset: each process keeps its own, in memory")
    # The in-memory state store's byte bound (no Redis, or Redis's local copy): conversation states are
    # up to ~100 KB each, so a key count alone would not bound the memory.
    state_max_bytes: int = _var("GATEWAY_STATE_MAX_BYTES", str(256 * MiB), int,
                                "the in-memory state store's byte bound", "256 MiB")
    qualifications: Path | None = _var("GATEWAY_QUALIFICATIONS", None, Path,  # noqa: RUF009
                                       "the qualification records' directory; unset: qualifications/ beside "
                                       "the routes file")
    production: bool = _var("GATEWAY_PRODUCTION", "0", _is("1"), "1: refuse to start without client and "
                            "admin keys")
    watch_routes: bool = _var("GATEWAY_WATCH_ROUTES", "1", _is("1"), "0: reload the routes file on SIGHUP only")

    # -- the HTTP server ----------------------------------------------------------------------------
    host: str = _var("GATEWAY_HOST", "127.0.0.1", str, "the address `gateway serve` listens on")
    port: int = _var("GATEWAY_PORT", "8080", int, "the port `gateway serve` listens on")
    log_level: str = _var("GATEWAY_LOG_LEVEL", "info", str, "critical, error, warning, info, debug or trace")
    # `gateway serve` sets both from routes.yaml's `gateway.http` for every process it starts; under
    # uvicorn of your own, set them (a value that is not a positive number is the default).
    header_timeout_s: float = _var("GATEWAY_HEADER_TIMEOUT_S", "10", _seconds(10.0), "a request's headers must "
                                   "arrive within this many seconds (gateway/server/serving.py)")
    body_timeout_s: float = _var("GATEWAY_BODY_TIMEOUT_S", "60", _seconds(60.0), "a request's body must arrive "
                                 "within this many seconds of its headers")
    # The proxy endpoints answered by the HTTP protocol itself (gateway/server/wire.py); 0 sends every
    # request through Starlette (tests/test_wire.py and bench/anchors.py compare the two).
    wire: bool = _var("GATEWAY_WIRE", "1", _on(), "0: every request through the ASGI application")
    gc_thresholds: str = _var("GATEWAY_GC_THRESHOLDS", "", str, "the collector's thresholds once started, "
                              "three positive integers; `default`: CPython's (gateway/observe/gc_tuning.py)",
                              "`50000,20,10`")

    # -- access log (gateway/observe/access_log.py) -------------------------------------------------
    access_log: AccessLogSettings = field(
        default_factory=lambda: _access_log(),
        metadata={"env": (("GATEWAY_ACCESS_LOG", "1", "0 (false, off, no): no access log", None),
                          ("GATEWAY_ACCESS_LOG_FORMAT", "json", "json or text (logfmt)", None),
                          ("GATEWAY_ACCESS_LOG_SAMPLE", "1", ("the share of successful requests written, 0-1 "
                                                               "(errors always are)"), None),
                          ("GATEWAY_ACCESS_LOG_FILE", None, "append to this file; unset: stderr", None))})

    # -- analysis (gateway/conversations, gateway/observe/aftermath.py) -----------------------------
    # Analysis (render, drift) runs in a worker process ("process") or in this many threads of the
    # gateway's own process ("thread": no extra process, but it takes turns at the GIL with requests).
    analysis: str = _var("GATEWAY_ANALYSIS", "process", str, "process: the analysis worker process; thread: "
                         "threads of the gateway's process")
    analysis_threads: int = _var("GATEWAY_ANALYSIS_THREADS", "1", int,
                                 "analysis threads with GATEWAY_ANALYSIS=thread")
    # A tiny turn on a quiet lane is analysed on the event loop, not in the worker: its request's bytes
    # and its answer's characters together at most this many (conversations/inline.py; 0: never).
    analysis_inline_bytes: int = _var("GATEWAY_ANALYSIS_INLINE_BYTES", "2048", lambda v: max(0, int(v)),
                                      "a turn this small (request bytes and answer characters) on a quiet "
                                      "lane is analysed on the event loop; 0: never")
    analysis_nice: int = _var("GATEWAY_ANALYSIS_NICE", "5", int, "the analysis worker's niceness while it keeps up")
    analysis_sched_batch: bool = _var("GATEWAY_ANALYSIS_SCHED", "", lambda v: v.lower() == "batch",
                                      "batch: the worker runs under SCHED_BATCH")
    analysis_ring_mb: float = _var("GATEWAY_ANALYSIS_RING_MB", "32", float, "shared memory for large bodies on "
                                   "their way to the worker (/dev/shm); 0: pickled")
    analysis_memo_bytes: int = _var("GATEWAY_ANALYSIS_MEMO_BYTES", str(128 * MiB), int, "what the previous turns' "
                                    "memos may hold, per analysing process", "128 MiB")
    aftermath_workers: int = _var("GATEWAY_AFTERMATH_WORKERS", "64", int, "tasks that carry finished exchanges "
                                  "to the analysis and the sinks")
    aftermath_coalesce: int = _var("GATEWAY_AFTERMATH_COALESCE", "4", lambda v: max(1, int(v)), "turns of one "
                                   "conversation waiting together for analysis; 1: the newest replaces the older")
    aftermath_max_coalesced: int = _var("GATEWAY_AFTERMATH_MAX_COALESCED", str(1 << 62), int, "turns waiting "
                                        "together in all before a newer turn replaces its oldest", "no limit")
    aftermath_max_bytes: int = _var("GATEWAY_AFTERMATH_MAX_BYTES", str(64 * MiB), int, "the analysis queue's byte "
                                    "bound; past it turns are recorded with analysis queue_full", "64 MiB")

    # -- the hot path's memory and the render ------------------------------------------------------
    history_memo_mb: float = _var("GATEWAY_HISTORY_MEMO_MB", "64", float, "recent large bodies the hot path "
                                  "remembers, to read an agent's next turn from its bytes (pipeline/history_memo.py)")
    render_cache_bytes: int = _var("GATEWAY_RENDER_CACHE_BYTES", str(256 * MiB), int, "the render's segment "
                                   "cache, per process", "256 MiB")
    # Both only compare a faster way with the general one (tests/test_render_native.py, test_render_pieces.py).
    render_native: bool = _var("GATEWAY_RENDER_NATIVE", "1", _on(), "0: the packaged template's items always "
                               "through Jinja (render/native.py)")
    tokenizer_pieces: bool = _var("GATEWAY_TOKENIZER_PIECES", "1", _on(), "0: always the tokenizer's own "
                                  "pre-tokenizer (render/pieces.py)")

    # -- records (gateway/records) ------------------------------------------------------------------
    records_sqlite: bool = _var("GATEWAY_RECORDS_SQLITE", "1", _is("1"), "0: no local records file (without "
                                "gateway.records.postgres)")
    records_max_age_s: float = _var("GATEWAY_RECORDS_MAX_AGE", "7d", _window, "the local file keeps records this "
                                    "long (90s, 15m, 1h, 7d)")
    records_max_rows: int = _var("GATEWAY_RECORDS_MAX_ROWS", "1000000", int, "and at most this many")
    records_stream: str = _var("GATEWAY_RECORDS_STREAM", "gateway:records", str, "the Redis stream records go to "
                               "(with GATEWAY_REDIS_URL)")
    records_stream_maxlen: int = _var("GATEWAY_RECORDS_STREAM_MAXLEN", "100000", int, "its approximate length")
    capture_bodies: bool = _var("GATEWAY_CAPTURE", "0", _is("1"), "1: records carry the request and answer "
                                "(debugging)")
    capture_max_bytes: int = _var("GATEWAY_CAPTURE_MAX_BYTES", "16384", int, "the captured bytes per record")

    # -- qualification (gateway/qualify) ------------------------------------------------------------
    qualify_poll_s: float = _var("GATEWAY_QUALIFY_POLL_S", "1.0", float, "how often the records are checked "
                                 "for changes")
    qualify_revision_s: float = _var("GATEWAY_QUALIFY_REVISION_S", "60", float, "how often the replicas are "
                                     "asked for their model's revision")

    # -- OpenTelemetry traces (gateway/tracing/) ----------------------------------------------------
    # On when an OTLP endpoint is configured the standard way and the SDK is not disabled; the
    # exporter, sampler and batch settings are the SDK's own variables, which it reads itself.
    tracing: bool = field(default_factory=_tracing_configured, metadata={"env": (
        ("OTEL_EXPORTER_OTLP_ENDPOINT", None, ("traces on (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless "
                                               "OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none"), None),)})
    tracing_service_name: str = _var("OTEL_SERVICE_NAME", "lane-gateway", str, "the traces' service name")

    # -- the command line (gateway/cli) -------------------------------------------------------------
    url: str = _var("GATEWAY_URL", "http://127.0.0.1:8080", str, "the gateway `gateway drift` asks")
    demo_decode_tps: float = _var("GATEWAY_DEMO_DECODE_TPS", "60", float, "`gateway demo`: emulated decode "
                                  "speed, tokens/s")
    demo_prefill_tps: float = _var("GATEWAY_DEMO_PREFILL_TPS", "5000", float, "`gateway demo`: emulated prefill "
                                   "speed of uncached tokens, tokens/s")
