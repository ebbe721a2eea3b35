"""Per-tenant rate limits on the request path: a pipeline policy (first, before any work is done for
the request) and a finisher (the answer's tokens charged, the concurrency slot given back).

Every rule of `gateway.rate_limits` that matches the request's tenant (and model, when the rule names
one) applies; `tenant: "*"` gives each tenant its own budget. Requests per minute and concurrent
requests are taken on admission (counted first, refunded when over: exact across processes); tokens
per minute are charged after the answer, from the engine's usage (a stream cut short is charged the
chunks it relayed), and a request is admitted while the window's tokens are under the limit. Over a
limit: wait up to the rule's `wait_s` for room, else 429 in OpenAI's shape with Retry-After. Every
answer carries OpenAI's `x-ratelimit-*` headers for the first rule that limits requests and tokens.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Any, Callable

from ..core.errors import GatewayError
from ..core.exchange import Exchange, RateLimitNote
from .counters import Counters, MemoryCounters, Window, clock

if TYPE_CHECKING:
    from ..core.config import RateLimit
    from ..core.runtime import LaneRuntime, Runtime

log = logging.getLogger("gateway.ratelimits")

RETRY_STEP_S = 0.25  # how often a waiting request looks for room again


class _Over(Exception):
    def __init__(self, what: str, retry_s: float) -> None:
        self.what, self.retry_s = what, retry_s


def _key(i: int, rule: "RateLimit", ex: Exchange) -> str:
    return f"{i}:{ex.tenant}" + (f":{rule.model}" if rule.model else "")


def _matches(rule: "RateLimit", ex: Exchange) -> bool:
    return rule.tenant in ("*", ex.tenant) and (rule.model is None or rule.model == ex.public_model)


def _duration(seconds: float) -> str:
    """OpenAI's reset format: 1s, 6m0s."""
    s = max(0, math.ceil(seconds))
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


def charged_tokens(ex: Exchange, what: str) -> int:
    """The tokens an answer costs, from the engine's usage (a cut stream: the chunks it relayed)."""
    usage = ex.usage if isinstance(ex.usage, dict) else {}
    prompt = p if isinstance(p := usage.get("prompt_tokens"), int) else 0
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else 0
    completion = usage.get("completion_tokens")
    if not isinstance(completion, int):
        completion = len(ex.token_chunk_times)
    uncached = max(0, prompt - cached)
    return {"uncached_prompt+completion": uncached + completion, "prompt+completion": prompt + completion,
            "uncached_prompt": uncached, "completion": completion}[what]


