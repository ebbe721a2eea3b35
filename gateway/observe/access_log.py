"""The access log: one structured line per request, written after the response (an aftermath sink).

uvicorn's own access log is off (it would log before a stream ends, without lane, tokens or cache
verdict). This one runs after the analysis, so a line carries what operators grep for:

    request id, tenant, model, lane, replica, status, bytes in/out, latency, TTFT, cached tokens
    reported and predicted, cache verdict, fallback

Settings (Settings.access_log: env, or `gateway serve` flags): GATEWAY_ACCESS_LOG=0 (--no-access-log)
turns it off; GATEWAY_ACCESS_LOG_FORMAT=json|text; GATEWAY_ACCESS_LOG_SAMPLE=0.1 keeps a tenth of the
successful requests (errors, 4xx and 5xx, are always written); GATEWAY_ACCESS_LOG_FILE=path appends
there instead of stderr. Lines go through the `gateway.access` logger (level INFO), so a logging config
may route them elsewhere.

The tenant is the one the client-key check named (security.py: its id, never the key).
"""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import random
import sys
import time
from typing import Any

import orjson

from ..core.exchange import Exchange
from ..core.settings import AccessLogSettings
from ..records.record import reported_cached_tokens
from ..core.runtime import LaneRuntime

log = logging.getLogger("gateway.access")
BATCH_LINES = 256
FLUSH_S = 0.1


def _ms(start: float, t: float | None) -> float | None:
    return None if t is None else round((t - start) * 1000, 1)


def access_fields(ex: Exchange) -> dict[str, Any]:
    usage = ex.usage if isinstance(ex.usage, dict) else {}
    fields: dict[str, Any] = {
        "ts": round(ex.started_wall, 3),
        "request_id": ex.request_id,
        "tenant": ex.tenant,
        "method": "POST",
        "path": ex.path,
        "model": ex.public_model,
        "lane": ex.lane,
        "replica": ex.replica,
        "status": 499 if ex.cancelled else ex.status,
        "stream": ex.stream,
        "bytes_in": ex.body_bytes,
        "bytes_out": ex.response_bytes,
        "latency_ms": _ms(ex.started, ex.t_end),
        "ttft_ms": _ms(ex.started, ex.t_first_token),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": reported_cached_tokens(usage),
        "predicted_cached_tokens": ex.cache.predicted_cached_tokens if ex.cache is not None else None,
        "verdict": ex.cache.verdict if ex.cache is not None else "unknown",
        "error": ex.error_code,
    }
    if ex.fallback_from:
        fields["fallback_from"] = ex.fallback_from
    return fields


def _text(fields: dict[str, Any]) -> str:
    # `key=value` pairs (logfmt): values with spaces or quotes are quoted JSON strings.
    parts = []
    for k, v in fields.items():
        if v is None:
            v = "-"
        elif isinstance(v, bool):
            v = "true" if v else "false"
        s = str(v)
        if not s or any(c in s for c in ' "=\\') or not s.isprintable():
            s = orjson.dumps(s).decode()
        parts.append(f"{k}={s}")
    return " ".join(parts)


class _AccessBuffer(logging.handlers.MemoryHandler):
    """An access-log sink's buffer: one per logger, however many sinks are made."""


