"""`gateway stats`: the per-lane table over a time window, from the records file or a running gateway."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from ..cli.admin_client import get_json
from ..cli.common import EXIT_UNREACHABLE, SUBCOMMANDS, CliError
from ..core.settings import Settings
from .query import Filters
from .stats import compute_stats, costs, format_costs, format_table, parse_window
from .store_sqlite import FILENAME, RecordReader


def register(sub: argparse._SubParsersAction, settings: Settings) -> None:
    p = sub.add_parser("stats", help="per-lane requests, latency, decode speed and cache hits over a window")
    p.add_argument("--window", default="1h", help="how far back: 90s, 15m, 1h, 7d (default 1h)")
    p.add_argument("--lane", default=None, help="only this lane")
    p.add_argument("--tenant", default=None, help="only this tenant")
    p.add_argument("--client", default=None, help="only this client program (user-agent name, e.g. opencode)")
    p.add_argument("--postgres", default=None,
                   help="read the fleet's records from this postgresql:// URL (default: the one routes.yaml "
                        "names under gateway.records, else the local file)")
    p.add_argument("--routes", default=str(settings.routes_path),
                   help="routes.yaml to find the records database in (default: $GATEWAY_ROUTES or routes.yaml)")
    p.add_argument("--data-dir", default=str(settings.data_dir),
                   help=f"directory holding {FILENAME} (default: $GATEWAY_DATA_DIR or var)")
    p.add_argument("--url", default=None, help="ask a running gateway instead (e.g. http://127.0.0.1:8080)")
    # A secret: read here, not held in Settings.
    p.add_argument("--key", default=os.environ.get("GATEWAY_ADMIN_KEY"),
                   help="admin key for --url (default: $GATEWAY_ADMIN_KEY)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_stats)


def cmd_stats(args: argparse.Namespace) -> int:
    try:
        window = parse_window(args.window)
    except ValueError:
        raise CliError(f"--window {args.window!r} is not like 90s, 15m, 1h or 7d") from None
    f = Filters(lane=args.lane or None, tenant=args.tenant or None, client=args.client or None)
    if args.url:
        try:
            stats = _from_url(args.url, window, f, args.key)
        except Exception as exc:  # noqa: BLE001 - unreachable, an HTTP error, not JSON: a message, not a traceback
            raise CliError(f"{args.url}: {exc}", EXIT_UNREACHABLE) from None
    else:
        try:
            stats = _from_reader(_reader(args), window, f)
        except Exception as exc:  # noqa: BLE001 - a missing or foreign records file, a database error
            raise CliError(str(exc)) from None
    kv = _kv_from_url(args.url, args.lane, args.key) if args.url else None  # the KV pools (KV-cache events)
    if args.json:
        print(json.dumps({**stats, "kv": kv} if kv else stats, indent=2))
    elif not stats["lanes"]:
        print(f"no records in the last {args.window}" + _scope(stats))
    else:
        print(format_table(stats) + _scope(stats))
        if stats.get("costs"):
            print("\n" + format_costs(stats["costs"]))
    if kv and not args.json:
        from ..kvevents.report import format_kv

        print(format_kv(kv))
    return 0


def _kv_from_url(url: str, lane: str | None, key: str | None) -> dict[str, Any] | None:
    try:
        return get_json(url, "/admin/api/kv", {"lane": lane} if lane else {}, key)
    except (OSError, ValueError):
        return None  # a gateway without the KV-event part


def _scope(stats: dict[str, Any]) -> str:
    src = stats.get("source") or {}
    if src.get("scope") == "fleet":
        return f"\n(every gateway writing to {src.get('database')})"
    return ""


def _reader(args: argparse.Namespace) -> Any:
    """The records database: --postgres, else the one routes.yaml names, else the local file."""
    url = args.postgres or _routes_postgres(args.routes)
    if url:
        from .store_postgres import PostgresReader, redact

        fleet = PostgresReader(url)
        fleet.source = {"backend": "postgres", "scope": "fleet", "database": redact(url)}
        return fleet
    path = Path(args.data_dir) / FILENAME
    if not path.exists():
        raise OSError(f"no records file at {path} (is --data-dir the gateway's data directory?)")
    reader = RecordReader(path, readonly=True)
    reader.source = {"backend": "sqlite", "scope": "host", "database": str(path)}
    return reader


def _routes_postgres(routes: str | None) -> str | None:
    if not routes or not Path(routes).is_file():
        return None
    from ..core.config import ConfigError, load_routes

    try:
        return load_routes(routes).gateway.records.postgres_url()
    except ConfigError:
        return None


def _from_reader(reader: Any, window: float, f: Filters) -> dict[str, Any]:
    now = time.time()
    rows = reader.rows(filters=f.with_(since=now - window))
    out = compute_stats(rows, window, now)
    out["costs"] = costs(rows, window, now=now)
    out["source"] = reader.source
    return out


def _from_url(url: str, window: float, f: Filters, key: str | None) -> dict[str, Any]:
    query = {"window_s": f"{window:g}"}
    for name in ("lane", "tenant", "client"):
        if getattr(f, name):
            query[name] = getattr(f, name)
    return get_json(url, "/admin/api/stats", query, key)


SUBCOMMANDS.append(register)
