"""A whole answer relayed: read to its end (bounded), checked to be well formed, shaped for the
client; an upstream's error status normalised to the API's error shape."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from . import reshape
from ..core.answer import Answer
from ..core.errors import error_body
from ..core.exchange import Exchange
from ..pipeline import messages_from_chat, passthrough, token_ids
from ..upstream.client import Response as UpstreamResponse
from ..upstream.encoding import DecodeError, Decoder, decoder_for
from ..upstream.errors import MAX_ERROR_BODY, client_status, normalise_error
from .inflight import InFlight, answered, bad_response
from .sse import observe_completion
from .wellformed import completion_problem

MAX_BODY_BYTES = 64 * 1024 * 1024  # a whole (non-streamed) answer; the largest real ones are a few MB
_NOT_JSON = object()


async def _read_all(resp: UpstreamResponse, decoder: Decoder, have: bytes = b"",
                    limit: int = MAX_BODY_BYTES) -> bytes:
    """The rest of the body, decoded, at most `limit` bytes (DecodeError beyond)."""
    parts = [have] if have else []
    size = len(have)
    while True:
        raw = await resp.content.readany()
        data = decoder.feed(raw) if raw else decoder.finish()
        if data:
            size += len(data)
            if size > limit:
                raise DecodeError(f"the upstream's answer is larger than {limit} bytes")
            parts.append(data)
        if not raw:
            return b"".join(parts)


async def relay_whole(f: InFlight, decoder: Decoder, have: bytes = b"") -> Answer:
    ex, lane, resp = f.ex, f.lane, f.resp
    async with f.before_answer(lane.upstream.timeouts.first_byte, "timeout reading the body",
                               "the upstream did not finish its answer in time"):
        data = await f.race(_read_all(resp, decoder, have))
    resp.release()
    # The prompt's ids leave as their JSON, parsed by the analysis off the event loop (token_ids.py).
    read = token_ids.take_prompt(ex, data)
    try:
        parsed = orjson.loads(read)
    except orjson.JSONDecodeError:
        parsed = _NOT_JSON
    if type(parsed) is dict and (parsed.get("error") is not None or parsed.get("object") == "error"):
        # An error inside a 2xx (some proxies and engines; vLLM's flat shape): an error all the same.
        f.done(ok=False, why="error object in a 2xx answer")
        body = normalise_error(502, parsed, lane.upstream.scrubber)
        return error_answer(ex, 502, body)
    if ex.stream:
        f.done(ok=False, why="no stream")
        raise bad_response(ex, "the upstream answered a streaming request without a stream")
    wire = ex.upstream_path or ex.path  # the engine's API (the client's, unless the gateway translates)
    problem = "it is not JSON" if parsed is _NOT_JSON else (
        completion_problem(parsed) if wire in passthrough.STREAM_OPTIONS
        else None if type(parsed) is dict else "the answer is not a JSON object")
    if problem is not None:
        f.done(ok=False, why="malformed answer")
        raise bad_response(ex, f"the upstream's answer is malformed: {problem}")
    f.done(ok=True)
    ex.status = 200
    now = time.perf_counter()
    ex.t_first_token = ex.t_last_token = now
    (observe_completion if wire in passthrough.STREAM_OPTIONS else passthrough.observe_response_body)(ex, parsed)
    if ex.answered:
        await answered(ex)
    if ex.upstream_path is not None:  # a translated API: the answer in the client's API
        data = orjson.dumps(messages_from_chat.message_of(parsed, ex.public_model or ""))
    else:
        if ex.token_ids_strip:  # the gateway asked for the ids, the client did not
            data = token_ids.strip_body(read)[0]
        data = reshape.for_lane(ex, lane).body(data)  # the client's model name, the lane's reasoning field
    ex.response_bytes = len(data)
    return Answer.json(200, data)


async def relay_error(f: InFlight) -> Answer:
    ex, lane, resp = f.ex, f.lane, f.resp
    data = b""
    complete = False
    try:
        async with asyncio.timeout(lane.upstream.timeouts.first_byte):
            decoder = decoder_for(resp.headers.get("Content-Encoding"), MAX_ERROR_BODY)
            while len(data) < MAX_ERROR_BODY:
                raw = await resp.content.readany()
                data += decoder.feed(raw) if raw else decoder.finish()
                if not raw:
                    complete = True
                    break
    except (aiohttp.ClientError, OSError, TimeoutError, DecodeError):
        pass  # what arrived is all there is to say
    except BaseException:
        f.dropped()
        raise
    if complete:
        resp.release()  # read to the end: the connection can serve the next request
    else:
        resp.close()
    upstream_status = resp.status
    status, imposed = client_status(upstream_status)
    f.done(ok=upstream_status < 500 and imposed is None, why=f"HTTP {upstream_status}")
    body = normalise_error(upstream_status, data[:MAX_ERROR_BODY], lane.upstream.scrubber)
    headers = {}
    if imposed == "upstream_auth_failed":
        ex.upstream_error = f"HTTP {upstream_status}: {body['error']['message']}"
        body = error_body("the upstream rejected the gateway's credentials for this model; "
                          "the gateway's operator has to fix the lane's key", type="api_error",
                          code="upstream_auth_failed")
    elif imposed is not None:
        ex.upstream_error = f"HTTP {upstream_status}: {body['error']['message']}"
        body["error"]["code"] = body["error"]["code"] if imposed == "upstream_error" and body["error"]["code"] \
            else imposed
        body["error"]["type"] = "api_error"
        if imposed == "upstream_bad_response":
            body["error"]["message"] = f"the upstream answered HTTP {upstream_status}: {body['error']['message']}"
    retry_after = resp.headers.get("Retry-After", "")
    if status in (429, 503) and retry_after.isdigit() and len(retry_after) <= 5:
        headers["Retry-After"] = retry_after
    return error_answer(ex, status, body, headers)


def error_answer(ex: Exchange, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    err = body["error"]
    ex.fail(status, err.get("code"), str(err.get("message")))
    if ex.upstream_error is None:
        ex.upstream_error = ex.error_message
    answer = Answer.json(status, orjson.dumps(body), headers)
    ex.response_bytes = len(answer.body)
    return answer
