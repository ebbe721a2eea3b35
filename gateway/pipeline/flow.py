"""The hot path of /v1/chat/completions and /v1/completions: parse, route, police, forward.

Only cheap steps run here; render, drift and records run after the response, beside it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Awaitable, Callable, Protocol, Sequence

import orjson
from starlette.requests import ClientDisconnect, Request

from . import messages_chat, messages_from_chat, passthrough, token_ids
from ..server.client_link import ClientGone, ClientLink
from ..core.answer import Answer
from ..core.errors import AnthropicError, GatewayError, anthropic_body, invalid_request
from ..core.exchange import Exchange
from .fallback import announce, choose_lane
from ..observe.aftermath import FirstBytes, Hold
from .body_parts import Body
from ..server.headers import safe_value
from .history_memo import HistoryMemo, Parsed
from ..relay.forward import forward
from ..core.runtime import LaneRuntime, Policy, Reroute, Snapshot
from ..server.security import Caller
from .validate import check_chat, check_completion
from ..render import options_for_request
from ..render.result import RenderError
from ..tracing import NO_TRACING, Tracing

log = logging.getLogger("gateway.pipeline")

Gate = Callable[[Exchange, LaneRuntime], Awaitable[None]]


class Lanes(Protocol):
    """Where the pipeline finds this request's config and tells that an exchange ended (the Runtime)."""

    @property
    def snapshot(self) -> Snapshot: ...

    def finish(self, ex: Exchange, lane: LaneRuntime | None) -> None: ...

# Fields only the gateway understands; engines would ignore or reject them.
_GATEWAY_ONLY_FIELDS = ("prompt_cache_key",)


