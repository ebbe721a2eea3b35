"""The KV-pool section of `gateway stats --url ...`: per replica, the stream, the pool, the working set,
the forecast and the alert, from GET /admin/api/kv."""

from __future__ import annotations

import time
from typing import Any


def _k(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    return f"{n / 1000:.1f}K" if abs(n) >= 1000 else str(int(n))


def format_kv(view: dict[str, Any]) -> str:
    reps = view.get("replicas") or []
    if not reps:
        return ""
    now = view.get("now") or time.time()
    lines = ["", "KV pools (from the engines' KV-cache events)",
             f"{'lane':<16} {'replica':<28} {'stream':<8} {'pool':>7} {'held':>7} {'occ':>5} {'working':>8} "
             f"{'live':>4} {'tok/s':>7} {'evict?':>6}"]
    for r in reps:
        occ = r.get("occupancy")
        lines.append(f"{r['lane'][:16]:<16} {r['replica'][-28:]:<28} {r['stream']['state']:<8} "
                     f"{_k(r.get('pool_tokens')):>7} {_k(r.get('held_tokens')):>7} "
                     f"{'-' if occ is None else f'{occ:.0%}':>5} {_k(r.get('working_set_tokens')):>8} "
                     f"{r.get('live_conversations', 0):>4} {r.get('new_tokens_per_s', 0):>7} "
                     f"{r.get('forecast_evictions', 0):>6}")
        s = r["stream"]
        if s["state"] != "live":
            lines.append(f"  ! stream {s['state']} for {now - s['since']:.0f}s ({s['endpoint']}): "
                         "verdicts fall back to counts")
        if s.get("unfilled"):
            lines.append(f"  ! {s['unfilled']} event batches lost (gaps the replay could not fill)")
        alert = r.get("alert")
        if alert:
            opts = alert["options"]
            lines.append(f"  ALERT {alert['message']}")
            lines.append(f"    add capacity: +{_k(opts['add_capacity_tokens'])} tokens; or cap concurrent long "
                         f"sessions at {opts['cap_concurrent_long_sessions']}; or move: "
                         + (", ".join(f"{m['conversation']} -> {m['to']}" for m in opts.get("move_to") or [])
                            or ", ".join(opts["move_conversations"][:3]) + " (no replica of the lane has room)"))
        for f in r.get("forecast") or []:
            if f["will_be_evicted"]:
                eta = f["evicted_in_s"]
                lines.append(f"  forecast: {f['conversation']} ({_k(f['tokens'])} tokens) evicted before its next "
                             f"turn ({'already' if eta == 0 else 'in ~%ss' % eta if eta is not None else 'soon'})")
    return "\n".join(lines)