class AccessLog:
    """The sink: formats one line per exchange and hands it to the `gateway.access` logger."""

    def __init__(self, settings: AccessLogSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.written = 0
        self.sampled_out = 0
        self._rng = rng or random.Random()
        if settings.path:
            handler: logging.StreamHandler[Any] = logging.FileHandler(settings.path, encoding="utf-8")
        else:
            handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        # Lines are written in batches: one write per line would be a syscall per request; a batch
        # leaves within FLUSH_S, and at once from WARNING up.
        self._buffer = _AccessBuffer(BATCH_LINES, logging.WARNING, handler)
        self._target = handler
        # Lines held for the next flush when nothing but this sink's own handler listens: what the
        # handler would write for each (its format is the message alone), without a LogRecord per
        # line (`log.info` is most of the sink's cost). Any other handler or filter on the logger, or
        # a level above INFO, and lines take `log.info`.
        self._lines: list[str] = []
        self._flush_due = False
        if not any(isinstance(h, _AccessBuffer) for h in log.handlers):
            log.addHandler(self._buffer)
        log.setLevel(logging.INFO)
        log.propagate = False  # one line, once: not again through the root logger's format

    def __call__(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        failed = ex.status >= 400 or ex.cancelled or ex.status < 100
        if self._sampled_out(failed):
            return
        self.write(access_fields(ex), failed)

    def _sampled_out(self, failed: bool) -> bool:
        if not failed and self.settings.sample < 1.0 and self._rng.random() >= self.settings.sample:
            self.sampled_out += 1
            return True
        return False

    def write(self, fields: dict[str, Any], failed: bool = False, sampled: bool = True) -> None:
        if not sampled and self._sampled_out(failed):
            return
        line = orjson.dumps(fields).decode() if self.settings.format == "json" else _text(fields)
        if self._alone():
            self._lines.append(line)
            if len(self._lines) >= BATCH_LINES:
                self.flush()
        else:
            if self._lines:
                self._write_lines()  # in order
            log.info(line)
        self.written += 1
        if not self._flush_due:
            self._flush_due = True
            try:
                asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
            except RuntimeError:  # no event loop (a tool, a test): now
                self.flush()

    def _alone(self) -> bool:
        handlers = log.handlers
        return (len(handlers) == 1 and handlers[0] is self._buffer and not log.filters and not self._buffer.filters
                and not self._target.filters and log.isEnabledFor(logging.INFO))

    def _write_lines(self) -> None:
        """The held lines, as the handler writes them (`%(message)s` and its terminator), in one write."""
        lines, self._lines = self._lines, []
        self._buffer.flush()  # lines that took log.info before these
        target = self._target
        target.acquire()
        try:
            stream = target.stream
            if stream is None and isinstance(target, logging.FileHandler):
                stream = target.stream = target._open()
            stream.write(target.terminator.join(lines) + target.terminator)
            target.flush()
        except Exception:  # as logging does: never let the access log hurt a request
            if logging.raiseExceptions:
                sys.stderr.write(f"gateway: {len(lines)} access log lines could not be written\n")
        finally:
            target.release()

    def flush(self) -> None:
        self._flush_due = False
        if self._lines:
            self._write_lines()
        for handler in log.handlers:
            handler.flush()

    def plain(self, scope: dict[str, Any]) -> PlainLine | None:
        """The line of a request outside the proxy path, or None (quiet path, or sampled out)."""
        if scope.get("path") in QUIET_PATHS:
            return None
        return PlainLine(self, scope)


QUIET_PATHS = frozenset({"/healthz", "/readyz"})  # polled every few seconds by orchestrators: not logged


class PlainLine:
    """The access line of a request outside the proxy path (GET /v1/models, /metrics, /admin/...):
    wraps `send` to see the status and count the body bytes, writes the line when the answer ends."""

    __slots__ = ("sink", "scope", "status", "bytes_out", "t0")

    def __init__(self, sink: "AccessLog", scope: dict[str, Any]) -> None:
        self.sink, self.scope = sink, scope
        self.status = 0
        self.bytes_out = 0
        self.t0 = time.perf_counter()

    def wrap(self, send: Any) -> Any:
        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body":
                self.bytes_out += len(message.get("body", b""))
                if not message.get("more_body"):
                    self.done()
            await send(message)
        return sending

    def done(self) -> None:
        scope = self.scope
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        fields = {"ts": round(time.time(), 3), "request_id": headers.get("x-request-id"), "tenant": None,
                  "method": scope.get("method"), "path": scope.get("path"), "model": None, "lane": None,
                  "replica": None, "status": self.status, "stream": False, "bytes_in": None,
                  "bytes_out": self.bytes_out, "latency_ms": round((time.perf_counter() - self.t0) * 1000, 1),
                  "ttft_ms": None}
        self.sink.write(fields, failed=self.status >= 400, sampled=False)


def build_access_log(settings: AccessLogSettings) -> AccessLog | None:
    """The access log sink of these settings (Settings.access_log); None when off."""
    return AccessLog(settings) if settings.enabled else None
