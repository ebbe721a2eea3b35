"""The emulator's HTTP side: the aiohttp handlers and the admin endpoints, what a request is refused
before it generates, its prefill on the prefix cache and the faults injected before its first byte.

An accepted chat or completion request becomes a `Job` (job.py), which paces its answer; the engine's
shared state (config, prefix cache, stats, tokenizers) stays here, in `Emulator`.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
import xxhash
from aiohttp import web

from . import messages as em
from . import passthrough as ep
from ..pipeline.messages_chat import chat_body as messages_chat_body
from . import shapes
from .cache import PrefixCache, salt_seed, token_bytes
from .config import EmulatorConfig
from .generation import Plan, plan_chat, plan_completion, requested_max_tokens
from .job import Job, computed
from .responses import anthropic_error, error, json_response
from .stats import RequestRecord, Stats
from .tokens import (Detokenize, TokenizeGenerated, TokenizePrompt, count_images, detokenizer_for,
                     placeholder_detokenize, tokenizers_for, words)

if TYPE_CHECKING:
    from .kvevents import KVEventPublisher

_MAX_BODY = 512 * 1024 * 1024  # agent conversations reach several MB; never 413 like aiohttp's 1 MB default


EMULATOR_KEY: web.AppKey[Emulator] = web.AppKey("emulator")


class _Rejected(Exception):
    """A request the engine refuses before generating: carries the ready response."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


