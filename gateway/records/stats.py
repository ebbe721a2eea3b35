"""Summaries of records: the per-lane table of `gateway stats`, and the admin page's chart series.

Pure functions over row dicts, so SQLite, the Redis stream and tests all feed the same code.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any, Iterable

from .record import quantile

# The columns a summary needs (the SQLite store selects only these).
STATS_COLUMNS = (
    "ts", "lane", "status", "cancelled", "stream", "ttfb_s", "ttft_s", "decode_tps", "gateway_s", "total_s",
    "prompt_tokens", "cached_tokens", "predicted_cached_tokens", "completion_tokens", "reasoning_tokens",
    "verdict", "cause", "tokens_lost", "seconds_lost", "effort_action", "limits_fired",
    "tenant", "client", "conversation",
)
LOSS_VERDICTS = ("drift", "eviction", "cold")  # cold with tokens lost: re-homed away from its cache

Row = dict[str, Any]


def lane_key(row: Row) -> str:
    return row.get("lane") or "(none)"


def is_error(row: Row) -> bool:
    """Failed answers: HTTP >= 400, except a client that went away (counted as cancelled)."""
    return (row.get("status") or 0) >= 400 and not row.get("cancelled") and row.get("status") != 499


def reports_cache(rows: Iterable[Row]) -> bool:
    """Whether these requests' engine reports cached tokens at all.

    SGLang sends `prompt_tokens_details: null` when nothing was cached, so once a lane has
    reported a count, its nulls mean 0; a lane that never reported one has no hit ratio.
    """
    return any(r.get("cached_tokens") is not None for r in rows)


def cached_of(row: Row, reports: bool) -> int | None:
    c = row.get("cached_tokens")
    if c is None and reports and row.get("prompt_tokens") is not None:
        return 0
    return c


def summarize(rows: list[Row], reports: bool | None = None) -> Row:
    """One lane's (or all lanes') figures over `rows`; `reports`: see reports_cache (None = decide here)."""
    if reports is None:
        reports = reports_cache(rows)
    n = errors = cancelled = 0
    ttft: list[float] = []
    ttfb: list[float] = []
    decode: list[float] = []
    gateway: list[float] = []
    prompt = prompt_reported = cached = predicted = completion = reasoning = 0
    predicted_n = 0
    verdicts: dict[str, int] = defaultdict(int)
    drift_lost: dict[str, int] = defaultdict(int)
    drift_seconds: dict[str, float] = defaultdict(float)
    eviction_lost = 0
    effort_rewrites = limits = 0
    for r in rows:
        n += 1
        if is_error(r):
            errors += 1
        if r.get("cancelled") or r.get("status") == 499:
            cancelled += 1
        ok = 0 < (r.get("status") or 0) < 400
        if ok and r.get("stream") and r.get("ttft_s") is not None:
            ttft.append(r["ttft_s"])
        if ok and r.get("ttfb_s") is not None:
            ttfb.append(r["ttfb_s"])
        if r.get("decode_tps") is not None:
            decode.append(r["decode_tps"])
        if r.get("gateway_s") is not None:
            gateway.append(r["gateway_s"])
        p = r.get("prompt_tokens") or 0
        prompt += p
        c = cached_of(r, reports)
        if c is not None:
            cached += c
            prompt_reported += p
        if r.get("predicted_cached_tokens") is not None:
            predicted += r["predicted_cached_tokens"]
            predicted_n += 1
        completion += r.get("completion_tokens") or 0
        reasoning += r.get("reasoning_tokens") or 0
        verdict = r.get("verdict") or "unknown"
        verdicts[verdict] += 1
        if verdict == "drift":
            cause = r.get("cause") or "unknown"
            drift_lost[cause] += r.get("tokens_lost") or 0
            drift_seconds[cause] += r.get("seconds_lost") or 0.0
        elif verdict == "eviction":
            eviction_lost += r.get("tokens_lost") or 0
        if r.get("effort_action") == "pinned":  # the gateway rewrote the request's effort
            effort_rewrites += 1
        if r.get("limits_fired"):
            limits += 1
    return {
        "requests": n,
        "errors": errors,
        "error_ratio": errors / n if n else None,
        "cancelled": cancelled,
        "ttft_p50_s": _q(ttft, 0.5),
        "ttft_p95_s": _q(ttft, 0.95),
        "ttfb_p50_s": _q(ttfb, 0.5),
        "decode_tps_p50": _q(decode, 0.5),
        "decode_tps_p10": _q(decode, 0.1),
        "gateway_p50_s": _q(gateway, 0.5),
        "prompt_tokens": prompt,
        "prompt_tokens_with_cache_report": prompt_reported,
        "cached_tokens": cached,
        "cache_hit_ratio": cached / prompt_reported if prompt_reported else None,
        "predicted_cached_tokens": predicted,
        "predicted_requests": predicted_n,
        "completion_tokens": completion,
        "reasoning_tokens": reasoning,
        "verdicts": dict(verdicts),
        "drift_tokens_lost": sum(drift_lost.values()),
        "drift_tokens_lost_by_cause": dict(sorted(drift_lost.items(), key=lambda kv: -kv[1])),
        "drift_seconds_lost_by_cause": dict(drift_seconds),
        "eviction_tokens_lost": eviction_lost,
        "effort_rewrites": effort_rewrites,
        "requests_with_limits": limits,
    }


def compute_stats(rows: list[Row], window_s: float, now: float | None = None) -> Row:
    """{"window_s", "since", "lanes": {lane: summary}, "total": summary}."""
    now = time.time() if now is None else now
    by_lane: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_lane[lane_key(r)].append(r)
    lanes = {lane: summarize(rs) for lane, rs in sorted(by_lane.items())}
    # The total's hit ratio covers the lanes that report caching, each judged on its own.
    reporting = {lane for lane, rs in by_lane.items() if reports_cache(rs)}
    total = summarize([r for r in rows if lane_key(r) not in reporting] +
                      [_as_reported(r) for r in rows if lane_key(r) in reporting], reports=False)
    return {"window_s": window_s, "since": now - window_s, "until": now, "lanes": lanes, "total": total}


def _as_reported(row: Row) -> Row:
    if row.get("cached_tokens") is None and row.get("prompt_tokens") is not None:
        return {**row, "cached_tokens": 0}
    return row


def series(rows: list[Row], window_s: float, buckets: int = 60, now: float | None = None,
           fit: bool = False) -> Row:
    """Per-lane time series for charts: cache-hit ratio by tokens, requests, p50 TTFT and decode speed.

    `fit`: start at the oldest row when it is younger than the window, so a gateway that has run
    for two minutes gets two minutes of fine buckets rather than one dot at the right edge.
    """
    now = time.time() if now is None else now
    buckets = max(1, min(buckets, 720))
    start = now - window_s
    if fit and rows:
        oldest = min(r["ts"] for r in rows)
        start = max(start, oldest - max(1.0, 0.02 * (now - oldest)))
        buckets = max(1, min(buckets, int(now - start)))  # at least a second per bucket
    width = (now - start) / buckets
    grid: dict[str, list[list[Row]]] = defaultdict(lambda: [[] for _ in range(buckets)])
    for r in rows:
        i = int((r["ts"] - start) / width)
        if 0 <= i < buckets:
            grid[lane_key(r)][i].append(r)
    lanes: dict[str, Row] = {}
    for lane, cells in sorted(grid.items()):
        out: dict[str, list[Any]] = defaultdict(list)
        reports = reports_cache(r for cell in cells for r in cell)
        for cell in cells:
            cached = [(r.get("prompt_tokens") or 0, cached_of(r, reports)) for r in cell]
            p = sum(pt for pt, c in cached if c is not None)
            c = sum(c for _, c in cached if c is not None)
            out["requests"].append(len(cell))
            out["errors"].append(sum(1 for r in cell if is_error(r)))
            out["hit_ratio"].append(c / p if p else None)
            out["tokens_lost"].append(sum(r.get("tokens_lost") or 0 for r in cell
                                          if r.get("verdict") in ("drift", "eviction")))
            ttft = sorted(r["ttft_s"] for r in cell if r.get("stream") and r.get("ttft_s") is not None
                          and 0 < (r.get("status") or 0) < 400)
            out["ttft_p50_s"].append(_q(ttft, 0.5, presorted=True))
            dec = sorted(r["decode_tps"] for r in cell if r.get("decode_tps") is not None)
            out["decode_tps_p50"].append(_q(dec, 0.5, presorted=True))
        lanes[lane] = dict(out)
    return {"start": start, "width_s": width, "buckets": buckets,
            "t": [start + i * width for i in range(buckets)], "lanes": lanes}


def decode_histogram(rows: list[Row], bins: int = 20) -> Row:
    """Decode tok/s distribution per lane on shared, round-numbered bin edges."""
    values: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("decode_tps") is not None:
            values[lane_key(r)].append(r["decode_tps"])
    allv = [v for vs in values.values() for v in vs]
    if not allv:
        return {"edges": [], "lanes": {}}
    lo, hi = min(allv), max(allv)
    # Bins no narrower than 2% of the top speed: 150.2 vs 150.9 tok/s is one bar, not two.
    step = _nice_step(max((hi - lo) / bins, 0.02 * hi, 0.1))
    first = math.floor(lo / step) * step
    n = max(1, math.ceil((hi - first) / step + 1e-9))
    if first + n * step <= hi:
        n += 1
    edges = [round(first + i * step, 6) for i in range(n + 1)]
    lanes: dict[str, list[int]] = {}
    for lane, vs in sorted(values.items()):
        counts = [0] * n
        for v in vs:
            counts[min(n - 1, int((v - first) / step))] += 1
        lanes[lane] = counts
    return {"edges": edges, "lanes": lanes}


def lost_by_cause(rows: list[Row]) -> Row:
    """Tokens and seconds lost per cause (drift causes, plus 'eviction'), split by lane."""
    tokens: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seconds: dict[str, float] = defaultdict(float)
    for r in rows:
        v = r.get("verdict")
        if v not in ("drift", "eviction"):
            continue
        cause = "eviction" if v == "eviction" else (r.get("cause") or "unknown")
        tokens[cause][lane_key(r)] += r.get("tokens_lost") or 0
        seconds[cause] += r.get("seconds_lost") or 0.0
    order = sorted(tokens, key=lambda c: -sum(tokens[c].values()))
    return {"causes": [{"cause": c, "tokens": sum(tokens[c].values()), "seconds": seconds[c],
                        "by_lane": dict(tokens[c])} for c in order]}


def loss_cause(row: Row) -> str:
    v = row.get("verdict")
    if v == "eviction":
        return "eviction"
    if v == "cold":
        return row.get("cause") or "rehomed"
    return row.get("cause") or "unknown"


def costs(rows: list[Row], window_s: float, buckets: int = 24, now: float | None = None, top: int = 10) -> Row:
    """Who is costing us prefill: tokens and seconds lost by cause, client, tenant and conversation,
    over time and in total, largest first. Only turns that lost tokens count."""
    now = time.time() if now is None else now
    lost = [r for r in rows if r.get("verdict") in LOSS_VERDICTS and (r.get("tokens_lost") or 0) > 0]
    start = now - window_s
    if lost:
        oldest = min(r["ts"] for r in lost)
        start = max(start, oldest - max(1.0, 0.02 * (now - oldest)))
    buckets = max(1, min(buckets, 240, max(1, int(now - start))))
    width = (now - start) / buckets

    def group(key) -> dict[str, Row]:
        out: dict[str, Row] = {}
        for r in lost:
            k = key(r)
            g = out.get(k)
            if g is None:
                g = out[k] = {"tokens": 0, "seconds": 0.0, "turns": 0, "conversations": set(),
                              "causes": defaultdict(int), "series": [0] * buckets}
            t = r.get("tokens_lost") or 0
            g["tokens"] += t
            g["seconds"] += r.get("seconds_lost") or 0.0
            g["turns"] += 1
            if r.get("conversation"):
                g["conversations"].add(r["conversation"])
            g["causes"][loss_cause(r)] += t
            i = int((r["ts"] - start) / width)
            if 0 <= i < buckets:
                g["series"][i] += t
        return out

    def ranked(groups: dict[str, Row], name: str, n: int) -> list[Row]:
        items = sorted(groups.items(), key=lambda kv: (-kv[1]["tokens"], kv[0]))[:n]
        return [{name: k, "tokens": g["tokens"], "seconds": round(g["seconds"], 3), "turns": g["turns"],
                 "conversations": len(g["conversations"]),
                 "top_cause": max(g["causes"].items(), key=lambda kv: kv[1])[0] if g["causes"] else None,
                 "series": g["series"]} for k, g in items]

    by_cause = ranked(group(loss_cause), "cause", 50)
    by_client = ranked(group(lambda r: r.get("client") or "unknown"), "client", top)
    by_tenant = ranked(group(lambda r: r.get("tenant") or "default"), "tenant", top)
    convs = group(lambda r: r.get("conversation") or "-")
    conv_meta = {}
    for r in lost:
        conv_meta[r.get("conversation") or "-"] = (r.get("tenant") or "default", r.get("client") or "unknown",
                                                   r.get("lane"))
    top_convs = ranked(convs, "conversation", top)
    for c in top_convs:
        c["tenant"], c["client"], c["lane"] = conv_meta.get(c["conversation"], (None, None, None))
        c.pop("series")
    return {
        "window_s": window_s, "start": start, "width_s": width, "buckets": buckets,
        "t": [start + i * width for i in range(buckets)],
        "total": {"tokens": sum(r.get("tokens_lost") or 0 for r in lost),
                  "seconds": round(sum(r.get("seconds_lost") or 0.0 for r in lost), 3), "turns": len(lost)},
        "by_cause": by_cause, "by_client": by_client, "by_tenant": by_tenant, "top_conversations": top_convs,
    }


def format_costs(c: Row, top: int = 5) -> str:
    """The "who is costing us prefill" part of `gateway stats`."""
    if not c["total"]["turns"]:
        return "no prefill lost in this window"
    lines = [f"prefill lost: {_tokens(c['total']['tokens'])} tokens, {_secs(c['total']['seconds'])} "
             f"over {c['total']['turns']} turns"]
    for title, key, rows in (("by cause", "cause", c["by_cause"]), ("top clients", "client", c["by_client"]),
                             ("top tenants", "tenant", c["by_tenant"]),
                             ("top conversations", "conversation", c["top_conversations"])):
        if not rows:
            continue
        lines.append(f"\n{title}:")
        for r in rows[:top]:
            extra = f"  mostly {r['top_cause']}" if key != "cause" and r.get("top_cause") else ""
            who = f"{r[key]} ({r['client']}, {r['tenant']})" if key == "conversation" else r[key]
            lines.append(f"  {str(who)[:48]:<48} {_tokens(r['tokens']):>9} tokens {_secs(r['seconds']):>9} "
                         f"{r['turns']:>5} turns{extra}")
    return "\n".join(lines)


def format_table(stats: Row) -> str:
    """The per-lane table `gateway stats` prints."""
    head = ["lane", "reqs", "errors", "ttft p50", "ttft p95", "decode p50", "cache hit", "drift lost", "evict lost"]
    lines = [head]
    items = list(stats["lanes"].items())
    if len(items) > 1:
        items.append(("ALL", stats["total"]))
    for lane, s in items:
        lines.append([
            lane, str(s["requests"]), _pct_n(s["errors"], s["error_ratio"]),
            _secs(s["ttft_p50_s"]), _secs(s["ttft_p95_s"]),
            "-" if s["decode_tps_p50"] is None else f"{s['decode_tps_p50']:.1f} tok/s",
            "-" if s["cache_hit_ratio"] is None else f"{100 * s['cache_hit_ratio']:.1f}%",
            _tokens(s["drift_tokens_lost"]), _tokens(s["eviction_tokens_lost"]),
        ])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
           for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    causes: dict[str, int] = defaultdict(int)
    for _, s in stats["lanes"].items():
        for cause, t in s["drift_tokens_lost_by_cause"].items():
            causes[cause] += t
    window = _window_text(stats["window_s"])
    text = f"last {window}\n" + "\n".join(out)
    if causes:
        text += "\n\ntokens lost to drift, by cause:\n" + "\n".join(
            f"  {c:<32} {_tokens(t):>10}" for c, t in sorted(causes.items(), key=lambda kv: -kv[1]))
    return text


def _q(values: list[float], q: float, presorted: bool = False) -> float | None:
    if not values:
        return None
    return quantile(values if presorted else sorted(values), q)


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _secs(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _tokens(v: int) -> str:
    if v >= 1_000_000:
        return f"{v / 1e6:.2f}M"
    if v >= 10_000:
        return f"{v / 1e3:.1f}K"
    return str(v)


def _pct_n(n: int, ratio: float | None) -> str:
    return f"{n}" if not n or ratio is None else f"{n} ({100 * ratio:.1f}%)"


def _window_text(s: float) -> str:
    if s % 86400 == 0:
        return f"{int(s // 86400)}d"
    if s % 3600 == 0:
        return f"{int(s // 3600)}h"
    if s % 60 == 0:
        return f"{int(s // 60)}m"
    return f"{s:g}s"


def parse_window(text: str) -> float:
    """'90s', '15m', '1h', '7d' or plain seconds."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)
