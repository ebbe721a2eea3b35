"""Every cause a cache verdict can name, with who can fix it (the README table is this catalogue)."""

from __future__ import annotations

from typing import Literal

Fixer = Literal["client", "lane config", "nobody"]

CAUSES: dict[str, tuple[Fixer, str]] = {
    "effort_changed": ("client", "the reasoning effort changed (effort line at the start of the prompt); the pin "
                                 "policy `warn`/`off` or `X-Gateway-Repin` let it through"),
    "thinking_toggled": ("client", "thinking mode switched on or off"),
    "reasoning_dropped_by_template": ("nobody", "no tools, thinking on, drop_thinking on: the template drops "
                                                "earlier reasoning (and developer messages) when a user message "
                                                "arrives, by design; on vLLM `render.drop_thinking: false` keeps it"),
    "client_stripped_reasoning": ("client", "the client sent an earlier assistant message back without its "
                                            "reasoning"),
    "system_prompt_changed": ("client", "a system message's text changed (e.g. a timestamp)"),
    "tools_changed": ("client", "tools added, removed, reordered or edited"),
    "response_format_changed": ("client", "response_format added, removed or edited"),
    "history_edited": ("client", "an earlier message was edited, removed or inserted (compaction, tool-call "
                                 "arguments re-serialised in another order, tool results reordered without ids)"),
    "image_removed": ("client", "an image was removed from an earlier message (by the client, or by the lane's "
                                "`images_policy: drop_oldest`)"),
    "tool_results_reordered": ("client", "tool results sent back in another order"),
    "client_retried_turn": ("client", "the client sent its last turn again with the answer the gateway relayed "
                                      "edited or dropped (a retried or partly discarded turn); the turn stays in "
                                      "its conversation"),
    "regenerated": ("nobody", "the request is a prefix of the previous turn (a retry or regeneration)"),
    "output_retokenized": ("nobody", "the generated text tokenizes differently when sent back than the tokens the "
                                     "engine generated, so the cache holds other ids for the same text"),
    "unknown": ("nobody", "nothing at the first differing character explains it; the alert carries both "
                          "snippets for a human"),
    # Verdicts that are not drift.
    "eviction": ("nobody", "the prefix was stable but the engine held fewer tokens than predicted (its pool "
                           "let them go)"),
    "rehomed": ("lane config", "the router moved the conversation to another replica (affinity settings)"),
    "shared_prefix": ("nobody", "a hit: a conversation's first turn found its head (system prompt, tools) on "
                                "the replica, stored by another conversation"),
}


def fixer(cause: str | None) -> Fixer | None:
    entry = CAUSES.get(cause or "")
    return entry[0] if entry else None


def readme_table() -> str:
    rows = ["| cause | who can fix it | what happened |", "| --- | --- | --- |"]
    rows += [f"| `{c}` | {who} | {what} |" for c, (who, what) in CAUSES.items()]
    return "\n".join(rows)
