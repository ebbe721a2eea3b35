"""Connections to one lane's replicas: pooled connections, failover before the first byte.

The request path uses the gateway's own HTTP/1.1 client (upstream_client.py): the upstream client
is what decides a Python proxy's overhead, and even aiohttp's, far cheaper than httpx's, was still
the largest step of the hot path. Health probes and /v1/models use aiohttp's session: they are
not on the request path.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..core.config import Lane, Timeouts
from ..core.errors import GatewayError
from ..pipeline.body_parts import Body
from ..relay.scrub import Scrubber
from .client import Pool, Target


@dataclass
class Replica:
    """One replica and its circuit breaker.

    closed (``open_until == 0``): every request may use it. open (``now < open_until``): skipped.
    half-open (cool-down over): exactly one request, the probe, may use it; its answer closes the
    breaker (any status below 500) or opens it again for another cool-down.
    """

    url: str
    inflight: int = 0
    consecutive_failures: int = 0
    open_until: float = 0.0  # circuit breaker: skip until this monotonic time; 0 = closed
    probing: bool = False  # half-open: the one trial request is in flight
    last_error: str | None = None
    last_ok: float | None = None
    requests: int = 0
    failures: int = 0
    opened: int = 0  # times the breaker opened
    last_opened_at: float | None = None  # wall clock

    def available(self, now: float) -> bool:
        return self.open_until <= now and not self.probing

    def state(self, now: float) -> str:
        if self.open_until == 0.0:
            return "closed"
        return "open" if self.open_until > now or self.probing else "half_open"

    def acquire(self, now: float) -> bool:
        """May a request go to this replica now? Half-open lets exactly one through (the probe)."""
        if self.open_until == 0.0:
            return True
        if self.open_until > now or self.probing:
            return False
        self.probing = True
        return True


@dataclass(frozen=True)
class BreakerSettings:
    failures_to_open: int = 3
    cool_down_s: float = 5.0


class UpstreamFailure(Exception):
    """The upstream could not be reached or did not answer in time (before any byte reached the client)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def as_gateway_error(self) -> GatewayError:
        return GatewayError(self.status, self.message, code=self.code, type="upstream_error")


# Lane.failover_on's default: statuses that mean "not this replica, not now", and refused connections.
_DEFAULT_FAILOVER = frozenset(("connect", 502, 503, 504))


