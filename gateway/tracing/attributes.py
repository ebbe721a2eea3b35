"""An exchange as span attributes: OpenTelemetry's GenAI semantic conventions, then the gateway's own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..records.record import build_record

if TYPE_CHECKING:
    from ..core.exchange import Exchange
    from ..core.config import Lane

# gen_ai.operation.name per endpoint (the conventions' well-known values where one exists).
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "chat",
    "/v1/messages": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}


def operation(path: str) -> str:
    return OPERATIONS.get(path, path.rsplit("/", 1)[-1] or "request")


def _max_tokens(body: dict[str, Any] | None) -> Any:
    if not isinstance(body, dict):
        return None
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def request_attributes(ex: "Exchange", lane: "Lane | None") -> dict[str, Any]:
    """What is known once the request has been routed: for the upstream span too."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation(ex.path),
        "gen_ai.request.model": ex.public_model,
        "gen_ai.request.max_tokens": _max_tokens(ex.body),
        "gateway.tenant": ex.tenant,
        "gateway.lane": ex.lane,
    }
    if lane is not None:
        attrs["gen_ai.provider.name"] = lane.engine
    body = ex.body if isinstance(ex.body, dict) else {}
    for key, name in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p")):
        value = body.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[name] = value
    return {k: v for k, v in attrs.items() if v is not None}


def outcome_attributes(ex: "Exchange", lane: "Lane | None") -> dict[str, Any]:
    """Everything the record says that a trace reader filters on, after the analysis."""
    rec = build_record(ex)
    attrs: dict[str, Any] = request_attributes(ex, lane)
    attrs.update({
        "http.request.method": "POST",
        "url.path": ex.path,
        "http.response.status_code": ex.status or None,
        "gen_ai.response.model": ex.public_model if 200 <= ex.status < 300 else None,
        "gen_ai.usage.input_tokens": rec["prompt_tokens"],
        "gen_ai.usage.output_tokens": rec["completion_tokens"],
        "gen_ai.usage.cache_read.input_tokens": rec["cached_tokens"],
        "gen_ai.response.finish_reasons": [rec["finish_reason"]] if rec["finish_reason"] else None,
        "gen_ai.conversation.id": ex.conversation_id,
        "error.type": ex.error_code,
        "gateway.request_id": ex.request_id,
        "gateway.replica": ex.replica,
        "gateway.conversation": ex.conversation_id,
        "gateway.turn": ex.turn,
        "gateway.verdict": rec["verdict"] if ex.cache else None,
        "gateway.cause": rec["cause"],
        "gateway.predicted_cached_tokens": rec["predicted_cached_tokens"],
        "gateway.healed": [h.kind for h in ex.healed] if ex.healed else None,
        "gateway.fallback_from": ex.fallback_from,
        "gateway.retries": ex.retries or None,
        "gateway.analysis_skipped": ex.analysis_skipped,
        "gateway.limits_fired": list(ex.limits_fired) if ex.limits_fired else None,
    })
    return {k: v for k, v in attrs.items() if v is not None}
