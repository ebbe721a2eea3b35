"""The `gateway` command: serve, demo, check, emulate, render, and the admin views.

Exit status (every subcommand; the README has the table):
  0  done
  1  the command ran and found a problem: a lane would be refused or a probe disagrees (check),
     a gate failed (qualify), a lane is refused (qualify --status)
  2  usage or input error: a bad option, a missing or unreadable file, invalid JSON or YAML, a
     routes.yaml that does not validate, an unknown lane, a template that does not exist
  3  unreachable: a URL (gateway, replica, Redis) did not answer, answered with an error, or a
     port could not be opened
  130 interrupted
User errors print one line on stderr: `gateway <command>: error: <what>`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..core.settings import Settings, SettingsError
from .common import (  # noqa: F401 - the shared parts, also read through this module
    CHECK_EXTRAS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    SUBCOMMANDS,
    CliError,
    Command,
    Parser,
    load_config,
    read_json_file,
)


def _serve_args(p: argparse.ArgumentParser, settings: Settings) -> None:
    p.add_argument("--routes", default=str(settings.routes_path), help="routes.yaml path")
    p.add_argument("--host", default=settings.host)
    p.add_argument("--port", type=int, default=settings.port)
    p.add_argument("--workers", type=int, default=1, help="gateway processes (share state through --redis)")
    p.add_argument("--redis", default=settings.redis_url, help="redis://... for shared state")
    p.add_argument("--data-dir", default=str(settings.data_dir))
    p.add_argument("--log-level", default=settings.log_level,
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    p.add_argument("--no-access-log", action="store_true", help="no per-request access log line")
    p.add_argument("--access-log-format", choices=("json", "text"), default=settings.access_log.format)
    p.add_argument("--access-log-sample", type=float, default=None,
                   help="share of successful requests logged (errors always are); default 1")


def _export_env(args: argparse.Namespace) -> None:
    """The options, for the Settings of every gateway process uvicorn starts (Settings reads the environment)."""
    os.environ["GATEWAY_ROUTES"] = str(Path(args.routes).resolve())
    os.environ["GATEWAY_DATA_DIR"] = str(Path(args.data_dir).resolve())
    os.environ["GATEWAY_HOST"] = args.host
    os.environ["GATEWAY_PORT"] = str(args.port)
    os.environ["GATEWAY_LOG_LEVEL"] = args.log_level
    if args.redis:
        os.environ["GATEWAY_REDIS_URL"] = args.redis
    if getattr(args, "no_access_log", False):
        os.environ["GATEWAY_ACCESS_LOG"] = "0"
    if getattr(args, "access_log_format", None):
        os.environ["GATEWAY_ACCESS_LOG_FORMAT"] = args.access_log_format
    if getattr(args, "access_log_sample", None) is not None:
        os.environ["GATEWAY_ACCESS_LOG_SAMPLE"] = str(args.access_log_sample)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .check import compile_templates
    from .. import process_switches

    process_switches.apply(args.settings)  # this process serves too (one worker): before templates load
    config = load_config(args.routes)
    compile_templates(config, args.routes)
    _check_keys(config, args.routes, args.settings.production)
    if args.workers < 1:
        raise CliError("--workers must be at least 1")
    if args.workers > 1 and not args.redis:
        print(f"gateway serve: warning: --workers {args.workers} without --redis: each process keeps its own "
              "conversation state (pins, drift, homes)", file=sys.stderr)
    _check_port_free(args.host, args.port)
    _check_data_dir(args.data_dir)
    if args.redis:
        _check_redis(args.redis)
    _export_env(args)
    http = config.gateway.http
    # routes.yaml's deadlines, for the Settings of every gateway process (gateway/server/serving.py).
    os.environ["GATEWAY_HEADER_TIMEOUT_S"] = repr(http.header_timeout_s)
    os.environ["GATEWAY_BODY_TIMEOUT_S"] = repr(http.body_timeout_s)
    uvicorn.run(
        "gateway.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="gateway.server.serving:DeadlineHttpToolsProtocol",
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
        timeout_keep_alive=http.keep_alive_s,
    )
    return 0


def _check_keys(config, routes: str, production: bool) -> None:
    from ..server.security import SecurityConfigError, check_keys

    try:
        check_keys(config, routes, production)
    except SecurityConfigError as exc:
        raise CliError(str(exc)) from None


def _check_redis(url: str) -> None:
    """A malformed URL refuses the start; an unreachable Redis is a warning (the gateway runs on its own
    memory and retries, as during any Redis outage), said once here rather than only in the log."""
    from urllib.parse import urlsplit

    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise CliError(f"--redis {url!r} is not a redis://, rediss:// or unix:// URL")
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        client.ping()
        client.close()
    except (redis.RedisError, ValueError, OSError) as exc:
        print(f"gateway serve: warning: Redis at {url} does not answer ({exc}); state stays in this process's "
              "memory until it does", file=sys.stderr)


def _check_port_free(host: str, port: int) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind((host, port))
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_UNREACHABLE) from None


def _check_data_dir(data_dir: str) -> None:
    path = Path(data_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create the data directory {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliError(f"the data directory {path} is not writable by this user")


def demo_routes() -> str:
    """routes.yaml of the working folder, else the demo shipped in the package (gateway/demo/)."""
    if Path("routes.yaml").is_file():
        return "routes.yaml"
    from importlib import resources

    package = Path(str(resources.files("gateway")))
    for candidate in (package / "demo" / "routes.yaml",  # an installed wheel
                      package.parent / "routes.yaml" if (package.parent / "pyproject.toml").is_file() else None):
        if candidate is not None and candidate.is_file():
            return str(candidate)  # (an editable checkout: the repository's own)
    raise CliError("no routes.yaml here and no demo in this installation; pass --routes")


def cmd_demo(args: argparse.Namespace) -> int:
    """Serve with the built-in emulator standing in for every lane that declares `emulator:`."""
    env_routes = str(args.settings.routes_path)  # the image sets one; without that file, the shipped demo
    args.routes = args.routes or (env_routes if Path(env_routes).is_file() else demo_routes())
    config = load_config(args.routes)
    print(f"  routes: {args.routes}", flush=True)
    _check_port_free(args.host, args.port)
    children = start_emulators(config, pacing=None if args.no_pacing else (args.decode_tps, args.prefill_tps))
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


# `gateway demo` paces its emulated lanes like a real one (llama-benchy through the demo then reports
# plausible figures, not 300K tok/s prompt speed): decode and prefill speed, unless the lane's own
# emulator knobs say otherwise. The emulator the tests start is not paced (tests stay fast).
DEMO_DECODE_TPS = 60.0
DEMO_PREFILL_TPS = 5000.0
DEMO_TTFT_MS = 30.0


# A demo lane plays an agent's model, so agent CLIs work against `gateway demo` as they come: its context
# is the lane's window (DeepSeek V4's 1M: Qwen Code asks max_tokens 64000), answers stop after a plausible
# length, and a request that offers a shell tool gets a harmless command run twice before the answer.
DEMO_CONTEXT_TOKENS = 1 << 20
DEMO_ANSWER_TOKENS = 120
DEMO_AGENT_TOOL_TURNS = 2


def emulator_knobs(lane, pacing: tuple[float, float] | None) -> dict:
    """The emulator's config for a demo lane: paced like a real lane, playing an agent's model, unless
    the lane's own knobs say otherwise."""
    paced = {"decode_tps": pacing[0], "prefill_tps": pacing[1], "ttft_ms": DEMO_TTFT_MS} if pacing else {}
    agent = {"max_model_len": lane.limits.max_context_tokens or DEMO_CONTEXT_TOKENS,
             "answer_tokens": DEMO_ANSWER_TOKENS, "agent_tool_turns": DEMO_AGENT_TOOL_TURNS}
    return {"flavour": lane.emulator.flavour, "model": lane.upstream_model, **agent, **paced,
            **lane.emulator.knobs}


