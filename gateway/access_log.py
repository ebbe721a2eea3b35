"""The access log: one structured line per request, written after the response (an aftermath sink).

uvicorn's own access log is off (it would log before a stream ends, without lane, tokens or cache
verdict). This one runs after the analysis, so a line carries what operators grep for:

    request id, tenant, model, lane, replica, status, bytes in/out, latency, TTFT, cached tokens
    reported and predicted, cache verdict, fallback

Settings (env, or `gateway serve` flags): GATEWAY_ACCESS_LOG=0 (--no-access-log) turns it off;
GATEWAY_ACCESS_LOG_FORMAT=json|text; GATEWAY_ACCESS_LOG_SAMPLE=0.1 keeps a tenth of the successful
requests (errors, 4xx and 5xx, are always written); GATEWAY_ACCESS_LOG_FILE=path appends there
instead of stderr. Lines go through the `gateway.access` logger (level INFO), so a logging config
may route them elsewhere.

The tenant is never the key: `key:` + the first 8 hex digits of the key's sha256 (the digest the
key check already uses; the same key always gives the same tenant), or `-` without a key.
"""

from __future__ import annotations

import hashlib
import logging
import random
import os
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from .exchange import Exchange
from .records.record import reported_cached_tokens
from .runtime import LaneRuntime

log = logging.getLogger("gateway.access")


@dataclass(frozen=True)
class AccessLogSettings:
    enabled: bool = True
    format: str = "json"  # json | text
    sample: float = 1.0  # share of successful requests written; errors always are
    path: str | None = None  # None: stderr

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "AccessLogSettings":
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


def tenant_of(headers: Any) -> str:
    """A stable, non-reversible name for the client key the request presented."""
    if headers is None:
        return "-"
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.strip().partition(" ")
    key = value.strip() if scheme.lower() == "bearer" else ""
    key = key or headers.get("x-api-key") or headers.get("api-key") or ""
    if not key:
        return "-"
    return "key:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _ms(start: float, t: float | None) -> float | None:
    return None if t is None else round((t - start) * 1000, 1)


def access_fields(ex: Exchange) -> dict[str, Any]:
    usage = ex.usage if isinstance(ex.usage, dict) else {}
    cache = ex.annotations.get("cache") if isinstance(ex.annotations.get("cache"), dict) else {}
    fields: dict[str, Any] = {
        "ts": round(ex.started_wall, 3),
        "request_id": ex.request_id,
        "tenant": tenant_of(ex.request_headers),
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
        "predicted_cached_tokens": cache.get("predicted_cached_tokens"),
        "verdict": cache.get("verdict") or "unknown",
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


class AccessLog:
    """The sink: formats one line per exchange and hands it to the `gateway.access` logger."""

    def __init__(self, settings: AccessLogSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.written = 0
        self.sampled_out = 0
        self._rng = rng or random.Random()
        if settings.path:
            handler: logging.Handler = logging.FileHandler(settings.path, encoding="utf-8")
        else:
            handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        if not any(getattr(h, "_gateway_access", False) for h in log.handlers):
            handler._gateway_access = True  # type: ignore[attr-defined]
            log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # one line, once: not again through the root logger's format

    def __call__(self, ex: Exchange, lane: LaneRuntime | None) -> None:
        s = self.settings
        failed = ex.status >= 400 or ex.cancelled or ex.status < 100
        if not failed and s.sample < 1.0 and self._rng.random() >= s.sample:
            self.sampled_out += 1
            return
        fields = access_fields(ex)
        line = orjson.dumps(fields).decode() if s.format == "json" else _text(fields)
        log.info(line)
        self.written += 1


def install(gw: Any) -> AccessLog | None:
    settings = AccessLogSettings.from_env(dict(os.environ))
    if not settings.enabled:
        return None
    sink = AccessLog(settings)
    gw.aftermath.sinks.append(sink)  # after analysis: the verdict and the prediction are known
    return sink