class Emulator:
    """State of one emulated engine (config, prefix cache, stats) plus its request handlers."""

    def __init__(
        self,
        config: EmulatorConfig | None = None,
        *,
        tokenize_prompt: TokenizePrompt | None = None,
        tokenize_generated: TokenizeGenerated | None = None,
    ) -> None:
        self.config = config or EmulatorConfig()
        self.config.validate()
        self._initial = self.config
        default_prompt, default_generated = (
            (None, None)
            if tokenize_prompt and tokenize_generated
            else tokenizers_for(self.config.tokenizer, lambda: self.config.default_thinking, self.config.flavour)
        )
        self._injected = bool(tokenize_prompt and tokenize_generated)
        self.tokenize_prompt: TokenizePrompt = tokenize_prompt or default_prompt  # type: ignore[assignment]
        self.tokenize_generated: TokenizeGenerated = tokenize_generated or default_generated  # type: ignore[assignment]
        self.detokenize_ids: Detokenize = placeholder_detokenize if self._injected \
            else detokenizer_for(self.config.tokenizer)
        self.cache = PrefixCache(self.config.eff_block_size, self.config.cache_blocks)
        self._prefill_free_at = 0.0  # prefill_shared: when the shared prefill compute is free again
        self.stats = Stats(self.config.recent_requests)
        self._fail_rng = random.Random(self.config.seed)
        self.kv_publisher: KVEventPublisher | None = None  # with kv_events_port, from start-up (kvevents.py)

    # -- app ---------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY)
        r = app.router
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)  # SGLang's deeper probe
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/v1/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/v1/responses", self.responses)
        r.add_post("/v1/messages", self.messages)
        r.add_post("/v1/messages/count_tokens", self.count_tokens)
        r.add_post("/v1/embeddings", self.embeddings)
        r.add_get("/emulator/stats", self.get_stats)
        r.add_post("/emulator/reset", self.reset)
        r.add_get("/emulator/config", self.get_config)
        r.add_post("/emulator/config", self.post_config)
        app[EMULATOR_KEY] = self
        app.on_startup.append(self._start_kv_events)
        app.on_cleanup.append(self._stop_kv_events)
        return app

    # -- KV-cache events (kvevents.py) ------------------------------------------------------------------
    async def _start_kv_events(self, app: web.Application) -> None:
        cfg = self.config
        self.kv_publisher = None
        if cfg.kv_events_port:
            from .kvevents import KVEventPublisher

            self.kv_publisher = KVEventPublisher(cfg.kv_events_host, cfg.kv_events_port, cfg.kv_events_replay_port,
                                                 cfg.kv_events_topic)
            self.kv_publisher.start()
            self.cache.listener = self.kv_publisher.publish

    async def _stop_kv_events(self, app: web.Application) -> None:
        if self.kv_publisher is not None:
            await self.kv_publisher.close()

    def set_config(self, config: EmulatorConfig) -> None:
        config.validate()
        old = self.config
        hooks, detokenize = None, self.detokenize_ids
        if config.tokenizer != old.tokenizer and not self._injected:
            # Built before anything changes: an ImportError leaves the old config in place.
            hooks = tokenizers_for(config.tokenizer, lambda: self.config.default_thinking, config.flavour)
            detokenize = detokenizer_for(config.tokenizer)
        self.config = config
        if config.eff_block_size != old.eff_block_size:
            listener = self.cache.listener
            if listener is not None:
                self.cache.clear()  # subscribers hear AllBlocksCleared: old hashes mean nothing now
            self.cache = PrefixCache(config.eff_block_size, config.cache_blocks)
            self.cache.listener = listener
        elif config.cache_blocks != old.cache_blocks:
            self.cache.resize(config.cache_blocks)
        if config.recent_requests != old.recent_requests:
            self.stats.recent = type(self.stats.recent)(self.stats.recent, maxlen=config.recent_requests)
        if config.seed != old.seed:
            self._fail_rng = random.Random(config.seed)
        if hooks is not None:
            self.tokenize_prompt, self.tokenize_generated = hooks
            self.detokenize_ids = detokenize
            self.cache.clear()  # token ids of the other tokenizer never match again

    def cache_json(self) -> dict[str, Any]:
        c = self.cache
        return {
            "block_size": c.block_size, "blocks_used": c.used_blocks, "capacity_blocks": c.capacity,
            "evictions": c.evictions,
        }

    # -- admin endpoints ---------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)  # both engines answer an empty 200

    async def models(self, request: web.Request) -> web.Response:
        c = self.config
        return json_response(shapes.models_body(c.flavour, c.model, c.eff_model_root, c.max_model_len))

    async def get_stats(self, request: web.Request) -> web.Response:
        return json_response(self.stats.to_json(self.cache_json()))

    async def reset(self, request: web.Request) -> web.Response:
        if request.query.get("config") in ("1", "true"):
            self.set_config(self._initial)
        self.cache.clear()
        self.stats.reset(self.config.recent_requests)
        self._fail_rng = random.Random(self.config.seed)
        return json_response({"ok": True, "config": self.config.to_dict()})

    async def get_config(self, request: web.Request) -> web.Response:
        return json_response(self.config.to_dict())

    async def post_config(self, request: web.Request) -> web.Response:
        try:
            self.set_config(self.config.merged(orjson.loads(await request.read() or b"{}")))
        except (ValueError, ImportError, orjson.JSONDecodeError) as exc:
            return json_response({"error": {"message": str(exc), "type": "emulator_config_error"}}, 400)
        return json_response(self.config.to_dict())

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            ids = self.tokenize_prompt(body)
        except ValueError as exc:  # orjson.JSONDecodeError and template refusals are ValueErrors
            return error(self.config, 400, str(exc), "BadRequestError")
        return json_response({"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids,
                              "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read() or b"{}")
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
                raise ValueError("tokens must be a list of integers")
        except ValueError as exc:
            return error(self.config, 400, str(exc), "BadRequestError")
        try:
            text = self.detokenize_ids(tokens)
        except (ValueError, OverflowError, TypeError, IndexError) as exc:  # ids the vocabulary does not have
            return error(self.config, 400, f"tokens: {exc}", "BadRequestError")
        return json_response({"prompt": text})

    async def embeddings(self, request: web.Request) -> web.Response:
        cfg = self.config
        try:
            body = orjson.loads(await request.read() or b"{}")
            if not isinstance(body, dict) or body.get("input") in (None, "", []):
                raise ValueError("input is required")
            dims = body.get("dimensions")
            if dims is not None and not (type(dims) is int and 1 <= dims <= 4096):
                raise ValueError("dimensions must be an integer 1-4096")  # (vLLM: only what the model has)
            out = ep.embeddings_body(body, str(body.get("model") or cfg.model), 64,
                                     lambda item: len(item) if isinstance(item, list) else len(words(item)))
        except (ValueError, TypeError) as exc:
            return error(cfg, 400, str(exc), "BadRequestError")
        self.stats.prompt_tokens += out["usage"]["prompt_tokens"]
        return json_response(out)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """/v1/responses through the chat machinery (see emulator/passthrough.py)."""
        cfg = self.config
        raw = await request.read()
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("Request body must be a JSON object")
        except ValueError as exc:
            return error(cfg, 400, str(exc), "Bad Request")
        rec = RequestRecord(request.headers.get("X-Request-Id") or uuid.uuid4().hex, request.path,
                            {k.lower(): v for k, v in request.headers.items()}, body, len(raw))
        self.stats.begin(rec)
        try:
            chat = ep.chat_body_of(body)
            try:
                prompt = self.tokenize_prompt(chat)
            except (ValueError, TypeError, AttributeError) as exc:  # what the template refuses
                self.stats.error(rec, "rejected", 400)
                return error(cfg, 400, str(exc), "BadRequestError")
            try:
                self._check_context(chat, cfg, len(prompt))  # max_output_tokens beyond the window: a 400
            except _Rejected as rej:
                self.stats.error(rec, "rejected", rej.response.status)
                return rej.response
            data, seed, hashes, cached, plan = self._prefill_chat(chat, prompt, rec)
            model = str(body.get("model") or cfg.model)
            b = ep.ResponseBuilder(body, model, plan.reasoning, plan.content, plan.tool_call, plan.finish_reason)
            usage = ep.response_usage(len(prompt), cached, len(plan.reasoning), plan.completion_tokens)
            ttft = cfg.ttft_ms / 1000.0 + self._prefill_s(len(prompt) - cached, cfg)
            await asyncio.sleep(ttft)
            if not body.get("stream"):
                if cfg.decode_tps > 0 and plan.completion_tokens > 1:
                    await asyncio.sleep((plan.completion_tokens - 1) / cfg.decode_tps)
                self._remember_response(chat, plan, data, hashes, seed)
                rec.done, rec.stage = True, "done"
                return json_response(b.response(b.final_status(), usage))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)
            gap = 1.0 / cfg.decode_tps if cfg.decode_tps > 0 else 0.0
            await resp.write(b"".join(b.head_events()))
            index = 0
            if plan.reasoning:
                await resp.write(b"".join(b.reasoning_open()))
                for piece in plan.reasoning:
                    await resp.write(b.reasoning_delta(piece))
                    if gap:
                        await asyncio.sleep(gap)
                await resp.write(b"".join(b.reasoning_done()))
                index = 1
            if plan.tool_call is not None:
                await resp.write(b"".join(b.tool_events(index)))
            else:
                await resp.write(b"".join(b.message_open(index)))
                for piece in plan.content:
                    await resp.write(b.text_delta(index, piece))
                    rec.chunks_sent += 1
                    if gap:
                        await asyncio.sleep(gap)
                await resp.write(b"".join(b.message_close(index)))
            self._remember_response(chat, plan, data, hashes, seed)
            await resp.write(b"".join(b.tail_events(usage)))
            await resp.write_eof()
            rec.done, rec.stage = True, "done"
            return resp
        except asyncio.CancelledError:
            self.stats.cancel(rec)
            raise
        finally:
            self.stats.end(rec)

    def _computed(self, gen: list[int], plan: Plan, chat: bool = True) -> list[int]:
        """See `computed`: the built-in tokenizers close a chat message with its end token, which an
        answer cut at max_tokens never sampled (injected tokenizers render the text alone)."""
        return computed(gen, chat and plan.finish_reason == "length" and not self._injected, plan.completion_tokens)

    def _prefill_chat(self, chat: dict[str, Any], prompt: list[int], rec: RequestRecord,
                      ) -> tuple[bytes, int, list[int], int, Plan]:
        """A chat-shaped request's prefill on the prefix cache, counted, and its answer's plan (the
        Responses and Messages APIs: both are served through chat)."""
        data = token_bytes(prompt)
        seed = salt_seed(None)
        hashes = self.cache.hashes(data, seed)
        cached = self.cache.cached_tokens(self.cache.match(data, hashes, seed), len(prompt))
        self.cache.insert(data, hashes, seed)
        rec.prompt_tokens, rec.cached_tokens = len(prompt), cached
        self.stats.prompt_tokens += len(prompt)
        self.stats.cached_tokens += cached
        plan = plan_chat(chat, xxhash.xxh3_64_intdigest(data), self.config)
        rec.completion_tokens = plan.completion_tokens
        return data, seed, hashes, cached, plan

    async def _messages_body(self, request: web.Request) -> tuple[dict[str, Any], bytes] | web.Response:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise ValueError("Request body must be a JSON object with messages")
        except ValueError as exc:
            return anthropic_error(400, str(exc))
        return body, raw

    async def count_tokens(self, request: web.Request) -> web.Response:
        got = await self._messages_body(request)
        if isinstance(got, web.Response):
            return got
        try:
            prompt = self.tokenize_prompt(messages_chat_body(got[0]))
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            return anthropic_error(400, str(exc))
        return json_response({"input_tokens": len(prompt)})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """/v1/messages as vLLM serves it: translated to chat (gateway/pipeline/messages_chat.py), answered
        from the chat plan, cached like a chat turn."""
        cfg = self.config
        got = await self._messages_body(request)
        if isinstance(got, web.Response):
            return got
        body, raw = got
        rec = RequestRecord(request.headers.get("X-Request-Id") or uuid.uuid4().hex, request.path,
                            {k.lower(): v for k, v in request.headers.items()}, body, len(raw))
        self.stats.begin(rec)
        try:
            try:
                chat = messages_chat_body(body)
                prompt = self.tokenize_prompt(chat)
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                self.stats.error(rec, "rejected", 400)
                return anthropic_error(400, str(exc))
            data, seed, hashes, cached, plan = self._prefill_chat(chat, prompt, rec)
            model = str(body.get("model") or cfg.model)
            use = em.usage(len(prompt), cached, plan.completion_tokens)
            await asyncio.sleep(cfg.ttft_ms / 1000.0 + self._prefill_s(len(prompt) - cached, cfg))

            def remember() -> None:
                self._remember(chat, em.sent_back(plan), plan, data, hashes, seed)

            if not body.get("stream"):
                remember()
                rec.done, rec.stage = True, "done"
                return json_response(em.message(model, plan, use))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)
            gap = 1.0 / cfg.decode_tps if cfg.decode_tps > 0 else 0.0
            await resp.write(em.head(model, use))
            for events in em.block_events(plan):
                for event in events:
                    await resp.write(event)
                    rec.chunks_sent += 1
                    if gap:
                        await asyncio.sleep(gap)
            remember()
            await resp.write(em.tail(plan, use))
            await resp.write_eof()
            rec.done, rec.stage = True, "done"
            return resp
        except asyncio.CancelledError:
            self.stats.cancel(rec)
            raise
        finally:
            self.stats.end(rec)

    # -- generation endpoints ----------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completion")

    async def _handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        raw = await request.read()
        cfg = self.config
        patch = request.headers.get("X-Emulator-Config")
        if patch:
            try:
                cfg = cfg.merged(orjson.loads(patch))
            except (ValueError, orjson.JSONDecodeError) as exc:
                return json_response({"error": {"message": f"X-Emulator-Config: {exc}",
                                                "type": "emulator_config_error"}}, 400)
        decode_error = "body is null"
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            body = None
            decode_error = str(exc)
        rid = request.headers.get("X-Request-Id") or (
            str(body.get("request_id") or body.get("rid") or "") if isinstance(body, dict) else ""
        )
        headers = {k.lower(): v for k, v in request.headers.items()}  # plain lowercase str keys
        rec = RequestRecord(rid or uuid.uuid4().hex, request.path, headers, body, len(raw))
        self.stats.begin(rec)
        try:
            if not isinstance(body, dict):
                msg = f"JSON decode error: {decode_error}" if body is None else "Request body must be a JSON object"
                self.stats.error(rec, "bad_request", 400)
                return error(cfg, 400, msg, "Bad Request")
            return await self._serve(request, body, cfg, rec, kind, bool(rid))
        except _Rejected as rej:
            self.stats.error(rec, "rejected", rej.response.status)
            return rej.response
        except asyncio.CancelledError:  # aiohttp cancels the handler when the client goes away
            self.stats.cancel(rec)
            raise
        except ConnectionError:  # a write lost the race with that cancellation
            self.stats.cancel(rec)
            return web.Response(status=499)  # never delivered; aiohttp drops it quietly
        finally:
            self.stats.end(rec)

    def _validate(self, body: dict[str, Any], cfg: EmulatorConfig, kind: str) -> None:
        fl = cfg.flavour
        if cfg.strict_model and body.get("model") not in (None, cfg.model):
            raise _Rejected(error(cfg, 404, f"The model `{body.get('model')}` does not exist.", "NotFoundError",
                                  "model"))
        if kind == "chat" and not isinstance(body.get("messages"), list):
            msg = "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}"
            raise _Rejected(error(cfg, 400, msg, "Bad Request"))
        if fl == "vllm" and body.get("stream_options") is not None and not body.get("stream"):
            msg = (
                "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, Stream options "
                "can only be defined when `stream=True`.'}"
            )
            raise _Rejected(error(cfg, 400, msg, "Bad Request"))
        if cfg.max_images is not None and kind == "chat":
            n = count_images(body)
            if n > cfg.max_images:
                if fl == "sglang":
                    msg = f"Image count {n} exceeds limit {cfg.max_images} per request."
                    raise _Rejected(error(cfg, 400, msg, "BadRequestError"))
                msg = (
                    f"At most {cfg.max_images} image(s) may be provided in one prompt. "
                    "Set `--limit-mm-per-prompt` to increase this limit. (parameter=image)"
                )
                raise _Rejected(error(cfg, 400, msg, "BadRequestError", "image"))
        top = body.get("top_logprobs") if kind == "chat" else body.get("logprobs")
        if isinstance(top, int) and not isinstance(top, bool) and top > cfg.eff_max_top_logprobs:
            limit = cfg.eff_max_top_logprobs
            if fl == "sglang":
                raise _Rejected(error(cfg, 400, f"top_logprobs_num must be in [0, {limit}], got {top}",
                                      "BadRequestError"))
            msg = (f"Requested sample logprobs of {top}, which is greater than max allowed: {limit} "
                   f"(parameter=logprobs, value={top})")
            raise _Rejected(error(cfg, 400, msg, "BadRequestError", "logprobs"))

    def _check_context(self, body: dict[str, Any], cfg: EmulatorConfig, n_prompt: int) -> None:
        limit = cfg.max_model_len
        max_tokens = requested_max_tokens(body)
        sglang = cfg.flavour == "sglang"
        if n_prompt >= limit:
            if sglang:
                msg = f"The input ({n_prompt} tokens) is longer than the model's context length ({limit} tokens)."
                raise _Rejected(error(cfg, 400, msg, "BadRequestError"))
            out = max_tokens or 0
            msg = (
                f"This model's maximum context length is {limit} tokens. However, you requested {out} output tokens "
                f"and your prompt contains at least {n_prompt} input tokens, for a total of at least "
                f"{n_prompt + out} tokens. Please reduce the length of the input prompt or the number of requested "
                f"output tokens. (parameter=input_tokens, value={n_prompt})"
            )
            raise _Rejected(error(cfg, 400, msg, "BadRequestError", "input_tokens"))
        # SGLang refuses input + max_new_tokens >= context length; vLLM only when it exceeds it.
        if max_tokens is not None and n_prompt + max_tokens >= limit + (0 if sglang else 1):
            if sglang:
                msg = (
                    f"Requested token count exceeds the model's maximum context length of {limit} tokens. "
                    f"You requested a total of {n_prompt + max_tokens} tokens: {n_prompt} tokens from the input "
                    f"messages and {max_tokens} tokens for the completion. Please reduce the number of tokens in the "
                    "input messages or the completion to fit within the limit."
                )
                raise _Rejected(error(cfg, 400, msg, "BadRequestError"))
            param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
            msg = (
                f"'{param}' is too large: {max_tokens}. This model's maximum context length is {limit} tokens and "
                f"your request has {n_prompt} input tokens ({max_tokens} > {limit} - {n_prompt}). "
                f"(parameter={param}, value={max_tokens})"
            )
            raise _Rejected(error(cfg, 400, msg, "BadRequestError", param))

    async def _serve(
        self, request: web.Request, body: dict[str, Any], cfg: EmulatorConfig, rec: RequestRecord, kind: str,
        client_id: bool,
    ) -> web.StreamResponse:
        if cfg.stall_before_first_byte_s > 0:
            rec.stage = "stalled_before_first_byte"
            await asyncio.sleep(cfg.stall_before_first_byte_s)
        self._validate(body, cfg, kind)
        try:
            prompt = self.tokenize_prompt(body)
        except ValueError as exc:  # the chat template refused the request (e.g. a bad effort value)
            raise _Rejected(error(cfg, 400, str(exc), "BadRequestError")) from None
        n_prompt = len(prompt)
        rec.prompt_tokens = n_prompt
        self._check_context(body, cfg, n_prompt)
        if cfg.fail_rate > 0 and self._fail_rng.random() < cfg.fail_rate:
            self.stats.error(rec, "injected_500", 500)
            return error(cfg, 500, "Emulated engine failure (fail_rate)", "InternalServerError")

        cache = self.cache
        seed = salt_seed(body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None)
        data = token_bytes(prompt)
        hashes = cache.hashes(data, seed)
        cached = cache.cached_tokens(cache.match(data, hashes, seed), n_prompt)
        rec.cached_tokens = cached
        self.stats.prompt_tokens += n_prompt
        self.stats.cached_tokens += cached

        digest = xxhash.xxh3_64_intdigest(data)
        plan = plan_chat(body, digest, cfg) if kind == "chat" else plan_completion(body, digest, cfg)
        n_choices = n if kind == "chat" and type(n := body.get("n")) is int and n > 1 else 1
        extra = [plan_chat(body, digest, cfg, i) for i in range(1, min(n_choices, 16))]
        rec.completion_tokens = plan.completion_tokens + sum(p.completion_tokens for p in extra)
        ttft = cfg.ttft_ms / 1000.0 + self._prefill_s(n_prompt - cached, cfg)
        job = Job(self, body, cfg, rec, kind, prompt, data, hashes, seed, cached, plan)
        job.extra = extra
        job.rid = shapes.response_id(cfg.flavour, kind, rec.request_id if client_id else None)
        t_start = time.monotonic()
        if body.get("stream"):
            return await job.stream(request, t_start + ttft)
        return await job.respond(request, t_start + ttft)

    def _prefill_s(self, uncached: int, cfg: Any) -> float:
        """Seconds until this request's prefill is done: its own at prefill_tps, or, with prefill_shared,
        after the prefills of the requests before it."""
        if cfg.prefill_tps <= 0:
            return 0.0
        own = uncached / cfg.prefill_tps
        if not cfg.prefill_shared:
            return own
        now = time.monotonic()
        self._prefill_free_at = max(now, self._prefill_free_at) + own
        return self._prefill_free_at - now

    def _remember(self, body: dict[str, Any], message: dict[str, Any], plan: Plan, data: bytes, hashes: list[int],
                  seed: int, chat: bool = True) -> None:
        """Cache prompt + generated tokens (vLLM caches what it generated) as the client's next turn will
        render `message`, the answer as it sends it back."""
        gen = self._computed(self.tokenize_generated(body, message), plan, chat)
        if gen:
            full = data + token_bytes(gen)
            self.cache.insert(full, self.cache.hashes(full, seed, known=hashes), seed)

    def _remember_response(self, chat: dict[str, Any], plan: Plan, data: bytes, hashes: list[int], seed: int) -> None:
        """/v1/responses: as the output items carry the answer back (ResponseBuilder sends no message item
        beside a tool call)."""
        msg = plan.assistant_message()
        if plan.tool_call is not None:
            msg["content"] = ""
        self._remember(chat, msg, plan, data, hashes, seed)

    def remember_output(self, job: Job) -> None:
        """Chat and completions: as an append-only client renders the answer in its next turn."""
        self._remember(job.body, job.plan.assistant_message(), job.plan, job.data, job.hashes, job.seed,
                       chat=job.kind == "chat")


def create_app(
    config: EmulatorConfig | None = None,
    *,
    tokenize_prompt: TokenizePrompt | None = None,
    tokenize_generated: TokenizeGenerated | None = None,
) -> web.Application:
    return Emulator(config, tokenize_prompt=tokenize_prompt, tokenize_generated=tokenize_generated).app()
