"""One accepted generation request, from its prefill to its last byte: the plan answered as one body or
as a stream paced at the decode rate, with the faults injected mid-generation (a stall, an error
event, a cut connection), and the tokens of its answer whose KV the engine computed.

A job holds that one request's state only. What requests share (the prefix cache, the stats, the
tokenizers) stays with the `Emulator` (server.py), which the job reaches through `_Engine`: the few
members it uses, so that this module need not import the server that creates its jobs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import orjson
from aiohttp import web

from . import shapes
from .cache import PrefixCache
from .config import EmulatorConfig
from .generation import Plan
from .responses import error, json_response
from .stats import RequestRecord, Stats
from .tokens import TokenizeGenerated


def computed(gen: list[int], unsampled_end: bool, sampled: int | None = None) -> list[int]:
    """The generated tokens whose KV the engine computed: all but the last one, which is sampled and
    never fed back (vLLM and SGLang hold prompt + completion - 1 tokens). `gen` is the output as the
    next turn renders it; when it ends with an end token that was never sampled (`unsampled_end`: an
    answer cut at max_tokens), the engine holds `sampled - 1` of them, `sampled` being the completion
    tokens it reports (its text may render to another count), and never the end token."""
    if not unsampled_end:
        return gen[:-1]
    n = len(gen) - 2 if sampled is None else min(len(gen) - 1, sampled - 1)
    return gen[:max(0, n)]


class _Engine(Protocol):
    """What a job uses of the engine that accepted it (server.py's `Emulator`)."""

    cache: PrefixCache
    stats: Stats
    tokenize_generated: TokenizeGenerated

    def remember_output(self, job: Job) -> None: ...


class Job:
    """One accepted generation request: emits the plan as a stream or a single body."""

    def __init__(
        self, emu: _Engine, body: dict[str, Any], cfg: EmulatorConfig, rec: RequestRecord, kind: str,
        prompt: list[int], data: bytes, hashes: list[int], seed: int, cached: int, plan: Plan,
    ) -> None:
        self.emu, self.body, self.cfg, self.rec, self.kind = emu, body, cfg, rec, kind
        self.prompt, self.data, self.hashes = prompt, data, hashes
        self.seed, self.cached, self.plan = seed, cached, plan
        self.extra: list[Plan] = []  # choices 1.. of n > 1
        top = body.get("top_logprobs")
        self.logprobs = (int(top) if type(top) is int and top > 0 else 0) if body.get("logprobs") is True else None
        self.rid = ""
        self.created = int(time.time())
        self.model = str(body.get("model") or cfg.model)

    def _usage(self, full: bool) -> dict[str, Any]:
        cfg, plan = self.cfg, self.plan
        reasoning = len(plan.reasoning) + sum(len(p.reasoning) for p in self.extra) if self.kind == "chat" else None
        completion = plan.completion_tokens + sum(p.completion_tokens for p in self.extra)
        return shapes.usage(
            cfg.flavour, len(self.prompt), completion, self.cached, reasoning, report=cfg.cache_report, full=full
        )

    def _prefilled(self) -> None:
        self.emu.cache.insert(self.data, self.hashes, self.seed)
        self.rec.stage = "decode"

    # -- non-streaming -----------------------------------------------------------------------------
    async def respond(self, request: web.Request, t_first: float) -> web.StreamResponse:
        cfg, rec, plan = self.cfg, self.rec, self.plan
        rec.stage = "prefill"
        await _sleep_until(t_first)
        self._prefilled()
        n = plan.completion_tokens
        wait = (n - 1) / cfg.decode_tps if cfg.decode_tps > 0 and n > 1 else 0.0
        if cfg.stall_after_chunks is not None and cfg.stall_after_chunks <= n:
            wait += cfg.stall_s
        if wait:
            await asyncio.sleep(wait)
        if cfg.die_after_chunks is not None:
            return self._die(request, web.Response(status=200))
        if cfg.error_after_chunks is not None:
            self.emu.stats.error(rec, "injected_midstream", 500)
            return error(cfg, 500, "Emulated engine failure during generation (error_after_chunks)",
                         "InternalServerError")
        self.emu.remember_output(self)
        if self.kind == "chat":
            out = shapes.chat_response(cfg.flavour, self.rid, self.created, self.model, plan, cfg.eff_reasoning_field,
                                       self._usage(True))
            for i, p in enumerate(self.extra, 1):
                more = shapes.chat_response(cfg.flavour, self.rid, self.created, self.model, p,
                                            cfg.eff_reasoning_field, {})
                out["choices"].append({**more["choices"][0], "index": i})
            if shapes.wants_token_ids(cfg.flavour, self.body):  # vLLM return_token_ids
                out["prompt_token_ids"] = list(self.prompt)
                out["choices"][0]["token_ids"] = list(self.emu.tokenize_generated(self.body, plan.assistant_message()))
            if self.logprobs is not None:
                for c, p in zip(out["choices"], [plan, *self.extra]):
                    c["logprobs"] = {"content": [shapes.logprob(t, self.logprobs) for t in p.content]}
        else:
            out = shapes.completion_response(cfg.flavour, self.rid, self.created, self.model, plan, self._usage(True))
        rec.done = True
        rec.stage = "done"
        return json_response(out, headers={"X-Request-Id": rec.request_id})

    # -- streaming ---------------------------------------------------------------------------------
    def _events(self) -> tuple[list[bytes], list[int]]:
        """All data events of the stream and the token slot each is due at (pacing index)."""
        cfg, plan = self.cfg, self.plan
        events: list[bytes] = []
        slots: list[int] = []
        opts = self.body.get("stream_options") or {}
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        continuous = cfg.flavour == "vllm" and isinstance(opts, dict) and bool(opts.get("continuous_usage_stats"))
        n_prompt = len(self.prompt)
        slot = 0

        if self.kind == "chat":
            ch = shapes.ChatChunks(cfg.flavour, self.rid, self.created, self.model, cfg.eff_reasoning_field)

            def usage_so_far(k: int) -> None:
                if continuous:
                    ch.usage_suffix = orjson.dumps({"prompt_tokens": n_prompt, "completion_tokens": k,
                                                    "total_tokens": n_prompt + k})

            usage_so_far(0)
            events.append(ch.role())
            slots.append(0)
            pieces: list[bytes]
            if continuous:
                pieces = []
                for text in plan.reasoning:
                    usage_so_far(len(pieces) + 1)
                    pieces.append(ch.reasoning(text))
                for text in plan.content:
                    usage_so_far(len(pieces) + 1)
                    pieces.append(ch.content(text))
                usage_so_far(plan.completion_tokens)
            else:
                pieces = ch.reasoning_many(plan.reasoning) + ch.content_many(plan.content)
            if plan.tool_call is not None:
                pieces += ch.tool_call(plan.tool_call)
            if self.logprobs is not None:  # one entry per content token, in the chunk that carries it
                first = len(pieces) - len(plan.content) - (len(ch.tool_call(plan.tool_call)) if plan.tool_call else 0)
                for j, text in enumerate(plan.content):
                    pieces[first + j] = shapes.with_logprobs(pieces[first + j], text, self.logprobs)
            events += pieces
            slots += range(len(pieces))
            slot = len(pieces)
            last = max(slot - 1, 0)
            usage_so_far(plan.completion_tokens)
            events.append(ch.finish(plan.finish_reason))
            slots.append(last)
            ch.usage_suffix = b""
            for i, p in enumerate(self.extra, 1):  # n > 1: each further choice after the first, paced alike
                more = [ch.role(), *ch.reasoning_many(p.reasoning)]
                for text in p.content:
                    piece = ch.content(text)
                    more.append(shapes.with_logprobs(piece, text, self.logprobs) if self.logprobs is not None
                                else piece)
                if p.tool_call is not None:
                    more += ch.tool_call(p.tool_call)
                more.append(ch.finish(p.finish_reason))
                index = b'"index":%d' % i
                events += [e.replace(b'"index":0', index, 1) for e in more]
                slots += range(slot, slot + len(more))
                slot += len(more)
                last = slot - 1
            if include_usage:
                events.append(ch.usage(self._usage(False)))
                slots.append(last)
            if not self.extra and shapes.wants_token_ids(cfg.flavour, self.body) and not continuous:
                gen = self.emu.tokenize_generated(self.body, plan.assistant_message())
                n_reasoning = len(plan.reasoning) if plan.content or plan.tool_call is not None else 0
                events, slots = shapes.with_token_ids(events, slots, list(self.prompt), list(gen), n_reasoning)
        else:
            cc = shapes.CompletionChunks(cfg.flavour, self.rid, self.created, self.model)
            events += [cc.text(text) for text in plan.content]
            slots += range(len(plan.content))
            slot = len(plan.content)
            last = max(slot - 1, 0)
            events.append(cc.finish(plan.finish_reason))
            slots.append(last)
            if include_usage:
                events.append(cc.usage(self._usage(False)))
                slots.append(last)
        return events, slots

    async def stream(self, request: web.Request, t_first: float) -> web.StreamResponse:
        cfg, rec = self.cfg, self.rec
        ctype = "text/event-stream" if cfg.flavour == "sglang" else "text/event-stream; charset=utf-8"
        resp = web.StreamResponse(headers={"Content-Type": ctype, "X-Request-Id": rec.request_id})
        await resp.prepare(request)  # headers leave at once; the first event waits for prefill
        events, slots = self._events()
        rec.stage = "prefill"
        await _sleep_until(t_first)
        self._prefilled()

        tps = cfg.decode_tps
        marks = sorted({k for k in (cfg.die_after_chunks, cfg.error_after_chunks, cfg.stall_after_chunks)
                        if k is not None})
        stalled = False
        shift = 0.0  # a mid-stream stall delays the rest of the schedule instead of causing a burst
        sent, n = 0, len(events)
        while True:
            if sent in marks:
                if sent == cfg.die_after_chunks:
                    return self._die(request, resp)
                if sent == cfg.error_after_chunks:
                    await resp.write(shapes.error_event(cfg.flavour, f"Emulated engine failure after {sent} chunks")
                                     + shapes.DONE)
                    self.emu.stats.error(rec, "injected_midstream", 200)
                    rec.status = 200
                    await resp.write_eof()
                    return resp
                if sent == cfg.stall_after_chunks and not stalled:
                    stalled = True
                    rec.stage = "stalled_mid_stream"
                    t = time.monotonic()
                    await asyncio.sleep(cfg.stall_s)
                    shift += time.monotonic() - t
                    rec.stage = "decode"
            if sent >= n:
                break
            stop = n
            for k in marks:
                if k > sent:
                    stop = min(stop, k)
                    break
            j = sent + 1
            if tps > 0:
                due = slots[sent]
                while j < stop and slots[j] == due:
                    j += 1
                await _sleep_until(t_first + shift + due / tps)
            else:
                j = stop
            chunk = b"".join(events[sent:j])
            if j == n and n not in marks:
                chunk += shapes.DONE  # last batch: [DONE] rides along, one write less
            await resp.write(chunk)
            sent = j
            rec.chunks_sent = sent
            if j == n and n not in marks:
                break
        if sent == n and n in marks:
            await resp.write(shapes.DONE)
        self.emu.remember_output(self)
        rec.done = True
        rec.stage = "done"
        await resp.write_eof()
        return resp

    def _die(self, request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        """Cut the connection without finishing the response (no terminating chunk, no [DONE]).

        aiohttp then fails to finish `resp` on the closed transport and drops it quietly.
        """
        self.rec.died = True
        self.rec.stage = "died"
        self.emu.stats.error(self.rec, "injected_die", 200)
        transport = request.transport
        if transport is not None:
            transport.close()  # flushes what was written, then FIN: the client sees a truncated body
        return resp


async def _sleep_until(deadline: float) -> None:
    # Absolute deadlines, never cumulative sleeps: timer slop does not add up over a long stream.
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
