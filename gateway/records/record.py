"""Build the record of one finished exchange: a flat dict of sizes, counts and timings, no text.

Runs in an aftermath sink, never on the request path. Timings come from the Exchange's
perf_counter stamps and are stored in seconds (wall-clock `ts` for when the request started).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import orjson
import xxhash

from ..core.exchange import Exchange
from ..core.verdict import VERDICTS, CacheVerdict

# Column name -> SQLite type. The SQLite store creates (and extends) its table from this list,
# and the Redis stream carries the same keys, so the two never disagree.
FIELDS: dict[str, str] = {
    "ts": "REAL",  # wall-clock start, epoch seconds
    "request_id": "TEXT",
    "gateway": "TEXT",  # which gateway process wrote it (host:port): the fleet view tells them apart
    "client": "TEXT",  # the client program: the user-agent's first product name, without version
    "user_agent": "TEXT",  # the whole User-Agent header, cut to 200 characters
    "path": "TEXT",
    "tenant": "TEXT",  # the client key's tenant id (never the key)
    "model": "TEXT",  # the public model name the client asked for
    "lane": "TEXT",
    "replica": "TEXT",
    "conversation": "TEXT",
    "conversation_source": "TEXT",  # how the conversation was identified (header, prompt_cache_key, lineage...)
    "turn": "INTEGER",
    "stream": "INTEGER",
    "status": "INTEGER",
    "error_code": "TEXT",
    "cancelled": "INTEGER",
    "retries": "INTEGER",
    "fallback_from": "TEXT",  # the model's own lane, when a fallback lane served the request
    "upstream_error": "TEXT",
    "prompt_tokens": "INTEGER",
    "cached_tokens": "INTEGER",  # as the engine reported it; NULL = not reported (not the same as 0)
    "predicted_cached_tokens": "INTEGER",
    "verdict": "TEXT",  # hit | drift | eviction | cold | unknown
    "cause": "TEXT",
    "divergence_message_index": "INTEGER",
    "divergence_field": "TEXT",
    # ~32 tokens of each render around a drift's break (the alert's snippets), NULL otherwise: the
    # only prompt text kept, so a reviewer can see the difference turn by turn.
    "diff_before": "TEXT",
    "diff_after": "TEXT",
    "tokens_lost": "INTEGER",
    "seconds_lost": "REAL",
    "rendered_prompt_tokens": "INTEGER",
    "healed": "TEXT",  # drift healing's repairs, JSON {kind: messages repaired}; NULL when none
    "healed_tokens": "INTEGER",  # cached prompt tokens those repairs kept (after the analysis)
    "render": "TEXT",
    # token ids: how the render was checked against the engine: token_ids (the ids it
    # prefilled, content) or count (usage.prompt_tokens only); NULL when not checked
    "render_check": "TEXT",
    "render_matches_engine": "INTEGER",
    "render_check_why": "TEXT",  # why counts were compared (the engine could not say its ids, or did not)
    "completion_tokens": "INTEGER",
    "reasoning_tokens": "INTEGER",
    "ttfb_s": "REAL",  # time to the upstream's first byte (response headers)
    "ttft_s": "REAL",  # time to the first generated token of any kind (first content byte)
    "decode_tps": "REAL",  # tokens/s from first to last generated token, prefill excluded
    "decode_source": "TEXT",  # usage | chunks: where the token count of decode_tps came from
    "chunks": "INTEGER",  # token-bearing stream chunks
    "gap_p50_s": "REAL",
    "gap_p99_s": "REAL",
    "total_s": "REAL",
    "gateway_s": "REAL",  # the gateway's own time before forwarding
    "effort_requested": "TEXT",
    "effort_applied": "TEXT",
    "effort_action": "TEXT",
    "thinking_requested": "INTEGER",
    "thinking_applied": "INTEGER",
    "limits_fired": "TEXT",  # JSON list, NULL when none fired
    "body_bytes": "INTEGER",
    "messages": "INTEGER",
    "output_chars": "INTEGER",
    "output_hash": "TEXT",  # xxh3-64 of reasoning + content + tool calls: compare outputs without storing them
    "finish_reason": "TEXT",
    "analysis": "TEXT",  # why analysis did not run, when it did not (e.g. queue_full)
    "capture": "TEXT",  # opt-in debugging capture (JSON, size-capped); NULL by default
    "kv": "TEXT",  # the KV-event verdict (JSON: cause, held tokens, displacing conversations...)
    "admission": "TEXT",  # cache-protecting admission's decision for a new conversation (JSON)
    "rate_limited": "TEXT",  # the per-tenant rate limit that refused the request
}

UNKNOWN = CacheVerdict("unknown")  # an exchange the analysis did not see


def build_record(ex: Exchange, capture_max_bytes: int = 0) -> dict[str, Any]:
    """The record of `ex`. `capture_max_bytes` > 0 stores request and output, truncated to that size."""
    usage = ex.usage if isinstance(ex.usage, dict) else {}
    cache = ex.cache if ex.cache is not None else UNKNOWN
    body = ex.body if isinstance(ex.body, dict) else {}
    gen = ex.generated
    completion_tokens = _int(usage.get("completion_tokens"))
    chunks = len(ex.token_chunk_times)
    decode_tps, decode_source = decode_speed(ex.t_first_token, ex.t_last_token, completion_tokens, chunks)
    gap_p50, gap_p99 = gap_percentiles(ex.token_chunk_times)
    output = _output_text(ex)
    messages = (ex.chat if ex.chat is not None else body).get("messages")  # a Responses request: as mapped
    headers = ex.request_headers or {}
    user_agent = _str(headers.get("user-agent")) if hasattr(headers, "get") else None
    rec: dict[str, Any] = {
        "ts": ex.started_wall,
        "request_id": ex.request_id,
        "gateway": None,  # set by the store's owner (Records), which knows its address
        "client": client_of(user_agent),
        "user_agent": user_agent,
        "path": ex.path,
        "tenant": ex.tenant,
        "model": ex.public_model,
        "lane": ex.lane,
        "replica": ex.replica,
        "conversation": ex.conversation_id,
        "conversation_source": ex.conversation_source,
        "turn": ex.turn,
        "stream": int(ex.stream),
        "status": ex.status,
        "error_code": ex.error_code,
        "cancelled": int(ex.cancelled),
        "retries": ex.retries,
        "fallback_from": ex.fallback_from,
        "upstream_error": (ex.upstream_error or None) and ex.upstream_error[:300],
        "prompt_tokens": _int(usage.get("prompt_tokens")),
        "cached_tokens": reported_cached_tokens(usage),
        "predicted_cached_tokens": cache.predicted_cached_tokens,
        "verdict": cache.verdict if cache.verdict in VERDICTS else "unknown",
        "cause": cache.cause,
        "divergence_message_index": cache.divergence_message_index,
        "divergence_field": cache.divergence_field,
        "diff_before": _snippet(cache.snippet_before) if cache.verdict == "drift" else None,
        "diff_after": _snippet(cache.snippet_after) if cache.verdict == "drift" else None,
        "tokens_lost": cache.tokens_lost,
        "seconds_lost": cache.seconds_lost,
        "rendered_prompt_tokens": cache.rendered_prompt_tokens,
        "healed": orjson.dumps({h.kind: len(h.indices) for h in ex.healed}).decode() if ex.healed else None,
        "healed_tokens": sum(h.tokens_saved or 0 for h in ex.healed) if ex.healed else None,
        "render": cache.render if ex.cache is not None else None,
        "render_check": cache.render_check,
        "render_matches_engine": None if cache.render_matches_engine is None else int(cache.render_matches_engine),
        "render_check_why": cache.render_check_why,
        "completion_tokens": completion_tokens,
        "reasoning_tokens": reasoning_tokens(usage),
        "ttfb_s": _since(ex.started, ex.t_first_byte),
        "ttft_s": _since(ex.started, ex.t_first_token),
        "decode_tps": decode_tps,
        "decode_source": decode_source,
        "chunks": chunks,
        "gap_p50_s": gap_p50,
        "gap_p99_s": gap_p99,
        "total_s": _since(ex.started, ex.t_end),
        "gateway_s": _since(ex.started, ex.t_forwarded),
        "effort_requested": _str(ex.effort_requested),
        "effort_applied": _str(ex.effort_applied),
        "effort_action": ex.effort_action,
        "thinking_requested": None if ex.thinking_requested is None else int(ex.thinking_requested),
        "thinking_applied": None if ex.thinking_applied is None else int(ex.thinking_applied),
        "limits_fired": orjson.dumps(ex.limits_fired).decode() if ex.limits_fired else None,
        "body_bytes": ex.body_bytes,
        "messages": len(messages) if isinstance(messages, list) else None,
        "output_chars": len(output),
        "output_hash": xxhash.xxh3_64_hexdigest(output.encode("utf-8", "replace")) if output else None,
        "finish_reason": gen.finish_reason,
        "analysis": _str(ex.analysis_skipped),
        "capture": _capture(ex, capture_max_bytes) if capture_max_bytes > 0 else None,
        "kv": orjson.dumps(cache.kv.to_json()).decode() if cache.kv is not None else None,
        "admission": orjson.dumps(dataclasses.asdict(ex.admission)).decode() if ex.admission is not None else None,
        "rate_limited": ex.rate_limits.refused if ex.rate_limits is not None else None,
    }
    return rec


@functools.lru_cache(maxsize=512)  # a fleet has a few clients: parsed once per User-Agent, not per record
def client_of(user_agent: str | None) -> str:
    """The client program from its User-Agent: `OpenAI/Python 1.2.3` -> `OpenAI/Python`,
    `opencode/0.5.1 ai-sdk/4` -> `opencode`, `curl/8.5.0` -> `curl`; "unknown" without one.

    Versions are dropped so that a reviewer mutes or ranks a program, not each of its releases
    (the full header stays in `user_agent`).
    """
    if not user_agent or not user_agent.strip():
        return "unknown"
    first = user_agent.strip().split(" ")[0]
    name, _, version = first.partition("/")
    if version and not any(c.isdigit() for c in version[:1]):
        # `OpenAI/Python 1.2.3`: the slash separates two words of the name, the version follows.
        return first[:60]
    return (name or first)[:60]


def decode_speed(t_first: float | None, t_last: float | None, completion_tokens: int | None,
                 chunks: int) -> tuple[float | None, str | None]:
    """(completion_tokens - 1) / (last - first): the first token belongs to prefill, the rest to decode.

    Without usage the count of token-bearing chunks stands in (one token per chunk on both engines
    unless they batch the stream, so it is an estimate, labelled as such).
    """
    if t_first is None or t_last is None:
        return None, None
    span = t_last - t_first
    if span <= 0:
        return None, None
    if completion_tokens is not None and completion_tokens > 1:
        return (completion_tokens - 1) / span, "usage"
    if chunks > 1:
        return (chunks - 1) / span, "chunks"
    return None, None


def gap_percentiles(times: list[float]) -> tuple[float | None, float | None]:
    if len(times) < 2:
        return None, None
    gaps = sorted(map(operator.sub, times[1:], times))  # in C, not a generator over zip
    return quantile(gaps, 0.5), quantile(gaps, 0.99)


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on an already sorted list."""
    n = len(sorted_values)
    if n == 1:
        return sorted_values[0]
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def reported_cached_tokens(usage: dict[str, Any]) -> int | None:
    """Cached prompt tokens as the engine reported them; None when it did not report (≠ 0)."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        return _int(details.get("cached_tokens"))
    return None


def reasoning_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict) and details.get("reasoning_tokens") is not None:
        return _int(details.get("reasoning_tokens"))
    return _int(usage.get("reasoning_tokens"))  # SGLang reports it at the top level


def _output_text(ex: Exchange) -> str:
    gen = ex.generated
    parts = ["".join(gen.reasoning), "".join(gen.content)]
    for i in sorted(gen.tool_calls):
        fn = gen.tool_calls[i].get("function") or {}
        parts.append(str(fn.get("name", "")) + str(fn.get("arguments", "")))
    return "\x1e".join(p for p in parts if p)


def _capture(ex: Exchange, cap: int) -> str:
    """Request body and generated message, each cut to `cap` bytes (debugging only, opt-in)."""
    req = orjson.dumps(ex.body) if ex.body is not None else b""
    out = orjson.dumps(ex.generated.as_message())
    doc = {
        "request": req[:cap].decode("utf-8", "ignore"),
        "request_truncated": len(req) > cap,
        "output": out[:cap].decode("utf-8", "ignore"),
        "output_truncated": len(out) > cap,
    }
    return orjson.dumps(doc).decode()


def _snippet(v: Any) -> str | None:
    return v[:200] if isinstance(v, str) and v else None


def _since(start: float, t: float | None) -> float | None:
    return None if t is None else max(0.0, t - start)


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _str(v: Any) -> str | None:
    if v is None:
        return None
    s = v if isinstance(v, str) else str(v)
    return s[:200]