def start_emulators(config, pacing: tuple[float, float] | None = None) -> list[subprocess.Popen]:
    from urllib.parse import urlsplit

    children = []
    for name, lane in config.lanes.items():
        if lane.emulator is None:
            continue
        for url in lane.replicas:
            parts = urlsplit(url)
            knobs = emulator_knobs(lane, pacing)
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
    raise CliError(f"{url} did not come up within {timeout:g}s", EXIT_UNREACHABLE)


def cmd_check(args: argparse.Namespace) -> int:
    from .check import run_check

    return run_check(args.routes_file, probe=args.probe, records_dir=args.records, redis_url=args.redis,
                     timeout=args.timeout)


# extra(config, routes_path, observed=..., records_dir=..., redis_url=...) -> {lane: reason} of lanes that would
# be refused (printing its own report); e.g. the qualification state per lane.


def cmd_emulate(argv: list[str]) -> int:
    """`gateway emulate --port 8101 --flavour vllm ...`: the emulator's own options, its own --help."""
    from ..emulator.cli import main as emulator_main

    return emulator_main(argv, prog="gateway emulate") or 0


def cmd_render(args: argparse.Namespace) -> int:
    from .. import process_switches
    from ..render.cli import render_command
    from ..render.options import options_for_lane
    from ..render.result import RenderError
    from ..render.template import TemplateNotFound

    body = read_json_file(args.request)
    if not isinstance(body, dict):
        raise CliError(f"{args.request}: a chat request is a JSON object with `messages`, not {type(body).__name__}")
    if not isinstance(body.get("messages"), list):
        raise CliError(f"{args.request}: the request has no `messages` list")
    config = load_config(args.routes)
    lane = config.lanes.get(args.lane)
    if lane is None:
        raise CliError(f"no lane {args.lane!r} in {args.routes} (lanes: {', '.join(config.lanes)})")
    options = options_for_lane(lane) if lane.render.template else None
    process_switches.apply(args.settings)  # renders as the gateway would
    try:
        text = render_command(body, options, args.summary, lane=lane)
    except TemplateNotFound as exc:
        raise CliError(str(exc)) from None
    except (RenderError, ValueError, TypeError) as exc:  # the request is not renderable (the engine would 400)
        raise CliError(f"{args.request}: cannot render: {exc}") from None
    # Piped or redirected, the prompt's exact bytes (no newline of ours); on a terminal, a tidy last line.
    sys.stdout.write(text + ("\n" if sys.stdout.isatty() and not text.endswith("\n") else ""))
    return 0


