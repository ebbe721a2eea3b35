"""Lane limits enforced before the engine: images across the history, top_logprobs, context window,
placeholder tokens, request bytes and message count.

One module per limit (`images`, `top_logprobs`, `context`, `placeholders`, `request_bytes`,
`message_count`), all behind the small `Limit` interface of `base`, fed by one pass over the request
(`scan`) and run in order by `policy.LimitsPolicy`; `feature` installs it into the gateway.
"""

from .base import LIMITS_HEADER, Context, Limit
from .policy import DEFAULT_CHAIN, LimitsPolicy, Plan

__all__ = ["DEFAULT_CHAIN", "LIMITS_HEADER", "Context", "Limit", "LimitsPolicy", "Plan"]
