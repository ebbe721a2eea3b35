"""`gateway drift`: recent prefix-drift alerts of a running gateway, as a table (or JSON)."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ..admin_client import get_json
from ..cli import EXIT_UNREACHABLE, SUBCOMMANDS, CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drift", help="recent prefix-drift alerts: cause, message, tokens and seconds lost")
    p.add_argument("--url", default=os.environ.get("GATEWAY_URL", "http://127.0.0.1:8080"),
                   help="the gateway (default: $GATEWAY_URL or http://127.0.0.1:8080)")
    p.add_argument("--key", default=os.environ.get("GATEWAY_ADMIN_KEY"), help="admin key ($GATEWAY_ADMIN_KEY)")
    p.add_argument("--lane")
    p.add_argument("--cause")
    p.add_argument("--since", type=float, help="seconds back, e.g. 3600")
    p.add_argument("--min-tokens-lost", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_drift)


def cmd_drift(args: argparse.Namespace) -> int:
    query = {"limit": str(args.limit), "min_tokens_lost": str(args.min_tokens_lost)}
    for name in ("lane", "cause"):
        if getattr(args, name):
            query[name] = getattr(args, name)
    if args.since:
        query["since"] = f"{time.time() - args.since:.0f}"
    try:
        alerts = get_json(args.url, "/admin/drift", query, args.key)["alerts"]
    except (OSError, ValueError, KeyError, TypeError) as exc:  # unreachable, an HTTP error, not drift JSON
        raise CliError(f"{args.url}: {exc}", EXIT_UNREACHABLE) from None
    print(json.dumps(alerts, indent=2, ensure_ascii=False) if args.json else format_alerts(alerts))
    return 0


def format_alerts(alerts: list[dict[str, Any]]) -> str:
    if not alerts:
        return "no drift alerts"
    head = f"{'when':<19} {'lane':<14} {'conversation':<18} {'turn':>4} {'cause':<30} {'msg':>4} " \
           f"{'tokens lost':>11} {'s lost':>7} {'n':>3}"
    lines = [head, "-" * len(head)]
    for a in alerts:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["time"]))
        msg = "-" if a.get("message_index") is None else str(a["message_index"])
        lines.append(f"{when:<19} {a['lane'][:14]:<14} {str(a['conversation'])[:18]:<18} {a.get('turn') or 0:>4} "
                     f"{a['cause'][:30]:<30} {msg:>4} {a['tokens_lost']:>11} {a.get('seconds_lost') or 0:>7.2f} "
                     f"{a.get('count', 1):>3}")
        if a.get("snippet_before") or a.get("snippet_after"):
            lines.append(f"    before: {_clip(a.get('snippet_before'))}")
            lines.append(f"    after:  {_clip(a.get('snippet_after'))}")
    return "\n".join(lines)


def _clip(text: str | None, width: int = 100) -> str:
    text = (text or "").replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


SUBCOMMANDS.append(register)
