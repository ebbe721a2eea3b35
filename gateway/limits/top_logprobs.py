"""top_logprobs: OpenAI's rules (an integer >= 0, only with logprobs: true) and the lane's cap.

Policy `reject` answers 400 `top_logprobs_too_large`; `clamp` forwards the cap and says so in the
X-Gateway-Limits response header. The rules apply on every lane (engines differ: vLLM enforces them,
SGLang does not); the cap only where `max_top_logprobs` is set.
"""

from __future__ import annotations

from ..core.errors import invalid_request
from .base import Context, Limit


def check_rules(body: dict) -> None:
    """OpenAI's own rules, lane-independent. Raises GatewayError (not a lane limit, so nothing is fired)."""
    n = body.get("top_logprobs")
    if n is None:
        return
    if not isinstance(n, int) or isinstance(n, bool):  # validate.py already says so; keep this module self-contained
        raise invalid_request("'top_logprobs' must be an integer", param="top_logprobs", code="invalid_type")
    if n < 0:
        raise invalid_request(f"Invalid 'top_logprobs': integer below minimum value. Expected a value >= 0, but got "
                              f"{n} instead.", param="top_logprobs", code="integer_below_min_value")
    if body.get("logprobs") is not True:
        raise invalid_request("Invalid 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.",
                              param="top_logprobs", code="invalid_value")


class TopLogprobs(Limit):
    name = "max_top_logprobs"

    def active(self, limits) -> bool:
        return limits.max_top_logprobs is not None

    async def enforce(self, ctx: Context) -> None:
        if not ctx.is_chat:
            return  # /v1/completions carries an integer `logprobs` instead; the engine checks it
        cap = ctx.limits.max_top_logprobs
        n = ctx.body.get("top_logprobs")
        if cap is None or not isinstance(n, int) or n <= cap:
            return
        if ctx.limits.top_logprobs_policy == "clamp":
            ctx.body["top_logprobs"] = cap
            ctx.rewrote(self.name, f"clamped={n} limit={cap}")
            ctx.ex.limits.top_logprobs_clamped = {"requested": n, "forwarded": cap}
            return
        ctx.reject(self.name, f"Invalid 'top_logprobs': integer above maximum value. Expected a value <= {cap}, "
                   f"but got {n} instead.", param="top_logprobs", code="top_logprobs_too_large")
