"""max_images: images counted across the whole history (every message, tool results included).

A DeepSeek-V4.1 lane fails every request that carries a fifth image anywhere in its history, so an
agent that keeps the failing turn fails forever. Policy `reject` answers 400 `too_many_images` naming
the count, the limit and where the images are; `drop_oldest` replaces the oldest images beyond the
limit with a short text marker and forwards. Dropping rewrites history, so the prompt prefix moves at
the first changed message: that is recorded for the drift analysis as
`ex.limits.history_rewritten = {"cause": "image_removed", "message_index": i}`.
"""

from __future__ import annotations

from collections import defaultdict

from .base import NEED_IMAGES, Context, Limit, where

MAX_LISTED = 8  # locations named in an error message


def marker_text(limit: int) -> str:
    return f"[image removed by gateway: lane limit {limit}]"


class Images(Limit):
    name = "max_images"
    needs = frozenset({NEED_IMAGES})

    def active(self, limits) -> bool:
        return limits.max_images is not None

    async def enforce(self, ctx: Context) -> None:
        cap = ctx.limits.max_images
        facts = ctx.facts
        if cap is None or facts is None or len(facts.images) <= cap:
            return
        found = facts.images
        n = len(found)
        if ctx.limits.images_policy == "drop_oldest":
            self._drop(ctx, found[: n - cap], cap)
            facts.images = found[n - cap:]
            return
        places = ", ".join(where(i, "content", j) for i, j in found[:MAX_LISTED])
        if n > MAX_LISTED:
            places += f", ... ({n - MAX_LISTED} more)"
        first_over = found[cap]
        ctx.reject(
            self.name,
            f"Too many images: {n} images were provided across the conversation, but this model accepts at most "
            f"{cap} per request (the whole history counts). Images at: {places}. Remove older images from the "
            f"history to continue.",
            param=where(first_over[0], "content", first_over[1]),
            code="too_many_images",
        )

    def _drop(self, ctx: Context, drop: list[tuple[int, int]], cap: int) -> None:
        by_message: dict[int, set[int]] = defaultdict(set)
        for i, j in drop:
            by_message[i].add(j)
        marker = {"type": "text", "text": marker_text(cap)}
        messages = list(ctx.body["messages"])  # copy-on-write: only the changed messages are new objects
        for i, parts in by_message.items():
            m = messages[i]
            content = m["content"]
            messages[i] = {**m, "content": [dict(marker) if j in parts else p for j, p in enumerate(content)]}
        ctx.body["messages"] = messages
        first = min(by_message)
        ctx.rewrote(self.name, f"dropped={len(drop)} limit={cap} first_message={first}")
        ctx.ex.limits.images_dropped = [where(i, "content", j) for i, j in drop]
        ctx.ex.limits.history_rewritten = {"cause": "image_removed", "message_index": first}
        if ctx.facts is not None:
            ctx.facts.ascii_bytes += len(marker["text"]) * len(drop)
