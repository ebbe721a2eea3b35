"""What to do about each cause of a cache loss: who can fix it, and one line to forward.

One entry per cause string (the causes are listed in the README, "Drift and cache verdicts", and
named by drift.py's classifier). A cause this table does not know yet still gets an entry
(`DEFAULT`), so a new cause never hides an alert. Lines are written for the person who forwards
them to a client's authors or a lane's owner: say what the client sent, and what to send instead.

`fixable_by`: "client" (the client's request history or parameters changed), "lane" (the lane's
configuration or capacity), "nobody" (unavoidable by design: the template or the conversation's
own course does it; grouped apart and never paging).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FixableBy = Literal["client", "lane", "nobody"]


@dataclass(frozen=True)
class Remedy:
    fixable_by: FixableBy
    title: str  # a few words for a badge
    remedy: str  # one line to forward


REMEDIES: dict[str, Remedy] = {
    "effort_changed": Remedy(
        "client", "reasoning effort changed",
        "The client changed reasoning_effort mid-conversation, which DeepSeek renders at the very start of the "
        "prompt: keep one effort for the whole session (or set the lane's effort_policy: pin)."),
    "thinking_toggled": Remedy(
        "client", "thinking switched on/off",
        "The client switched thinking on or off mid-conversation, which changes the prompt's first tokens: keep "
        "one thinking mode for the whole session."),
    "reasoning_dropped_by_template": Remedy(
        "nobody", "template drops reasoning",
        "By design of the chat template: without tools in the request, earlier turns' reasoning is dropped when a "
        "new user message arrives. Expected once per user message; sending the tools on every request avoids it."),
    "client_stripped_reasoning": Remedy(
        "client", "client stripped reasoning",
        "The client removed reasoning_content from earlier assistant messages: send every assistant message back "
        "exactly as it was received, reasoning included."),
    "system_prompt_changed": Remedy(
        "client", "system prompt changed",
        "The client changed its system prompt mid-conversation (often a date, time or file list in it): keep the "
        "system prompt byte-identical and put changing context in the newest user message."),
    "tools_changed": Remedy(
        "client", "tool list changed",
        "The client changed the tools it sends (added, removed, reordered or re-described one): send the same tool "
        "list in the same order with byte-identical schemas on every turn."),
    "response_format_changed": Remedy(
        "client", "response format changed",
        "The client changed response_format mid-conversation: keep one response_format for the whole session."),
    "history_edited": Remedy(
        "client", "history edited",
        "The client rewrote an earlier message (compaction, truncation, re-serialised content): only append to the "
        "history; if it compacts on purpose, expect one full re-prefill per compaction."),
    "image_removed": Remedy(
        "client", "image removed",
        "An image was dropped from the history (by the client, or by the lane's max_images: drop_oldest): keep "
        "images in place, or start a new conversation when the image budget is spent."),
    "tool_results_reordered": Remedy(
        "client", "tool results reordered",
        "The client sent tool results in a different order than before: send them in the order of the "
        "assistant's tool_calls, every turn."),
    "tool_arguments_reserialized": Remedy(
        "client", "tool arguments re-serialised",
        "The client re-serialises tool-call arguments (spacing, key order, escapes): send them back byte for byte "
        "as the model produced them."),
    "regenerated": Remedy(
        "nobody", "answer regenerated",
        "The last answer was dropped and asked for again (a retry or a user's regenerate): expected, only its "
        "own turn is re-prefilled."),
    "output_retokenized": Remedy(
        "nobody", "output re-tokenized differently",
        "The answer's text tokenizes differently when sent back than the tokens the engine generated, so the "
        "cache holds other ids for the same text: expected now and then, only the tail of that answer re-prefills."),
    "eviction": Remedy(
        "lane", "evicted from the engine's cache",
        "The prefix was stable but the engine no longer held it (KV pool full or idle too long): give the lane more "
        "KV cache memory, fewer concurrent long sessions, or conversation affinity across replicas."),
    "rehomed": Remedy(
        "lane", "moved to another replica",
        "The router sent the conversation to a replica that did not hold its cache: check the lane's routing "
        "(conversation affinity) and replica health."),
    "client_retried_turn": Remedy(
        "client", "turn retried with an edited answer",
        "The client resent its last turn with the model's answer edited or dropped (e.g. a discarded tool call): "
        "send the answer back as it came, or retry from the request before it, so the prefix stays the same."),
    "shared_prefix": Remedy(
        "nobody", "prefix shared with another session",
        "Nothing to fix: the session's first turn reused the head (system prompt, tools) another session left on "
        "the replica. Routing new sessions to where their head is (conversation affinity) keeps it so."),
    "unknown": Remedy(
        "client", "unexplained drift",
        "The prompt changed at this point for a reason the gateway could not name: compare the two renders below "
        "and send this alert with them to the gateway's maintainers."),
}

DEFAULT = Remedy(
    "client", "drift",
    "The prompt changed here for a reason this gateway version has no advice for yet: compare the two renders "
    "below; the client probably changed an earlier part of the conversation.")

# A deliberate re-pin (the client sent X-Gateway-Repin with a new effort): asked for, not a fault.
REPIN = Remedy(
    "nobody", "deliberate re-pin",
    "The client asked for a new reasoning effort on purpose (X-Gateway-Repin): one full re-prefill was the "
    "expected price; nothing to fix.")


# A Responses API client keeps reasoning in reasoning items; one that drops them, or sends the text back
# inside a message, loses it from the prompt.
RESPONSES_REASONING = Remedy(
    "client", "client stripped reasoning",
    "The client did not send the reasoning back as it came: return every `reasoning` output item as a "
    "`reasoning` input item, its text unchanged (with store: false, send the items themselves, not their text "
    "inside a message).")


def remedy_for(cause: str | None, repinned: bool = False, path: str | None = None) -> Remedy:
    if repinned and cause in ("effort_changed", "thinking_toggled"):
        return REPIN
    if cause == "client_stripped_reasoning" and path == "/v1/responses":
        return RESPONSES_REASONING
    return REMEDIES.get(cause or "unknown", DEFAULT)