@dataclass
class Upstream:
    """The replicas of one lane and the session that talks to them. Survives reloads when unchanged."""

    replicas: list[Replica]
    timeouts: Timeouts
    api_key: str | None = None
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    failover_on: frozenset = _DEFAULT_FAILOVER
    _session: aiohttp.ClientSession | None = None
    scrubber: Scrubber = field(init=False)
    _targets: dict[tuple[str, str], Target] = field(default_factory=dict, init=False, repr=False)
    _pool: Pool | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.scrubber = Scrubber([self.api_key])

    @classmethod
    def for_lane(cls, lane: Lane) -> "Upstream":
        breaker = BreakerSettings(lane.breaker.failures, lane.breaker.cool_down_s)
        return cls([Replica(u) for u in lane.replicas], lane.timeouts, lane.upstream_api_key(), breaker,
                   frozenset(lane.failover_on))

    def identity(self) -> tuple:
        return (tuple(r.url for r in self.replicas), self.timeouts, self.api_key, self.breaker, self.failover_on)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # keepalive_timeout below the engines' 5 s (see Timeouts.keep_alive): at 60 s the pool
            # could hand out a connection in the very moment the engine closes it as idle.
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300,
                                             keepalive_timeout=self.timeouts.keep_alive)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect,
                                              sock_connect=self.timeouts.connect),
                # The gateway decodes itself (encoding.py), bounded; it asks for identity anyway.
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
                # Engines set no cookies the gateway should keep, and the jar's filtering ran on
                # every request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None and not self._session.closed:
            await self._session.close()

    def connections_held(self) -> int:
        """Upstream connections lent to a response not yet released or closed (tests: none leak)."""
        held = self._pool.held() if self._pool is not None else 0
        session = self._session
        if session is not None and not session.closed and session.connector is not None:
            held += len(session.connector._acquired)  # aiohttp's own count
        return held

    async def _post(self, replica: Replica, path: str, body: Body, request_id: str,
                    traceparent: str | None = None) -> Any:
        """One request on the gateway's own client; its answer once the head is in."""
        pool = self._pool
        if pool is None or pool.closed:
            pool = self._pool = Pool(self.timeouts.connect, self.timeouts.keep_alive)
        key = (replica.url, path)
        target = self._targets.get(key)
        if target is None:
            headers = self.headers("")
            del headers["X-Request-Id"]  # per request, below
            target = self._targets[key] = Target.parse(replica.url + path, headers)
        head = b"X-Request-Id: %b\r\n" % request_id.encode("latin-1")
        if traceparent is not None:
            head += b"traceparent: %b\r\n" % traceparent.encode("latin-1")
        return await pool.post(target, body, head)

    def headers(self, request_id: str) -> dict[str, str]:
        # identity: an HTTP client may otherwise ask for gzip/deflate, which engines behind a compressing
        # proxy then send, and the gateway relays an answer's bytes as JSON: it must get them uncompressed.
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", "X-Request-Id": request_id}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def send(
        self, order: list[Replica], path: str, body: Body, request_id: str, on_retry=None,
        traceparent: str | None = None,
    ) -> tuple[Replica, Any]:
        """POST to the first replica that answers; what counts as "not this one, try the next" is the
        lane's `failover_on` (default: connection failures and 502/503/504).

        Waits for the response headers within the lane's first-byte timeout. Nothing has reached the
        client yet, so handing over is safe. Raises UpstreamFailure: 503 at once when every
        replica's breaker is open, 502 when nobody could be reached, 504 on a first-byte timeout.
        """
        last = "no replica answered"
        post = self._post
        failover = self.failover_on
        tried = 0
        for i, replica in enumerate(order):
            if not replica.acquire(time.monotonic()):
                continue  # opened (or its one probe taken) since the order was made
            if tried and on_retry is not None:
                on_retry(replica)
            tried += 1
            replica.inflight += 1
            replica.requests += 1
            try:
                async with asyncio.timeout(self.timeouts.first_byte):
                    resp = await post(replica, path, body, request_id, traceparent)
            except TimeoutError:
                replica.inflight -= 1
                self.record_failure(replica, "first-byte timeout")
                last = f"no answer within {self.timeouts.first_byte:g}s"
                if "timeout" in failover and self._another(order, i):
                    continue
                raise UpstreamFailure(
                    504, "upstream_timeout",
                    f"the upstream did not answer within {self.timeouts.first_byte:g}s",
                ) from None
            except (OSError, ValueError) as exc:
                # Refused, reset, or an answer that is not HTTP (bad status line, huge header): the
                # gateway's client (client.py) raises OSErrors for all of them.
                replica.inflight -= 1
                last = self.scrubber.text(f"{type(exc).__name__}: {exc}", 200)
                self.record_failure(replica, last)
                if "connect" in failover:
                    continue
                raise UpstreamFailure(502, "upstream_unavailable",
                                      f"the upstream could not be reached ({last})") from None
            except BaseException:  # cancelled: the client went away
                replica.inflight -= 1
                replica.probing = False  # the probe never finished: the next request may probe
                raise
            if resp.status in failover and self._another(order, i):
                resp.close()  # its body is of no interest; do not wait to drain it
                replica.inflight -= 1
                last = f"HTTP {resp.status}"
                self.record_failure(replica, last)
                continue
            if replica.probing and resp.status < 500:
                self.record_success(replica)  # the half-open probe answered: close the breaker
            return replica, resp
        if not tried:
            raise UpstreamFailure(503, "no_healthy_replica", "every replica of this lane is failing; try again shortly")
        raise UpstreamFailure(502, "upstream_unavailable", f"no replica of this lane could be reached ({last})")

    @staticmethod
    def _another(order: list[Replica], i: int) -> bool:
        now = time.monotonic()
        return any(r.available(now) for r in order[i + 1:])

    def record_failure(self, replica: Replica, why: str) -> None:
        """Passive health: a connection failure, timeout or 5xx of real traffic (or an active probe)."""
        replica.failures += 1
        replica.consecutive_failures += 1
        replica.last_error = why
        if replica.probing or replica.open_until or replica.consecutive_failures >= self.breaker.failures_to_open:
            if replica.open_until == 0.0 or replica.probing:
                replica.opened += 1
                replica.last_opened_at = time.time()
            replica.open_until = time.monotonic() + self.breaker.cool_down_s
            replica.probing = False

    def record_success(self, replica: Replica) -> None:
        replica.consecutive_failures = 0
        replica.open_until = 0.0
        replica.probing = False
        replica.last_ok = time.time()

    def probe_passed(self, replica: Replica) -> None:
        """An active health probe answered: an open breaker may try a real request now (half-open)."""
        if replica.open_until:
            replica.open_until = min(replica.open_until, time.monotonic())


