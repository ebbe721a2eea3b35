"""Drift alerts: one per conversation and cause, deduplicated with a count, kept with retention."""

from __future__ import annotations

import time
from typing import Any

import orjson

from ..exchange import Exchange
from ..store import StateStore
from .causes import fixer
from .drift import Divergence

INDEX = "alerts"


def severity(tokens_lost: int) -> str:
    if tokens_lost >= 100_000:
        return "critical"
    if tokens_lost >= 10_000:
        return "major"
    if tokens_lost >= 1_000:
        return "minor"
    return "info"


class AlertBook:
    def __init__(self, store: StateStore, retention_s: float = 7 * 86400, max_alerts: int = 5000) -> None:
        self.store = store
        self.retention_s = retention_s
        self.max_alerts = max_alerts
        self.raised = 0

    async def raise_alert(self, ex: Exchange, lane: str, div: Divergence, cache: dict[str, Any],
                          snippets: tuple[str, str] | None) -> dict[str, Any]:
        key = f"alert:{ex.conversation_id}:{div.cause}"
        now = time.time()
        raw = await self.store.get(key)
        previous = orjson.loads(raw) if raw else None
        tokens_lost = int(cache.get("tokens_lost") or 0)
        alert = {
            "id": key.removeprefix("alert:"),
            "time": now,
            "first_seen": previous["first_seen"] if previous else now,
            "count": (previous["count"] + 1) if previous else 1,
            "lane": lane,
            "tenant": ex.tenant,
            "model": ex.public_model,
            "conversation": ex.conversation_id,
            "turn": ex.turn,
            "request_id": ex.request_id,
            "cause": div.cause,
            "fixable_by": fixer(div.cause),
            "message_index": div.message_index,
            "field": div.field,
            "tokens_lost": tokens_lost,
            "tokens_lost_total": (previous.get("tokens_lost_total", 0) if previous else 0) + tokens_lost,
            "seconds_lost": cache.get("seconds_lost", 0.0),
            "severity": severity(tokens_lost),
            "snippet_before": snippets[0] if snippets else None,
            "snippet_after": snippets[1] if snippets else None,
        }
        await self.store.set(key, orjson.dumps(alert), self.retention_s)
        await self.store.index_add(INDEX, key, now, self.max_alerts)
        self.raised += 1
        return alert

    async def list(self, *, lane: str | None = None, cause: str | None = None, since: float | None = None,
                   min_tokens_lost: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        keys = await self.store.index_newest(INDEX, min(self.max_alerts, max(limit * 4, 200)))
        out = []
        for raw in await self.store.mget(keys) if keys else []:
            if raw is None:
                continue
            a = orjson.loads(raw)
            if lane and a["lane"] != lane or cause and a["cause"] != cause:
                continue
            if since and a["time"] < since or a["tokens_lost"] < min_tokens_lost:
                continue
            out.append(a)
            if len(out) >= limit:
                break
        return out