class Pipeline:
    """The steps of a proxied request, in the order given: gates (may refuse the lane), then
    policies (may rewrite the body or refuse it), then forwarding. Built once by the composition root."""

    def __init__(self, runtime: Lanes, *, link_of: Callable[[Request], ClientLink], gates: Sequence[Gate] = (),
                 policies: Sequence[Policy] = (), memo: HistoryMemo | None = None,
                 first_bytes: FirstBytes | None = None, tracing: Tracing = NO_TRACING) -> None:
        self.runtime = runtime
        # How this request's waits learn that the client left: the front end's own way (compose.py
        # passes the server's, which knows the wire path and ASGI apart).
        self.link_of = link_of
        self.tracing = tracing
        self.first_bytes = first_bytes or FirstBytes()  # the aftermath waits while requests are held
        self.memo = memo  # recent large chat bodies: the next turn's unchanged history is not parsed again
        self.gates = tuple(gates)  # e.g. qualification: after the route is resolved, before policies
        self.policies = tuple(policies)  # e.g. limits, conversation and effort pin, routing lookups

    async def chat(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, "/v1/chat/completions", check_chat, history=True)

    async def completions(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, "/v1/completions", check_completion)

    # The pass-through endpoints (gateway/pipeline/passthrough.py): the same path, their own shape checks.
    async def responses(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, passthrough.RESPONSES, passthrough.check_responses)

    async def messages(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, passthrough.MESSAGES, messages_chat.check_messages)

    async def count_tokens(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, passthrough.COUNT_TOKENS,
                                  lambda body: messages_chat.check_messages(body, count_only=True))

    async def embeddings(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, passthrough.EMBEDDINGS, passthrough.check_embeddings)

    async def tokenize(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, passthrough.TOKENIZE, passthrough.check_tokenize)

    async def detokenize(self, request: Request, caller: Caller) -> Answer:
        return await self._handle(request, caller, passthrough.DETOKENIZE, passthrough.check_detokenize)

    async def _handle(self, request: Request, caller: Caller, path: str, check: Callable[[dict], None],
                      history: bool = False) -> Answer:
        hold = self.first_bytes.hold()  # on the CPU until it is forwarded: the aftermath waits
        try:
            return await self._answer(request, caller, path, check, history, hold)
        finally:
            hold.release()

    async def _answer(self, request: Request, caller: Caller, path: str, check: Callable[[dict], None],
                      history: bool, hold: Hold) -> Answer:
        ex = Exchange(request_id=_request_id(request), path=path, request_headers=request.headers,
                      tenant=caller.tenant)
        self.tracing.begin(ex)
        snapshot = self.runtime.snapshot  # this request's config, whatever reloads happen meanwhile
        lane: LaneRuntime | None = None
        parsed: Parsed | None = None
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                if parsed is not None and parsed.pending is not None and self.memo is not None \
                        and 200 <= ex.status < 300 and ex.error_code is None:
                    # Only an answered body: its messages count as checked next time. After the
                    # answer is written (the wire path writes it before this callback runs).
                    asyncio.get_running_loop().call_soon(self.memo.settle, parsed)
                if lane is not None:
                    lane.inflight -= 1
                self.runtime.finish(ex, lane)

        try:
            body = await self._read_body(request, snapshot.config.gateway.max_request_bytes)
            ex.body_bytes = len(body)
            _check_members(body, snapshot.config.gateway.max_json_members)
            parsed = ex.history = self._parse(body, history)
            data = parsed.data
            model = data.get("model")
            if not isinstance(model, str) or not model:
                raise invalid_request("'model' is required and must be a string", param="model",
                                      code="missing_required_parameter" if model is None else "invalid_type")
            ex.public_model = model
            if parsed.known:
                check_chat(data, known=parsed.known)  # the history was checked in an earlier turn
            else:
                check(data)
            ex.stream = bool(data.get("stream"))
            ex.body = data
            primary = snapshot.resolve(model)
            if primary is None:
                raise GatewayError(404, f"The model '{model[:200]}' does not exist or you do not have access to it.",
                                   param="model", code="model_not_found")
            ex.lane = primary.name  # a refusal is the primary lane's
            lane = await choose_lane(ex, snapshot, primary, self.gates)  # runs the gates; may pick a fallback
            lane.inflight += 1
            ex.lane = lane.name
            if path == passthrough.RESPONSES:
                passthrough.map_responses_effort(data, lane.config)
            if path == messages_chat.COUNT_PATH and lane.config.engine != "vllm":
                # The engine cannot count a Messages request: the gateway renders it as vLLM would read it.
                answer = Answer.json(200, orjson.dumps({"input_tokens": await _count_messages(lane, data, model)}))
                ex.status = 200
                ex.response_bytes = len(answer.body)
            else:
                policies = self.policies if path in passthrough.POLICED else ()
                kept: dict[str, str] = {}  # response headers of the lane-independent steps
                try:
                    await _police(ex, lane, data, policies, kept)
                except Reroute as to:
                    rerouted = await self._reroute(ex, lane, to, snapshot, kept)
                    lane.inflight -= 1
                    ex, lane = rerouted
                    lane.inflight += 1
                    data = orjson.loads(body)  # the body as the client sent it: the first lane's steps changed it
                    parsed = ex.history = Parsed(data)
                    ex.body = data
                    if path == passthrough.RESPONSES:
                        passthrough.map_responses_effort(data, lane.config)
                    await _police(ex, lane, data, [p for p in policies if p.per_lane], None)
                if path == messages_chat.PATH and lane.config.engine != "vllm":
                    # The engine has no Messages API: it gets the chat completion vLLM would make of it.
                    if ex.mapped_chat is None:
                        raise invalid_request(ex.analysis_skipped or "the request could not be read as chat messages",
                                              code="invalid_value")
                    ex.upstream_path = messages_from_chat.CHAT_PATH
                    data = ex.mapped_chat
                upstream_body = ex.forwarded = self._upstream_body(ex, lane, data, parsed)
                link = self.link_of(request)
                hold.release()  # waiting for the engine needs no CPU
                answer = await forward(ex, lane, ex.upstream_path or path, upstream_body, link)
                if path in messages_chat.PATHS and answer.status >= 400:
                    answer = _anthropic_error(answer)
        except GatewayError as exc:
            ex.fail(exc.status, exc.code, exc.message)
            body_bytes = (AnthropicError.of(exc) if path in messages_chat.PATHS else exc).json_bytes()
            answer = Answer.json(exc.status, body_bytes, exc.headers)
            ex.response_bytes = len(answer.body)
        except (ClientGone, ClientDisconnect):
            ex.cancelled = True
            ex.fail(499, "client_disconnected", "the client went away before the answer")
            answer = Answer(499, [])
        except Exception:
            log.exception("request %s failed inside the gateway", ex.request_id)
            ex.fail(500, "internal_error", "internal gateway error")
            err = GatewayError(500, "The gateway failed to handle this request; it has been logged.",
                               code="internal_error")
            answer = Answer.json(500, err.json_bytes())
        ours = [("X-Request-Id", ex.request_id)]
        for k, v in ex.response_headers.items():
            value = safe_value(k, v)
            if value is not None:
                ours.append((k, value))
        answer.set_headers(ours)
        answer.end = end  # the front end closes the answer once written: the exchange ends there, once
        return answer

    async def _reroute(self, ex: Exchange, lane: LaneRuntime, to: Reroute, snapshot: Snapshot,
                       kept: dict[str, str]) -> tuple[Exchange, LaneRuntime]:
        """The exchange and lane that serve a request a policy handed to another lane: that lane's gates
        run; when it is gone (a reload) or a gate refuses it, the deciding policy's refusal is the answer."""
        target = snapshot.lanes.get(to.lane)
        if target is None:
            raise to.refusal
        fresh = ex.rerouted(target.name, kept)
        try:
            for gate in self.gates:
                await gate(fresh, target)
        except GatewayError:
            raise to.refusal from None
        announce(fresh, lane, target, to.reason, moves_cache=False)
        fresh.admission = to.note
        return fresh, target

    async def _read_body(self, request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                if int(declared) > limit:
                    raise _too_large(limit)
            except ValueError:
                raise invalid_request("invalid Content-Length header") from None
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, body: bytes, history: bool) -> Parsed:
        if not body:
            raise invalid_request("the request body is empty; expected a JSON object", code="invalid_json")
        try:
            parsed = self.memo.parse(body) if history and self.memo is not None else Parsed(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            raise invalid_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(parsed.data, dict):
            raise invalid_request("the request body must be a JSON object", code="invalid_json")
        return parsed

    def _upstream_body(self, ex: Exchange, lane: LaneRuntime, data: dict[str, Any], parsed: Parsed) -> Body:
        out = dict(data)
        out["model"] = lane.config.upstream_model
        for name in _GATEWAY_ONLY_FIELDS:
            out.pop(name, None)
        if ex.stream and (ex.upstream_path or ex.path) in passthrough.STREAM_OPTIONS:
            so = dict(out.get("stream_options") or {})
            ex.client_wants_usage = bool(so.get("include_usage"))
            # Always ask for usage: the cached-token count lives there.
            so["include_usage"] = True
            out["stream_options"] = so
        token_ids.ask(ex, lane.config, out)  # ask the engine for the token ids (token_ids.py)
        try:
            # Messages untouched by every policy: the client's own bytes of them (no re-serialising).
            return HistoryMemo.forward_body(parsed, out) or orjson.dumps(out)
        except TypeError:  # orjson.JSONEncodeError: it reads deeper nesting than it writes
            raise invalid_request("the request body is nested too deeply to forward", code="invalid_json") from None


MIN_MEMBER_BYTES = 5  # `"":0,`


def _check_members(body: bytes, limit: int) -> None:
    """A large body is refused before it is parsed when it holds more object members than `limit`:
    parsing holds the event loop, every stream with it, for each member it builds. Every member has a
    colon and takes five bytes at least (`"":0,`), so a body shorter than that or with fewer colons
    passes at the cost of one byte count; past that, members are counted as `":` outside escaped
    strings (every serializer writes a key's quote and its colon together; text quoting JSON writes
    `\\":`): a scan of the bytes, no parse."""
    if len(body) < MIN_MEMBER_BYTES * limit or body.count(b":") <= limit:
        return
    members = body.count(b'":') - body.count(b'\\":')
    if members > limit:
        raise invalid_request(f"the request body holds about {members:,} JSON object members, more than the "
                              f"gateway's limit of {limit:,} (gateway.max_json_members)", code="too_many_members")


def _too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"the request body exceeds the limit of {limit} bytes", code="request_too_large")


