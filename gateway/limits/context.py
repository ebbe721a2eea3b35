"""max_context_tokens and max_output_tokens: prompt plus requested output against the lane's window.

`max_output_tokens` caps what one request may ask for (`max_completion_tokens`, else `max_tokens`):
400 `invalid_value` on that parameter, as OpenAI answers a too-large max_tokens. It is deliberately not
`context_length_exceeded`, which agents read as "compact the history".

`max_context_tokens` is the window: prompt tokens + requested output (at least one token) must fit, else
400 `context_length_exceeded`, param `messages`, with both numbers in OpenAI's wording. The prompt is
measured as cheaply as the decision allows (see tokens.py): most requests are decided by byte bounds
from the scan, and only those near the window are counted exactly, off the event loop.
"""

from __future__ import annotations

from .base import NEED_IMAGES, NEED_TEXT, Context, Limit
from .tokens import Count, bounds, count_prompt, size_bound


def requested_output(body: dict) -> tuple[str | None, int | None]:
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool):
            return name, v
    return None, None


class ContextWindow(Limit):
    name = "max_context_tokens"
    needs = frozenset({NEED_TEXT, NEED_IMAGES})

    def active(self, limits) -> bool:
        return limits.max_context_tokens is not None or limits.max_output_tokens is not None

    def needs_for(self, ctx: Context) -> frozenset[str]:
        return frozenset() if self._fits_by_size(ctx) else self.needs

    @staticmethod
    def _fits_by_size(ctx: Context) -> bool:
        """No scan needed when even one token per byte of the whole JSON body fits the window."""
        window = ctx.limits.max_context_tokens
        if window is None:
            return True
        out = requested_output(ctx.body)[1]
        return size_bound(ctx.ex.body_bytes, ctx.body) + max(out or 0, 1) <= window

    async def enforce(self, ctx: Context) -> None:
        limits = ctx.limits
        field, out = requested_output(ctx.body)
        if limits.max_output_tokens is not None and out is not None and out > limits.max_output_tokens:
            ctx.reject("max_output_tokens", f"{field} is too large: {out}. This model supports at most "
                       f"{limits.max_output_tokens} completion tokens, whereas you provided {out}.",
                       param=field, code="invalid_value")
        window = limits.max_context_tokens
        facts = ctx.facts
        if window is None or self._fits_by_size(ctx):
            return
        if facts is None:  # pragma: no cover - the policy scans for whoever needs it
            return
        need_out = max(out or 0, 1)
        b = bounds(facts, bool(ctx.body.get("tools")))
        if b.high + need_out <= window:
            return
        if b.low + need_out > window:
            self._refuse(ctx, window, Count(b.low, "lower_bound"), out)
        count = await count_prompt(ctx.body, facts, ctx.lane.renderer)
        ctx.ex.limits.prompt_tokens_counted = {"n": count.n, "how": count.how, "bound": b.high}
        if count.how != "timeout" and count.n + need_out > window:
            self._refuse(ctx, window, count, out)

    def _refuse(self, ctx: Context, window: int, count: Count, out: int | None) -> None:
        what = "messages" if ctx.is_chat else "prompt"
        if out:
            total = f"at least {count.n + out}" if count.how == "lower_bound" else (
                f"about {count.n + out}" if count.how == "cl100k" else str(count.n + out))
            text = (f"This model's maximum context length is {window} tokens. However, you requested {total} tokens "
                    f"({count.phrase} in the {what}, {out} in the completion). Please reduce the length of the "
                    f"{what} or completion.")
        else:
            text = (f"This model's maximum context length is {window} tokens. However, your {what} resulted in "
                    f"{count.phrase} tokens. Please reduce the length of the {what}.")
        if count.how == "cl100k":
            text += " (Token counts estimated with the cl100k tokenizer: this lane has no known chat template.)"
        ctx.reject(self.name, text, param=what, code="context_length_exceeded")
