"""The `gateway` command: serve, demo, check, emulate, render, and the admin views."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

Command = Callable[[argparse.Namespace], int]


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--routes", default=os.environ.get("GATEWAY_ROUTES", "routes.yaml"), help="routes.yaml path")
    p.add_argument("--host", default=os.environ.get("GATEWAY_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GATEWAY_PORT", "8080")))
    p.add_argument("--workers", type=int, default=1, help="gateway processes (share state through --redis)")
    p.add_argument("--redis", default=os.environ.get("GATEWAY_REDIS_URL"), help="redis://... for shared state")
    p.add_argument("--data-dir", default=os.environ.get("GATEWAY_DATA_DIR", "var"))
    p.add_argument("--log-level", default=os.environ.get("GATEWAY_LOG_LEVEL", "info"))


def _export_env(args: argparse.Namespace) -> None:
    os.environ["GATEWAY_ROUTES"] = str(Path(args.routes).resolve())
    os.environ["GATEWAY_DATA_DIR"] = str(Path(args.data_dir).resolve())
    os.environ["GATEWAY_HOST"] = args.host
    os.environ["GATEWAY_PORT"] = str(args.port)
    os.environ["GATEWAY_LOG_LEVEL"] = args.log_level
    if args.redis:
        os.environ["GATEWAY_REDIS_URL"] = args.redis


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .config import ConfigError, load_routes

    from .serving import BODY_TIMEOUT_ENV, HEADER_TIMEOUT_ENV

    try:
        config = load_routes(args.routes)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _export_env(args)
    http = config.gateway.http
    # Read by gateway.serving when it is imported (here and in every worker process).
    os.environ[HEADER_TIMEOUT_ENV] = repr(http.header_timeout_s)
    os.environ[BODY_TIMEOUT_ENV] = repr(http.body_timeout_s)
    uvicorn.run(
        "gateway.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="gateway.serving:DeadlineHttpToolsProtocol",
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
        timeout_keep_alive=http.keep_alive_s,
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Serve with the built-in emulator standing in for every lane that declares `emulator:`."""
    from .config import ConfigError, load_routes

    try:
        config = load_routes(args.routes)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    children = start_emulators(config)
    print("\n  DEMO MODE: in-memory state, emulated upstreams, no API keys required.\n"
          f"  Try: curl -s http://{args.host}:{args.port}/v1/chat/completions -H 'Content-Type: application/json' "
          "-d '{\"model\": \"deepseek-v4-flash\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
          "\"stream\": true}'\n"
          f"  Admin page: http://{args.host}:{args.port}/admin\n", flush=True)
    try:
        return cmd_serve(args)
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=10)


def start_emulators(config) -> list[subprocess.Popen]:
    from urllib.parse import urlsplit

    children = []
    for name, lane in config.lanes.items():
        if lane.emulator is None:
            continue
        for url in lane.replicas:
            parts = urlsplit(url)
            knobs = {"flavour": lane.emulator.flavour, "model": lane.upstream_model, **lane.emulator.knobs}
            cmd = [sys.executable, "-m", "gateway.emulator", "--host", parts.hostname or "127.0.0.1",
                   "--port", str(parts.port or 80), "--config-json", json.dumps(knobs)]
            children.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent))
            _wait_http(url + "/v1/models", 20.0)
            print(f"  emulator for lane {name}: {url} ({lane.emulator.flavour})", flush=True)
    return children


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the gateway exits, however it exits (Linux)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback only
                if resp.status < 500:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up within {timeout:g}s")


def cmd_check(args: argparse.Namespace) -> int:
    from .config import ConfigError, load_routes

    try:
        config = load_routes(args.routes_file)
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {len(config.lanes)} lanes, {len(config.models)} models")
    for alias, lane in config.models.items():
        print(f"  {alias} -> {lane} ({config.lanes[lane].engine}, {len(config.lanes[lane].replicas)} replicas)")
    from .render.told import untold

    for name, lane_cfg in config.lanes.items():
        for problem in untold(lane_cfg):
            print(f"  warning: lanes.{name}.{problem}")
    for extra in CHECK_EXTRAS:
        extra(config, Path(args.routes_file))
    return 0


CHECK_EXTRAS: list[Callable] = []  # extra(config, routes_path): e.g. qualification state per lane


def cmd_emulate(args: argparse.Namespace) -> int:
    from .emulator import main as emulator_main

    return emulator_main(args.rest) or 0


def cmd_render(args: argparse.Namespace) -> int:
    from .config import load_routes
    from .render.cli import render_command
    from .render.options import options_for_lane

    config = load_routes(args.routes)
    lane = config.lanes.get(args.lane)
    if lane is None:
        print(f"error: no lane {args.lane!r} in {args.routes}", file=sys.stderr)
        return 2
    print(render_command(args.request, options_for_lane(lane), args.summary, lane=lane))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway")
    _serve_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="run the gateway with emulated demo lanes (quick start)")
    _serve_args(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("check", help="validate a routes.yaml without serving")
    p.add_argument("routes_file", nargs="?", default="routes.yaml")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("emulate", help="run the upstream emulator (see --help after 'emulate --')")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_emulate)

    p = sub.add_parser("render", help="print the prompt a lane's engine will see for a request")
    p.add_argument("request", help="a chat request JSON file")
    p.add_argument("--lane", required=True)
    p.add_argument("--routes", default=os.environ.get("GATEWAY_ROUTES", "routes.yaml"))
    p.add_argument("--summary", action="store_true", help="token count and per-message spans instead of the text")
    p.set_defaults(func=cmd_render)

    for register in SUBCOMMANDS:
        register(sub)
    return parser


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def main(argv: list[str] | None = None) -> int:
    _load_subcommands()
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


def _load_subcommands() -> None:
    """Admin views (stats, drift, qualify) live beside their features and register themselves."""
    import importlib

    for mod in ("gateway.records.cli", "gateway.conversations.cli", "gateway.qualify.cli"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod and not mod.startswith(str(exc.name)):
                raise


if __name__ == "__main__":
    # `python -m gateway.cli`: run the importable module's main, so that subcommands registered
    # by other modules (which import gateway.cli) land in the same registry.
    from gateway.cli import main as _main

    sys.exit(_main())
