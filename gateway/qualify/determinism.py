"""Gate 1: the determinism suite at temperature 0 with a fixed seed, hashed and compared.

Each prompt is sent twice: the two answers must agree with each other (a lane that is not
deterministic within one run cannot be compared with anything) and with the lane's previous
qualified record. The first run of a lane records the baseline.
"""

from __future__ import annotations

import difflib
from typing import Any

import orjson
import xxhash

from .client import LaneClient, Result
from .progress import SILENT, Progress
from .suite import DETERMINISM_SUITE, suite_id

MAX_STORED_OUTPUT = 8000


def output_text(r: Result) -> str:
    """What the model said, as one text a human can diff (reasoning, answer, tool calls)."""
    parts = []
    if r.reasoning:
        parts.append(f"<think>{r.reasoning}</think>")
    parts.append(r.content)
    for call in r.tool_calls:
        fn = call.get("function") or {}
        parts.append(f"[tool {fn.get('name')} {fn.get('arguments')}]")
    return "\n".join(p for p in parts if p)


def output_hash(r: Result) -> str:
    """xxhash of the output (text, reasoning, tool calls without their random ids) and its token count."""
    calls = [[(c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")] for c in r.tool_calls]
    doc = {"content": r.content, "reasoning": r.reasoning, "tool_calls": calls, "completion_tokens": r.tokens}
    return xxhash.xxh3_64_hexdigest(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))


def text_diff(old: str, new: str, name: str, max_lines: int = 40) -> str:
    """A word-level unified diff of two outputs (outputs are mostly one long line)."""
    if old == new:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    a = old.replace("\n", " \\n ").split(" ")
    b = new.replace("\n", " \\n ").split(" ")
    lines = list(difflib.unified_diff(a, b, f"{name} (qualified)", f"{name} (now)", n=3, lineterm=""))
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
    return f"first difference at character {at}\n" + "\n".join(lines)


async def run_determinism(client: LaneClient, *, seed: int, max_tokens: int, previous: dict[str, Any] | None,
                          rebaseline: bool = False, progress: Progress = SILENT) -> dict[str, Any]:
    sid = suite_id(max_tokens, seed)
    prompts: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    unstable: list[str] = []
    with progress.bar("determinism", 2 * len(DETERMINISM_SUITE)) as bar:
        for prompt in DETERMINISM_SUITE:
            body = prompt.body(temperature=0.0, seed=seed, max_tokens=max_tokens)
            first = await client.chat(body)
            bar.update()
            again = await client.chat(body)
            bar.update()
            entry: dict[str, Any] = {}
            if not first.ok or not again.ok:
                entry["error"] = first.error or again.error
                errors.append(prompt.name)
            else:
                h1, h2 = output_hash(first), output_hash(again)
                entry.update(hash=h1, completion_tokens=first.tokens, prompt_tokens=first.prompt_tokens,
                             finish_reason=first.finish_reason, output=output_text(first)[:MAX_STORED_OUTPUT],
                             repeat_equal=h1 == h2)
                if h1 != h2:
                    unstable.append(prompt.name)
                    entry["repeat_diff"] = text_diff(output_text(first), output_text(again), prompt.name)
            prompts[prompt.name] = entry

    result: dict[str, Any] = {"suite": sid, "seed": seed, "max_tokens": max_tokens, "temperature": 0.0,
                              "prompts": prompts, "changed": [], "unstable": unstable, "errors": errors}
    if errors:
        result.update(status="fail", summary=f"requests failed: {', '.join(errors)}")
        return result
    if unstable:
        result.update(status="fail", summary="not deterministic within this run: " + ", ".join(unstable),
                      diff=prompts[unstable[0]].get("repeat_diff"))
        return result

    prev = (previous or {}).get("determinism") or {}
    if not previous or not prev.get("prompts"):
        result.update(status="baseline", summary="first qualification of this lane: hashes recorded as the baseline")
        return result
    result["compared_to"] = previous.get("id")
    if prev.get("suite") != sid:
        result.update(status="baseline", summary=f"the suite changed since {previous.get('id')} "
                                                 f"({prev.get('suite')} -> {sid}): hashes recorded as a new baseline")
        return result
    changed = [name for name, e in prompts.items() if (prev["prompts"].get(name) or {}).get("hash") != e.get("hash")]
    result["changed"] = changed
    if not changed:
        result.update(status="pass", summary=f"{len(prompts)} prompts hash as in {previous.get('id')}")
        return result
    first_name = changed[0]
    old = prev["prompts"].get(first_name) or {}
    new = prompts[first_name]
    diff = text_diff(old.get("output", ""), new.get("output", ""), first_name)
    if not diff and old.get("completion_tokens") != new.get("completion_tokens"):
        diff = f"same text, token count {old.get('completion_tokens')} -> {new.get('completion_tokens')}"
    result["diff"] = diff
    if rebaseline:
        result.update(status="rebaselined", summary=f"outputs changed ({', '.join(changed)}); recorded as the new "
                                                    "baseline on request (--rebaseline)")
    else:
        result.update(status="fail", summary=f"outputs changed since {previous.get('id')}: {', '.join(changed)}")
    return result
