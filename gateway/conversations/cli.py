"""`gateway drift`: the drift reviewers' morning: alerts of the whole fleet graded, triaged, acted on.

  gateway drift [--lane L] [--cause C] [--severity S] [--tenant T] [--client C] [--since 86400]
  gateway drift --session SESSION [--tenant T]   the alerts of the session a client calls SESSION
  gateway drift conversation SESSION [--tenant T]   its turns as a timeline
  gateway drift ack  --lane L --cause C --client C [--for 1d] [--note ...]
  gateway drift mute --lane L --cause C --client C [--for 7d] [--note ...]
  gateway drift rules | gateway drift unmute RULE_ID
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ..cli.admin_client import get_json, send_json
from ..cli.common import EXIT_UNREACHABLE, SUBCOMMANDS, CliError
from ..core.settings import Settings

ACTIONS = ("list", "conversation", "ack", "mute", "rules", "unmute")


def register(sub: argparse._SubParsersAction, settings: Settings) -> None:
    p = sub.add_parser("drift", help="prefix-drift alerts: severity, who can fix it, what to do; ack and mute",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", default="list", choices=ACTIONS)
    p.add_argument("target", nargs="?", help="conversation: the id or client key; unmute: the rule id")
    p.add_argument("--url", default=settings.url,
                   help="the gateway (default: $GATEWAY_URL or http://127.0.0.1:8080)")
    # A secret: read here, not held in Settings.
    p.add_argument("--key", dest="admin_key", default=os.environ.get("GATEWAY_ADMIN_KEY"),
                   help="admin key ($GATEWAY_ADMIN_KEY)")
    p.add_argument("--lane")
    p.add_argument("--cause")
    p.add_argument("--severity", choices=("critical", "major", "minor", "info"))
    p.add_argument("--group", choices=("actionable", "unavoidable", "repin"))
    p.add_argument("--tenant")
    p.add_argument("--client", help="client program (user-agent name, e.g. opencode)")
    p.add_argument("--user-agent", help="a part of the User-Agent header")
    p.add_argument("--conversation-key", "--session", dest="conv_key",
                   help="the client's own conversation key (hashed like the gateway does)")
    p.add_argument("--since", type=float, default=86400, help="seconds back (default 86400)")
    p.add_argument("--until", type=float, help="seconds back the window ends")
    p.add_argument("--all", action="store_true", help="list muted alerts too")
    p.add_argument("--for", dest="duration", default=None, help="ack/mute expiry: 90m, 12h, 7d (ack 1d, mute 7d)")
    p.add_argument("--note", default=None)
    p.add_argument("--min-tokens-lost", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_drift)


def cmd_drift(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            return _list(args)
        if args.action == "conversation":
            if not args.target:
                raise ValueError("gateway drift conversation needs the conversation's id or client key")
            conv = get_json(args.url, "/admin/api/conversations/" + _quote(args.target),
                            {"tenant": args.tenant} if args.tenant else {}, args.admin_key)
            print(json.dumps(conv, indent=2, ensure_ascii=False) if args.json else format_timeline(conv))
            return 0
        if args.action in ("ack", "mute"):
            from ..records.stats import parse_window

            body: dict[str, Any] = {"kind": args.action, "lane": args.lane or "*", "cause": args.cause or "*",
                                    "client": args.client or "*", "note": args.note,
                                    "author": os.environ.get("USER") or None}  # the login's (POSIX)
            body["expires_in_s"] = parse_window(args.duration or ("1d" if args.action == "ack" else "7d"))
            rule = send_json(args.url, "POST", "/admin/api/triage", body, args.admin_key)
            print(json.dumps(rule, indent=2) if args.json else
                  f"{rule['kind']} {rule['id']}: lane={rule['lane']} cause={rule['cause']} client={rule['client']} "
                  f"until {_when(rule['until'])}")
            return 0
        if args.action == "rules":
            rules = get_json(args.url, "/admin/api/triage", {}, args.admin_key)["rules"]
            print(json.dumps(rules, indent=2) if args.json else format_rules(rules))
            return 0
        if not args.target:
            raise ValueError("gateway drift unmute needs the rule id (see gateway drift rules)")
        send_json(args.url, "DELETE", "/admin/api/triage/" + _quote(args.target), None, args.admin_key)
        print(f"removed {args.target}")
        return 0
    except OSError as exc:  # unreachable, or an HTTP error
        raise CliError(f"{args.url}: {exc}", EXIT_UNREACHABLE) from None
    except (ValueError, KeyError) as exc:  # a missing argument, or an answer that is not the expected JSON
        raise CliError(str(exc)) from None


def _list(args: argparse.Namespace) -> int:
    query = {"limit": str(args.limit), "window_s": f"{max(60.0, args.since):g}", "since": f"{-args.since:g}"}
    if args.until:
        query["until"] = f"{-args.until:g}"
    for name in ("lane", "cause", "severity", "group", "tenant", "client", "user_agent"):
        if getattr(args, name):
            query[name] = getattr(args, name)
    if args.conv_key:
        query["conversation_key"] = args.conv_key
    if args.all:
        query["show"] = "all"
    data = get_json(args.url, "/admin/api/alerts", query, args.admin_key)
    if args.min_tokens_lost:
        data["alerts"] = [a for a in data["alerts"] if a["tokens_lost_total"] >= args.min_tokens_lost]
    print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else format_review(data))
    return 0


GROUP_TITLES = {
    "actionable": "ACTIONABLE (client or lane config can fix these)",
    "unavoidable": "UNAVOIDABLE BY DESIGN (not paging)",
    "repin": "DELIBERATE RE-PINS (X-Gateway-Repin: asked for, not paging)",
}


def format_review(data: dict[str, Any]) -> str:
    alerts = data.get("alerts") or []
    c = data.get("counts") or {}
    src = data.get("source") or {}
    scope = "the whole fleet" if src.get("scope") == "fleet" else "this host"
    head = (f"{len(alerts)} alert(s) over {scope}: {c.get('paging', 0)} paging · "
            f"{c.get('critical', 0)} critical · {c.get('major', 0)} major · {c.get('minor', 0)} minor · "
            f"{c.get('info', 0)} info · {c.get('acknowledged', 0)} acknowledged · {c.get('muted', 0)} muted (hidden)")
    if not alerts:
        return head + "\nno drift alerts"
    out = [head]
    pats = [p for p in data.get("patterns") or [] if p.get("group") == "actionable"][:5]
    if pats:
        out.append("")
        out.append("PATTERNS (lane · cause · client, what to mute or forward)")
        for p in pats:
            out.append(f"  {p['severity']:<8} {p['lane']} · {p['cause']} · {p['client']}: "
                       f"{p['conversations']} conversation(s), {p['turns']} turn(s), "
                       f"{_tokens(p['tokens_lost'])} tokens, {p['seconds_lost']:.1f} s"
                       + (f" [{p['state']}]" if p.get("state") else ""))
    for group in ("actionable", "unavoidable", "repin"):
        items = [a for a in alerts if a["group"] == group]
        if not items:
            continue
        out.append("")
        out.append(GROUP_TITLES[group])
        for a in items:
            flag = "PAGE" if a["pages"] else (a["state"] or "").upper()[:5]
            msg = "-" if a.get("message_index") is None else str(a["message_index"])
            out.append(f"  [{a['severity'].upper():<8}] {flag:<5} {a['cause']} · lane {a['lane']} "
                       f"· client {a['client']} · tenant {a['tenant']} · fix: {a['fixable_by']}")
            out.append(f"      conv {a['conversation']} turn {a.get('turn') or 0} msg {msg} "
                       f"field {a.get('field') or '-'} · ×{a['count']} · {_tokens(a['tokens_lost_total'])} tokens, "
                       f"{a['seconds_lost_total']:.1f} s lost · last {_when(a['time'])}")
            out.append(f"      → {a['remedy']}")
            if a.get("snippet_before") or a.get("snippet_after"):
                out.append(f"      before: {_clip(a.get('snippet_before'))}")
                out.append(f"      after:  {_clip(a.get('snippet_after'))}")
    return "\n".join(out)


def format_alerts(alerts: list[dict[str, Any]]) -> str:
    """The older per-gateway table (GET /admin/drift)."""
    return format_review({"alerts": [{"group": "actionable", "pages": False, "state": None, "fixable_by": "?",
                                      "remedy": "", "client": "?", "tenant": "?", "tokens_lost_total": 0,
                                      "seconds_lost_total": 0.0, "count": 1, **a} for a in alerts]})


def format_rules(rules: list[dict[str, Any]]) -> str:
    if not rules:
        return "no acknowledgements or mutes in force"
    return "\n".join(f"{r['id']}  {r['kind']:<4} lane={r['lane']} cause={r['cause']} client={r['client']} "
                     f"until {_when(r['until'])}" + (f"  ({r['note']})" if r.get("note") else "") for r in rules)


def format_timeline(conv: dict[str, Any]) -> str:
    t = conv["totals"]
    out = [f"conversation {conv['conversation']}"
           + (f" (client key {conv['looked_up_as']!r})" if conv.get("looked_up_as") else "")
           + f" · lane {conv['lane']} · client {conv['client']} · tenant {conv['tenant']}",
           f"{t['turns']} turns · {t['drifts']} drifts · {_tokens(t['tokens_lost'])} tokens, "
           f"{t['seconds_lost']:.1f} s lost",
           f"{'turn':>4} {'time':<8} {'verdict':<9} {'cause':<28} {'pred':>8} {'cached':>8} {'lost':>8} "
           f"{'effort':<10} {'replica':<22} {'ttft':>7} {'tok/s':>7}"]
    for r in conv["turns"]:
        effort = str(r.get("effort_applied") or "-")
        if r.get("effort_action") in ("pinned", "repinned", "warned"):
            effort += f" ({r['effort_action']})"
        out.append(f"{r.get('turn') or 0:>4} {time.strftime('%H:%M:%S', time.localtime(r['ts'])):<8} "
                   f"{r.get('verdict') or '-':<9} {(r.get('cause') or '-')[:28]:<28} "
                   f"{_num(r.get('predicted_cached_tokens')):>8} {_num(r.get('cached_tokens')):>8} "
                   f"{_num(r.get('tokens_lost')):>8} {effort[:10]:<10} {(r.get('replica') or '-')[-22:]:<22} "
                   f"{_secs(r.get('ttft_s')):>7} {_num(r.get('decode_tps'), 1):>7}")
        if r.get("verdict") == "drift":
            out.append(f"       at message {r.get('divergence_message_index')} field {r.get('divergence_field') or '-'}"
                       f" → {r.get('remedy') or ''}")
            out.append(f"       before: {_clip(r.get('diff_before'))}")
            out.append(f"       after:  {_clip(r.get('diff_after'))}")
    return "\n".join(out)


def _quote(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _tokens(v: int) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1_000_000 else f"{v / 1e3:.1f}K" if v >= 10_000 else str(v)


def _num(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if digits else str(v)


def _secs(v: float | None) -> str:
    return "-" if v is None else (f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s")


def _clip(text: str | None, width: int = 100) -> str:
    text = (text or "").replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


SUBCOMMANDS.append(register)
