"""Gate 2: the sink probe. Short greetings at temperature 0 and 1.0 must never come back empty."""

from __future__ import annotations

from typing import Any

from .client import LaneClient
from .progress import SILENT, Progress
from .suite import SINK_PROBES, SINK_TEMPERATURES


async def run_sink_probe(client: LaneClient, *, seed: int, max_tokens: int,
                         progress: Progress = SILENT) -> dict[str, Any]:
    probes: list[dict[str, Any]] = []
    failed: list[str] = []
    with progress.bar("sink probe", len(SINK_PROBES) * len(SINK_TEMPERATURES)) as bar:
        for temperature in SINK_TEMPERATURES:
            for text in SINK_PROBES:
                body = {"messages": [{"role": "user", "content": text}], "temperature": temperature,
                        "max_tokens": max_tokens, "seed": seed}
                r = await client.chat(body)
                bar.update()
                entry: dict[str, Any] = {"prompt": text, "temperature": temperature}
                if not r.ok:
                    entry.update(ok=False, why=f"request failed: {r.error}")
                elif not r.content.strip() and not r.tool_calls:
                    why = "empty completion" if not r.content else "whitespace-only completion"
                    if r.reasoning.strip():
                        why += " (reasoning only)"
                    entry.update(ok=False, why=why, completion_tokens=r.tokens, finish_reason=r.finish_reason)
                else:
                    entry.update(ok=True, chars=len(r.content), completion_tokens=r.tokens,
                                 finish_reason=r.finish_reason, sample=r.content[:80])
                if not entry["ok"]:
                    failed.append(f"{text!r} at temperature {temperature:g}: {entry['why']}")
                probes.append(entry)
    status = "fail" if failed else "pass"
    summary = ("; ".join(failed) if failed else
               f"{len(probes)} probes answered with text")
    return {"status": status, "summary": summary, "failed": failed, "probes": probes, "max_tokens": max_tokens}