class RateLimits:
    """A pipeline policy and a finisher (compose.py)."""

    name = "rate_limits"
    per_lane = False  # per tenant (and model): the lane that serves it does not change the count

    def __init__(self, runtime: "Runtime", counters: Counters | None = None,
                 now: Callable[[], float] = clock) -> None:
        self.runtime = runtime
        self.counters: Counters = counters if counters is not None else MemoryCounters()
        self.now = now
        self.refused: dict[tuple[str, str], int] = {}  # (tenant, limit) -> requests refused
        self.seen: set[tuple[int, str]] = set()  # (rule, tenant) pairs this process has counted
        self._tasks: set[asyncio.Task[None]] = set()

    # -- admission -------------------------------------------------------------------------------

    async def apply(self, ex: Exchange, lane: "LaneRuntime", body: dict[str, Any]) -> None:
        rules = [(i, r) for i, r in enumerate(self.runtime.snapshot.config.gateway.rate_limits) if _matches(r, ex)]
        if not rules:
            return
        note = ex.rate_limits = RateLimitNote()
        self.seen.update((i, ex.tenant) for i, _ in rules)
        wait = max(r.wait_s for _, r in rules)
        start = self.now()
        while True:
            try:
                await self._admit(ex, rules, note)
                note.waited_s = round(self.now() - start, 3)
                return
            except _Over as over:
                left = start + wait - self.now()
                if left <= 0:
                    note.refused = over.what
                    note.waited_s = round(self.now() - start, 3)
                    self.refused[(ex.tenant, over.what)] = self.refused.get((ex.tenant, over.what), 0) + 1
                    retry = max(1, math.ceil(over.retry_s))
                    raise GatewayError(
                        429, f"Rate limit reached for tenant {ex.tenant!r}: {over.what}. Please try again in "
                        f"{retry}s.", code="rate_limit_exceeded", type="rate_limit_error",
                        headers={"Retry-After": str(retry)}) from None
                await asyncio.sleep(min(RETRY_STEP_S, left))

    async def _admit(self, ex: Exchange, rules: list[tuple[int, "RateLimit"]], note: RateLimitNote) -> None:
        now = self.now()
        taken: list[tuple[str, str]] = []  # ("request" | "slot", key) to give back when a later rule refuses
        try:
            for i, rule in rules:
                key = _key(i, rule, ex)
                if rule.tokens_per_minute is not None:
                    w = await self.counters.peek(key + ":t", now)
                    self._headers(ex, "tokens", rule.tokens_per_minute, w)
                    if w.used >= rule.tokens_per_minute:
                        raise _Over(f"tokens_per_minute {rule.tokens_per_minute}", w.reset_s)
                if rule.requests_per_minute is not None:
                    w = await self.counters.add(key + ":r", 1, now)
                    taken.append(("request", key + ":r"))
                    self._headers(ex, "requests", rule.requests_per_minute, w)
                    if w.used > rule.requests_per_minute:
                        raise _Over(f"requests_per_minute {rule.requests_per_minute}", w.reset_s)
                if rule.concurrent is not None:
                    level = await self.counters.gauge(key + ":c", 1)
                    taken.append(("slot", key + ":c"))
                    if level > rule.concurrent:
                        raise _Over(f"concurrent {rule.concurrent}", RETRY_STEP_S)
        except _Over:
            for kind, key in taken:
                await (self.counters.add(key, -1, now) if kind == "request" else self.counters.gauge(key, -1))
            raise
        note.held = [key for kind, key in taken if kind == "slot"]
        note.charged = [(_key(i, r, ex) + ":t", r.tokens) for i, r in rules if r.tokens_per_minute is not None]

    @staticmethod
    def _headers(ex: Exchange, what: str, limit: int, w: Window) -> None:
        if f"x-ratelimit-limit-{what}" in ex.response_headers:
            return  # the first rule that limits it speaks for the request
        ex.response_headers[f"x-ratelimit-limit-{what}"] = str(limit)
        ex.response_headers[f"x-ratelimit-remaining-{what}"] = str(max(0, limit - math.ceil(w.used)))
        ex.response_headers[f"x-ratelimit-reset-{what}"] = _duration(w.reset_s)

    # -- the end of the exchange -------------------------------------------------------------------

    def exchange_ended(self, ex: Exchange, lane: "LaneRuntime | None") -> None:
        note = ex.rate_limits
        if note is None or note.refused is not None or not (note.held or note.charged):
            return
        task = asyncio.get_running_loop().create_task(self._settle(ex, note))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, ex: Exchange, note: RateLimitNote) -> None:
        try:
            for key in note.held:
                await self.counters.gauge(key, -1)
            now = self.now()
            for key, what in note.charged:
                tokens = charged_tokens(ex, what)
                if tokens:
                    await self.counters.add(key, tokens, now)
        except Exception:  # a store outage must not hurt the request path; the counts are lost
            log.exception("rate limits: settling request %s failed", ex.request_id)

    # -- what the admin page shows -----------------------------------------------------------------

    async def route(self, request: Any) -> Any:
        """GET /admin/api/ratelimits: each rule's use against its limit, per tenant."""
        from starlette.responses import JSONResponse

        return JSONResponse({"rules": await self.usage()})

    async def usage(self) -> list[dict[str, Any]]:
        """Each rule's configuration and, per tenant it named or this process counted, its use against it."""
        now = self.now()
        out = []
        for i, rule in enumerate(self.runtime.snapshot.config.gateway.rate_limits):
            tenants = {rule.tenant} if rule.tenant != "*" else {t for (j, t) in self.seen if j == i}
            for tenant in sorted(tenants):
                key = f"{i}:{tenant}" + (f":{rule.model}" if rule.model else "")
                row: dict[str, Any] = {"rule": i, "tenant": tenant, "model": rule.model}
                if rule.requests_per_minute is not None:
                    row["requests_per_minute"] = {"limit": rule.requests_per_minute,
                                                  "used": round((await self.counters.peek(key + ":r", now)).used, 1)}
                if rule.tokens_per_minute is not None:
                    row["tokens_per_minute"] = {"limit": rule.tokens_per_minute, "counts": rule.tokens,
                                                "used": round((await self.counters.peek(key + ":t", now)).used, 1)}
                if rule.concurrent is not None:
                    row["concurrent"] = {"limit": rule.concurrent, "used": await self.counters.gauge(key + ":c", 0)}
                row["refused"] = sum(n for (t, _), n in self.refused.items() if t == tenant)
                out.append(row)
        return out