async def _police(ex: Exchange, lane: LaneRuntime, data: dict[str, Any], policies: Sequence[Policy],
                  kept: dict[str, str] | None) -> None:
    """Runs the policies in order; `kept` gets the response headers as they were before the first
    per-lane policy (what a rerouted exchange carries over)."""
    for policy in policies:
        if kept is not None and policy.per_lane:
            kept.update(ex.response_headers)
            kept = None
        await policy.apply(ex, lane, data)


def _request_id(request: Request) -> str:
    rid = request.headers.get("x-request-id")
    if rid and len(rid) <= 128 and rid.isascii() and rid.isprintable():
        return rid
    return "gw-" + os.urandom(16).hex()  # 128 random bits, as uuid4, without making a UUID


async def _count_messages(lane: LaneRuntime, body: dict[str, Any], model: str) -> int:
    """A count_tokens request's prompt tokens, from the lane's own render of the chat request vLLM makes
    of it (exact where the lane has a template; a lane without one cannot count)."""
    renderer = lane.renderer
    if renderer is None:
        raise GatewayError(400, f"The model '{model[:200]}' is served by a {lane.config.engine} lane without a chat "
                           "template: the gateway cannot count its tokens", param="model", code="unsupported_api")
    view = messages_chat.chat_view(body)
    if view.body is None:
        raise invalid_request(view.unmapped or "the request could not be read as chat messages", code="invalid_value")
    chat = view.body

    def count() -> int:
        return renderer.render(chat, options_for_request(chat, renderer.defaults)).n_tokens

    try:
        return await asyncio.to_thread(count)
    except RenderError as exc:
        raise invalid_request(f"the request cannot be rendered: {exc}", code="invalid_value") from None


def _anthropic_error(answer: Answer) -> Answer:
    """An error the relay shaped as OpenAI's, in Anthropic's shape for a Messages client."""
    try:
        message = str(orjson.loads(answer.body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return answer
    answer.body = orjson.dumps(anthropic_body(answer.status, message))
    return answer
