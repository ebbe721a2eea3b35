"""Drift alerts: one per conversation and cause, deduplicated with a count, kept with retention.

Two views: `AlertBook` keeps the alerts of this gateway's state store (`GET /admin/drift`); `review`
builds the reviewers' view from the request records (fleet-wide when records are in PostgreSQL):
severity from tokens and seconds lost and how often, who can fix it and what to do (remedies.py),
unavoidable causes and deliberate re-pins grouped apart and never paging, acknowledge and mute.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ..core.exchange import Exchange
from ..core.verdict import CacheVerdict
from ..store import StateStore
from .causes import fixer
from .drift import Divergence
from .remedies import REPIN, remedy_for

INDEX = "alerts"


def severity(tokens_lost: int) -> str:
    if tokens_lost >= 100_000:
        return "critical"
    if tokens_lost >= 10_000:
        return "major"
    if tokens_lost >= 1_000:
        return "minor"
    return "info"


class AlertBook:
    def __init__(self, store: StateStore, retention_s: float = 7 * 86400, max_alerts: int = 5000) -> None:
        self.store = store
        self.retention_s = retention_s
        self.max_alerts = max_alerts
        self.raised = 0

    async def raise_alert(self, ex: Exchange, lane: str, div: Divergence, cache: CacheVerdict,
                          snippets: tuple[str, str] | None) -> dict[str, Any]:
        key = f"alert:{ex.conversation_id}:{div.cause}"
        now = time.time()
        if snippets:  # the record keeps them too, for the fleet's alert view and the conversation page
            cache.snippet_before, cache.snippet_after = snippets
        raw = await self.store.get(key)
        previous = orjson.loads(raw) if raw else None
        tokens_lost = cache.tokens_lost
        alert = {
            "id": key.removeprefix("alert:"),
            "time": now,
            "first_seen": previous["first_seen"] if previous else now,
            "count": (previous["count"] + 1) if previous else 1,
            "lane": lane,
            "tenant": ex.tenant,
            "model": ex.public_model,
            "conversation": ex.conversation_id,
            "turn": ex.turn,
            "request_id": ex.request_id,
            "cause": div.cause,
            "fixable_by": fixer(div.cause),
            "message_index": div.message_index,
            "field": div.field,
            "tokens_lost": tokens_lost,
            "tokens_lost_total": (previous.get("tokens_lost_total", 0) if previous else 0) + tokens_lost,
            "seconds_lost": cache.seconds_lost,
            "severity": severity(tokens_lost),
            **_advice(div.cause, ex.effort_action == "repinned", ex.path),
            "snippet_before": snippets[0] if snippets else None,
            "snippet_after": snippets[1] if snippets else None,
        }
        await self.store.set(key, orjson.dumps(alert), self.retention_s)
        await self.store.index_add(INDEX, key, now, self.max_alerts)
        self.raised += 1
        return alert

    async def list(self, *, lane: str | None = None, cause: str | None = None, since: float | None = None,
                   min_tokens_lost: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        keys = await self.store.index_newest(INDEX, min(self.max_alerts, max(limit * 4, 200)))
        out = []
        for raw in await self.store.mget(keys) if keys else []:
            if raw is None:
                continue
            a = orjson.loads(raw)
            if lane and a["lane"] != lane or cause and a["cause"] != cause:
                continue
            if since and a["time"] < since or a["tokens_lost"] < min_tokens_lost:
                continue
            out.append(a)
            if len(out) >= limit:
                break
        return out


# -- the reviewers' view: alerts read from the records (the whole fleet with PostgreSQL) ---------

# The record columns an alert needs.
ALERT_COLUMNS = (
    "ts", "request_id", "gateway", "lane", "model", "tenant", "client", "user_agent", "conversation",
    "conversation_source", "turn", "verdict", "cause", "divergence_message_index", "divergence_field",
    "diff_before", "diff_after", "tokens_lost", "seconds_lost", "prompt_tokens", "cached_tokens",
    "predicted_cached_tokens", "effort_requested", "effort_applied", "effort_action", "replica", "path",
)
SEVERITIES = ("critical", "major", "minor", "info")
GROUPS = ("actionable", "unavoidable", "repin")
PAGING = ("critical", "major")


def grade(tokens_total: int, seconds_total: float, count: int, per_hour: float) -> tuple[str, str]:
    """Severity from what was lost and how often, with the reason in words.

    One agent turn of a 400K-token session re-prefilled costs ~100 s on a busy lane: that alone is
    critical. A cause that keeps coming back (5+ times, or 3+ an hour) is at least major even when
    each loss is small: it will keep costing until someone fixes it.
    """
    why = f"{_n(tokens_total)} tokens, {seconds_total:.1f} s prefill lost over {count} turn{'s' if count != 1 else ''}"
    if tokens_total >= 200_000 or seconds_total >= 60:
        return "critical", why
    if tokens_total >= 20_000 or seconds_total >= 10 or (count >= 5 and tokens_total >= 2_000) or per_hour >= 3:
        return "major", why + (f", {per_hour:.1f}/h" if per_hour >= 3 else "")
    if tokens_total >= 2_000 or count >= 2:
        return "minor", why
    return "info", why


def rule_matches(rule: dict[str, Any], lane: str | None, cause: str | None, client: str | None) -> bool:
    for field, value in (("lane", lane), ("cause", cause), ("client", client)):
        want = rule.get(field)
        if want not in (None, "", "*") and want != value:
            return False
    return True


def review(rows: list[dict[str, Any]], rules: list[dict[str, Any]], now: float | None = None,
           severity: str | None = None, group: str | None = None, show: str = "open",
           limit: int = 200) -> dict[str, Any]:
    """Group drift records into alerts (one per conversation and cause), grade and triage them.

    `show`: "open" hides muted alerts (they are counted), "all" lists them too.
    """
    now = time.time() if now is None else now
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:  # oldest first: the last row of a group is its latest occurrence
        if r.get("verdict") != "drift":
            continue
        cause = r.get("cause") or "unknown"
        key = (r.get("conversation") or r.get("request_id") or "-", cause)
        a = by_key.get(key)
        if a is None:
            a = by_key[key] = {"first_seen": r["ts"], "count": 0, "tokens_lost_total": 0, "seconds_lost_total": 0.0,
                               "repins": 0}
        a["count"] += 1
        a["tokens_lost_total"] += r.get("tokens_lost") or 0
        a["seconds_lost_total"] += r.get("seconds_lost") or 0.0
        a["repins"] += r.get("effort_action") == "repinned"
        a["last"] = r
    counts = {"muted": 0, "acknowledged": 0, "paging": 0, **{g: 0 for g in GROUPS}, **{s: 0 for s in SEVERITIES}}
    patterns: dict[tuple[str, str, str], dict[str, Any]] = {}
    order = {s: i for i, s in enumerate(SEVERITIES)}
    live = [rule for rule in rules if rule.get("until", 0) > now]
    # Grade and triage every group, but build the full alert only for those listed: an alert built for
    # a group that is not listed is work thrown away, and a fleet's rows make tens of thousands of groups.
    listed: list[tuple[tuple, tuple]] = []
    for (cid, cause), a in by_key.items():
        r = a["last"]
        repinned = r.get("effort_action") == "repinned"
        rem = remedy_for(cause, repinned, r.get("path"))
        grp = group_of(rem)
        per_hour = a["count"] / max((r["ts"] - a["first_seen"]) / 3600, 1.0)
        sev, why = grade(a["tokens_lost_total"], a["seconds_lost_total"], a["count"], per_hour)
        client = r.get("client") or "unknown"
        lane = r.get("lane")
        state, rule_ref = None, None
        for rule in live:
            if not rule_matches(rule, lane, cause, client):
                continue
            if rule.get("kind") == "mute":
                state, rule_ref = "muted", rule
                break
            if rule.get("kind") == "ack" and r["ts"] <= (rule.get("created") or 0) and state is None:
                state, rule_ref = "acknowledged", rule
        pages = sev in PAGING and grp == "actionable" and state is None
        p = patterns.get((lane or "-", cause, client))
        if p is None:
            p = patterns[(lane or "-", cause, client)] = {
                "lane": lane, "cause": cause, "client": client, "title": rem.title, "fixable_by": rem.fixable_by,
                "remedy": rem.remedy, "group": grp, "conversations": 0, "turns": 0, "tokens_lost": 0,
                "seconds_lost": 0.0, "first": a["first_seen"], "last": 0.0, "state": state}
        p["conversations"] += 1
        p["turns"] += a["count"]
        p["tokens_lost"] += a["tokens_lost_total"]
        p["seconds_lost"] += a["seconds_lost_total"]
        p["last"] = max(p["last"], r["ts"])
        p["first"] = min(p["first"], a["first_seen"])
        if severity and sev != severity or group and grp != group:
            continue
        if state == "muted":
            counts["muted"] += 1
            if show != "all":
                continue
        counts["acknowledged"] += state == "acknowledged"
        counts[grp] += 1
        counts[sev] += 1
        counts["paging"] += pages
        rank = (not pages, grp != "actionable", order[sev], -a["tokens_lost_total"], -r["ts"])
        listed.append((rank, (cid, cause, a, rem, grp, sev, why, per_hour, state, rule_ref, pages, repinned)))
    listed.sort(key=lambda item: item[0])
    alerts = [_alert(*item[1]) for item in listed[:limit]]
    pats = sorted(patterns.values(), key=lambda p: -p["tokens_lost"])[:50]
    for p in pats:
        p["seconds_lost"] = round(p["seconds_lost"], 3)
        p["per_hour"] = round(p["turns"] / max((p["last"] - p["first"]) / 3600, 1.0), 2)
        p["severity"] = grade(p["tokens_lost"], p["seconds_lost"], p["turns"], p["per_hour"])[0]
    return {"alerts": alerts, "counts": counts, "patterns": pats, "rules": rules, "now": now}


def _alert(cid: str, cause: str, a: dict[str, Any], rem: Any, grp: str, sev: str, why: str, per_hour: float,
           state: str | None, rule_ref: dict[str, Any] | None, pages: bool, repinned: bool) -> dict[str, Any]:
    r = a["last"]
    return {
        "id": f"{cid}:{cause}",
        "conversation": cid,
        "conversation_source": r.get("conversation_source"),
        "tenant": r.get("tenant") or "default",
        "client": r.get("client") or "unknown",
        "user_agent": r.get("user_agent"),
        "lane": r.get("lane"),
        "model": r.get("model"),
        "gateway": r.get("gateway"),
        "replica": r.get("replica"),
        "cause": cause,
        "title": rem.title,
        "fixable_by": rem.fixable_by,
        "remedy": rem.remedy,
        "group": grp,
        "severity": sev,
        "severity_reason": why,
        "pages": pages,
        "state": state,
        "rule": {k: rule_ref.get(k) for k in ("id", "kind", "until", "note", "author")} if rule_ref else None,
        "time": r["ts"],
        "first_seen": a["first_seen"],
        "count": a["count"],
        "per_hour": round(per_hour, 2),
        "turn": r.get("turn"),
        "request_id": r.get("request_id"),
        "message_index": r.get("divergence_message_index"),
        "field": r.get("divergence_field"),
        "tokens_lost": r.get("tokens_lost") or 0,
        "seconds_lost": r.get("seconds_lost") or 0.0,
        "tokens_lost_total": a["tokens_lost_total"],
        "seconds_lost_total": round(a["seconds_lost_total"], 3),
        "effort_requested": r.get("effort_requested"),
        "effort_applied": r.get("effort_applied"),
        "effort_action": r.get("effort_action"),
        "repinned": repinned,
        "snippet_before": r.get("diff_before"),
        "snippet_after": r.get("diff_after"),
    }


def _advice(cause: str, repinned: bool, path: str | None = None) -> dict[str, Any]:
    rem = remedy_for(cause, repinned, path)
    return {"title": rem.title, "fixable_by": rem.fixable_by, "remedy": rem.remedy, "repinned": repinned,
            "group": group_of(rem)}


def group_of(rem: Any) -> str:
    return "repin" if rem is REPIN else ("unavoidable" if rem.fixable_by == "nobody" else "actionable")


def _n(v: int) -> str:
    if v >= 1_000_000:
        return f"{v / 1e6:.2f}M"
    if v >= 10_000:
        return f"{v / 1e3:.1f}K"
    return str(v)
