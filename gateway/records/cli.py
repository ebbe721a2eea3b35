"""`gateway stats`: the per-lane table over a time window, from the records file or a running gateway."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from ..admin_client import get_json
from ..cli import EXIT_UNREACHABLE, SUBCOMMANDS, CliError
from .stats import compute_stats, format_table, parse_window
from .store_sqlite import FILENAME, RecordReader


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="per-lane requests, latency, decode speed and cache hits over a window")
    p.add_argument("--window", default="1h", help="how far back: 90s, 15m, 1h, 7d (default 1h)")
    p.add_argument("--lane", default=None, help="only this lane")
    p.add_argument("--data-dir", default=os.environ.get("GATEWAY_DATA_DIR", "var"),
                   help=f"directory holding {FILENAME} (default: $GATEWAY_DATA_DIR or var)")
    p.add_argument("--url", default=None, help="ask a running gateway instead (e.g. http://127.0.0.1:8080)")
    p.add_argument("--key", default=os.environ.get("GATEWAY_ADMIN_KEY"),
                   help="admin key for --url (default: $GATEWAY_ADMIN_KEY)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_stats)


def cmd_stats(args: argparse.Namespace) -> int:
    try:
        window = parse_window(args.window)
    except ValueError:
        raise CliError(f"--window {args.window!r} is not like 90s, 15m, 1h or 7d") from None
    if args.url:
        try:
            stats = _from_url(args.url, window, args.lane, args.key)
        except (OSError, ValueError) as exc:  # unreachable, an HTTP error, or not JSON
            raise CliError(f"{args.url}: {exc}", EXIT_UNREACHABLE) from None
    else:
        try:
            stats = _from_file(Path(args.data_dir), window, args.lane)
        except (OSError, ValueError) as exc:  # sqlite3.Error is neither: a corrupt file is a user's input too
            raise CliError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - sqlite3.DatabaseError: not a records file
            raise CliError(f"{Path(args.data_dir) / FILENAME}: not a records file ({exc})") from None
    kv = _kv_from_url(args.url, args.lane, args.key) if args.url else None  # issue 20: the KV pools
    if args.json:
        print(json.dumps({**stats, "kv": kv} if kv else stats, indent=2))
    elif not stats["lanes"]:
        print(f"no records in the last {args.window}")
    else:
        print(format_table(stats))
    if kv and not args.json:
        from ..kvevents.report import format_kv

        print(format_kv(kv))
    return 0


def _kv_from_url(url: str, lane: str | None, key: str | None) -> dict[str, Any] | None:
    try:
        return get_json(url, "/admin/api/kv", {"lane": lane} if lane else {}, key)
    except (OSError, ValueError):
        return None  # a gateway without the KV-event part


def _from_file(data_dir: Path, window: float, lane: str | None) -> dict[str, Any]:
    path = data_dir / FILENAME
    if not path.exists():
        raise OSError(f"no records file at {path} (is --data-dir the gateway's data directory?)")
    reader = RecordReader(path, readonly=True)
    now = time.time()
    return compute_stats(reader.rows(now - window, lane), window, now)


def _from_url(url: str, window: float, lane: str | None, key: str | None) -> dict[str, Any]:
    query = {"window_s": f"{window:g}"}
    if lane:
        query["lane"] = lane
    return get_json(url, "/admin/api/stats", query, key)


SUBCOMMANDS.append(register)