def build_parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    """`settings`: the environment's switches (Settings() by default), the options' defaults; every
    command finds them as `args.settings`."""
    settings = settings if settings is not None else Settings()
    parser = Parser(prog="gateway", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(settings=settings)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway")
    _serve_args(p, settings)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="run the gateway with emulated demo lanes (quick start)")
    _serve_args(p, settings)
    p.add_argument("--decode-tps", type=float, default=settings.demo_decode_tps,
                   help=f"emulated decode speed, tokens/s (default {DEMO_DECODE_TPS:g})")
    p.add_argument("--prefill-tps", type=float, default=settings.demo_prefill_tps,
                   help=f"emulated prefill speed of uncached prompt tokens, tokens/s (default {DEMO_PREFILL_TPS:g})")
    p.add_argument("--no-pacing", action="store_true", help="emulated lanes answer as fast as they can")
    p.set_defaults(routes=None)  # ./routes.yaml, else the demo shipped in the package
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("check", help="validate a routes.yaml without serving; exit 1 if a lane would be refused")
    p.add_argument("routes_file", nargs="?", default=str(settings.routes_path))
    p.add_argument("--probe", action="store_true", help="also ask each replica's GET /v1/models: model served, "
                                                        "max_model_len, revision; flag a mismatch with the lane")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per replica for --probe (default 5)")
    p.add_argument("--records", metavar="DIR", help="qualification records (default: qualifications/ beside "
                                                    "routes.yaml or $GATEWAY_QUALIFICATIONS)",
                   default=str(settings.qualifications) if settings.qualifications else None)
    p.add_argument("--redis", default=settings.redis_url, help="qualification records in Redis")
    p.set_defaults(func=cmd_check)

    # Dispatched in main() before this parser runs: the emulator parses its own options (gateway emulate --help).
    sub.add_parser("emulate", help="run the upstream emulator (options: gateway emulate --help)", add_help=False)

    p = sub.add_parser("render", help="print the prompt a lane's engine will see for a request")
    p.add_argument("request", help="a chat request JSON file")
    p.add_argument("--lane", required=True)
    p.add_argument("--routes", default=str(settings.routes_path))
    p.add_argument("--summary", action="store_true", help="token count and per-message spans instead of the text")
    p.set_defaults(func=cmd_render)

    for register in SUBCOMMANDS:
        register(sub, settings)
    return parser




def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else "gateway"
    try:
        if argv[:1] == ["emulate"]:
            return cmd_emulate(argv[1:])
        _load_subcommands()
        args = build_parser().parse_args(argv)
        command = args.command
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"gateway {command}: error: {exc}", file=sys.stderr)
        return exc.code
    except SettingsError as exc:  # a GATEWAY_* variable that does not read
        print(f"gateway {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _load_subcommands() -> None:
    """Admin views (stats, drift, qualify) live beside their features and register themselves."""
    import importlib

    for mod in ("gateway.records.cli", "gateway.conversations.cli", "gateway.qualify.cli", "gateway.cli.schema"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod and not mod.startswith(str(exc.name)):
                raise

