"""The hot-path policy that runs a lane's active limits, in order, over one scan of the request."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..core.errors import GatewayError
from .base import LIMITS_HEADER, NEED_IMAGES, NEED_PLACEHOLDERS, NEED_TEXT, Context, Limit
from .context import ContextWindow
from .images import Images
from .message_count import MessageCount
from .placeholders import Placeholders
from .request_bytes import RequestBytes
from .scan import Facts, joined, scan_chat, scan_prompt
from .top_logprobs import TopLogprobs, check_rules

log = logging.getLogger("gateway.limits")

# Order matters: cheap refusals first, then the rewrites, then the window (measured after rewriting).
DEFAULT_CHAIN: tuple[Limit, ...] = (
    RequestBytes(),
    MessageCount(),
    TopLogprobs(),
    Placeholders(),
    Images(),
    ContextWindow(),
)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one lane's limits need, worked out once per routes.yaml load."""

    limits: tuple[Limit, ...]
    tokens: tuple[str, ...]  # placeholder tokens to look for

    def scan(self, ctx: Context) -> Facts:
        needs: set[str] = set()
        for limit in self.limits:
            if limit.needs:
                needs |= limit.needs_for(ctx)
        body = ctx.body
        tokens = self.tokens if NEED_PLACEHOLDERS in needs else ()
        if "messages" not in body:
            return scan_prompt(body, tokens=tokens, text=NEED_TEXT in needs)
        images, text, engine = NEED_IMAGES in needs, NEED_TEXT in needs, ctx.lane.config.engine
        history = ctx.ex.history
        filed = history.fresh or history.pending if history is not None else None
        if history is None or (filed is None and not history.known):
            return scan_chat(body, images=images, tokens=tokens, text=text, engine=engine)
        # An agent's next turn (gateway/pipeline/history_memo.py): only the new messages are scanned.
        key = (images, tokens, text, engine)
        known = history.entry.facts.get(key) if history.entry is not None else None
        messages = scan_chat(body, images=images, tokens=tokens, text=text, engine=engine,
                             start=history.known if known is not None else 0, request_level=False)
        if known is not None:
            messages = joined(known, messages)
        if filed is not None:
            filed.facts[key] = messages  # never changed: the limits get a copy (joined)
        request = scan_chat({"messages": [], "tools": body.get("tools")}, images=images, tokens=tokens, text=text,
                            engine=engine)
        facts = joined(messages, request)
        facts.n_messages = messages.n_messages
        return facts


class LimitsPolicy:
    """A runtime Policy (see runtime.py): may rewrite the body or raise GatewayError."""

    name = "limits"
    per_lane = True

    def __init__(self, chain: tuple[Limit, ...] = DEFAULT_CHAIN) -> None:
        self.chain = chain

    def plan_for(self, lane_limits: Any) -> Plan:
        active = tuple(limit for limit in self.chain if limit.active(lane_limits))
        return Plan(active, tuple(lane_limits.placeholder_tokens))

    def attach(self, lane: Any) -> None:
        """Lane hook: compute the plan when a lane is (re)built."""
        lane.limits_plan = self.plan_for(lane.config.limits)

    async def apply(self, ex: Any, lane: Any, body: dict[str, Any]) -> None:
        if "messages" in body:
            check_rules(body)
        plan: Plan | None = lane.limits_plan
        if plan is None:
            plan = self.plan_for(lane.config.limits)
            lane.limits_plan = plan
        if not plan.limits:
            return
        ctx = Context(ex, lane, lane.config.limits, body)
        try:
            for limit in plan.limits:
                if limit.needs and ctx.facts is None and limit.needs_for(ctx):
                    ctx.facts = plan.scan(ctx)  # once, for every limit that needs it
                await limit.enforce(ctx)
        except GatewayError:
            raise
        except Exception as exc:  # a bug here must not take the lane down: forward, and say so loudly
            log.exception("limits check failed for request %s; forwarding unchecked", ex.request_id)
            ex.limits.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if ctx.notes:
                prior = ex.response_headers.get(LIMITS_HEADER)
                value = ", ".join(ctx.notes)
                ex.response_headers[LIMITS_HEADER] = f"{prior}, {value}" if prior else value
