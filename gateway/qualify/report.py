"""The human end of a run: a table per gate and per metric, and the state table for `--status`."""

from __future__ import annotations

import math
from typing import Any


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def render_record(rec: dict[str, Any]) -> str:
    ident = rec.get("identity") or {}
    verdict = "PASSED" if rec.get("passed") else "FAILED"
    out = [
        f"Qualification of lane {rec.get('lane')}: {verdict}",
        f"  record {rec.get('id') or '(not saved)'} · {rec.get('at')} · {rec.get('duration_s')} s · by {rec.get('by')}",
        f"  via {rec.get('via')}",
        f"  identity {rec.get('identity_hash', '')[:12]}: engine {ident.get('engine')} · model "
        f"{ident.get('upstream_model')} · revision {ident.get('revision') or 'unknown'} · "
        f"{len(ident.get('replicas') or ())} replica(s)",
        "",
    ]
    gates = [["determinism", rec["determinism"]["status"], rec["determinism"].get("summary", "")],
             ["sink probe", rec["sink"]["status"], rec["sink"].get("summary", "")],
             ["performance", rec["performance"]["status"], rec["performance"].get("summary", "")]]
    out.append(table(gates, ["gate", "status", "detail"]))

    det = rec["determinism"]
    rows = []
    for name, e in det.get("prompts", {}).items():
        mark = "changed" if name in det.get("changed", []) else ("unstable" if name in det.get("unstable", []) else
                                                                 ("error" if e.get("error") else "ok"))
        rows.append([name, e.get("hash", "-"), _fmt(e.get("completion_tokens")), _fmt(e.get("prompt_tokens")),
                     e.get("finish_reason") or "-", mark])
    if rows:
        out += ["", table(rows, ["prompt", "xxh3", "out tok", "prompt tok", "finish", "vs record"])]
    if det.get("diff"):
        out += ["", "first differing output:", det["diff"]]

    perf = rec["performance"]
    metrics = perf.get("metrics") or {}
    if metrics:
        rows = []
        for name, m in metrics.items():
            ci = m.get("ci95")
            ci_s = f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "-"
            pct = m.get("diff_pct")
            rows.append([name, m.get("unit", ""), _fmt(m.get("candidate")), _fmt(m.get("baseline")),
                         (f"{pct:+.1f}%" if pct is not None else "-"), ci_s, _fmt(m.get("drift")),
                         m.get("verdict", "-")])
        base = perf.get("baseline")
        title = f"A/B/A against {base['label']}" if base else "A/A: the candidate twice (no baseline)"
        out += ["", title + (f" ({perf['note']})" if perf.get("note") else ""),
                table(rows, ["metric", "unit", "candidate", "baseline", "diff", "95% CI of diff", "A-A drift",
                             "verdict"])]
    for f in rec.get("failures") or []:
        out.append(f"FAIL {f}")
    for w in rec.get("warnings") or []:
        out.append(f"note {w}")
    return "\n".join(out)


def render_states(states: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, s in states.items():
        reason = s.get("reason", "")
        if s.get("override") and s.get("state") == "qualified":
            reason += f" (override in routes.yaml, not needed: {s['override']})"
        rows.append([name, s.get("state", "?"), s.get("record") or "-", reason])
    return table(rows, ["lane", "qualification", "record", "reason"])
