"""Forward a prepared request to a lane and relay the answer: streams event by event, never buffered
(stream.py), whole answers checked and shaped (whole.py)."""

from __future__ import annotations

import time

from ..core.answer import Answer
from ..core.exchange import Exchange
from ..core.runtime import LaneRuntime
from ..pipeline.body_parts import Body
from ..server.client_link import ClientGone, ClientLink
from ..upstream.encoding import DecodeError, decoder_for
from ..upstream.replicas import Replica, UpstreamFailure
from .inflight import InFlight, bad_response, race
from .stream import relay_stream
from .whole import MAX_BODY_BYTES, relay_error, relay_whole


async def forward(
    ex: Exchange,
    lane: LaneRuntime,
    path: str,
    body: Body,
    link: ClientLink,
) -> Answer:
    """Send `body` to the lane and return the client's answer (whose `close` ends what it holds).

    Whatever the upstream does (any status, any body, any encoding, a stream cut anywhere), the
    client gets either the upstream's answer, checked to be well formed, or an OpenAI-shaped error:
    as a status before the first byte, as a final error event and [DONE] after it.
    """
    upstream = lane.upstream
    order = lane.router.order(upstream.replicas, ex)
    ex.t_forwarded = time.perf_counter()

    def retried(replica: Replica) -> None:
        ex.retries += 1

    try:
        traceparent = ex.trace.upstream_started(ex, lane.config) if ex.trace is not None else None
        replica, resp = await race(link, upstream.send(order, path, body, ex.request_id, on_retry=retried,
                                                       traceparent=traceparent), ex)
    except UpstreamFailure as exc:
        ex.upstream_error = exc.message
        raise exc.as_gateway_error() from None
    ex.replica = replica.url
    lane.router.served(replica, ex)
    ex.t_first_byte = time.perf_counter()
    f = InFlight(ex, lane, replica, resp, link)
    if not 200 <= resp.status < 300:
        return await relay_error(f)
    try:
        decoder = decoder_for(resp.headers.get("Content-Encoding"), MAX_BODY_BYTES)
    except DecodeError as exc:
        f.failed(str(exc))
        raise bad_response(ex, str(exc)) from None
    if ex.stream:
        return await relay_stream(f, decoder, len(body))
    return await relay_whole(f, decoder)


__all__ = ["ClientGone", "forward"]
