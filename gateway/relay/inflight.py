"""One request's answer on its way from one replica, and what every relay of it shares: how it ends
(the replica's count and breaker told once), the race with a client that leaves, the idle watchdog,
the drain that pools the connection again and the writes that wait on a complete answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, TypeVar

import aiohttp

from ..core.errors import GatewayError
from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime
from ..server.client_link import ClientGone, ClientLink
from ..upstream.client import Response as UpstreamResponse
from ..upstream.encoding import DecodeError
from ..upstream.replicas import Replica

log = logging.getLogger("gateway.proxy")
T = TypeVar("T")


@dataclass(slots=True)
class InFlight:
    """The exchange, its lane, the replica that answered, its response and the client's link."""

    ex: Exchange
    lane: LaneRuntime
    replica: Replica
    resp: UpstreamResponse
    link: ClientLink

    def done(self, ok: bool, why: str = "") -> None:
        """The replica served (or failed) this request: its count and breaker are told, once."""
        self.replica.inflight -= 1
        if ok:
            self.lane.upstream.record_success(self.replica)
        else:
            self.lane.upstream.record_failure(self.replica, why)

    def failed(self, why: str) -> None:
        """The response is given up (its connection closed) and the replica's failure recorded."""
        self.resp.close()
        self.done(ok=False, why=why)

    def dropped(self) -> None:
        """The request ends without a verdict on the replica (the client left, the task was cancelled)."""
        self.resp.close()
        self.replica.inflight -= 1

    async def race(self, awaitable: Awaitable[T]) -> T:
        return await race(self.link, awaitable, self.ex)

    @contextlib.asynccontextmanager
    async def before_answer(self, timeout_s: float, late: str, late_message: str) -> AsyncIterator[None]:
        """Reading the upstream before the client's answer has started, within `timeout_s`: a failure
        ends the request with its status (504 when late, 502 otherwise) and tells the replica's breaker."""
        try:
            async with asyncio.timeout(timeout_s):
                yield
        except TimeoutError:
            self.failed(late)
            raise GatewayError(504, late_message, code="upstream_timeout") from None
        except (aiohttp.ClientError, OSError) as exc:
            self.failed(type(exc).__name__)
            raise GatewayError(502, f"the upstream connection failed: {type(exc).__name__}",
                               code="upstream_error") from None
        except DecodeError as exc:
            self.failed(str(exc))
            raise bad_response(self.ex, str(exc)) from None
        except BaseException:
            self.dropped()
            raise


async def race(link: ClientLink, awaitable: Awaitable[T], ex: Exchange) -> T:
    """`await awaitable` unless the client leaves first (then ClientGone, and the exchange is cancelled)."""
    try:
        return await link.race(awaitable)
    except ClientGone:
        ex.cancelled = True
        raise


def bad_response(ex: Exchange, why: str) -> GatewayError:
    ex.upstream_error = why
    return GatewayError(502, why, code="upstream_bad_response", type="upstream_error")


async def drain(resp: UpstreamResponse, wait_s: float = 1.0, limit: int = 65536) -> bool:
    """After [DONE]: read to the end of the response so its connection can be pooled again.

    An engine's last chunk-terminator follows [DONE] within a millisecond; an upstream that keeps
    talking or stalls is cut off after `wait_s` or `limit` bytes (the client already has its answer).
    """
    content = resp.content
    if content.at_eof():
        return True
    seen = 0
    try:
        async with asyncio.timeout(wait_s):
            while not content.at_eof():
                raw = await content.readany()
                if not raw:
                    return True
                seen += len(raw)
                if seen > limit:
                    return False
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
    return True


class IdleWatchdog:
    """The idle timeout of a stream without a timer per chunk: one check every quarter of the
    timeout; when the upstream has sent nothing for the whole timeout while we waited, it closes
    the upstream response (which ends the pending read)."""

    def __init__(self, resp: UpstreamResponse, idle_s: float) -> None:
        self.resp = resp
        self.idle_s = idle_s
        self.fired = False
        self._since: float | None = None
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(idle_s / 4, self._check)

    def waiting(self) -> None:
        self._since = self._loop.time()

    def got_data(self) -> None:
        self._since = None

    def _check(self) -> None:
        if self._since is not None and self._loop.time() - self._since >= self.idle_s:
            self.fired = True
            self.resp.close()
            return
        self._handle = self._loop.call_later(self.idle_s / 4, self._check)

    def stop(self) -> None:
        self._handle.cancel()


async def answered(ex: Exchange) -> None:
    """What waits on the complete answer before its last bytes leave (ex.answered). A hook bounds its
    own waits (a slow store delays the end of an answer by at most the hook's bound); its failure never
    fails the answer."""
    hooks, ex.answered = ex.answered, []
    for hook in hooks:
        try:
            await hook()
        except Exception:  # bookkeeping never costs the client its answer
            log.exception("request %s: a write before the answer's end failed", ex.request_id)
