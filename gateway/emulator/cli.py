"""`gateway emulate` (or `python -m gateway.emulator`): every knob is a flag (`--ttft-ms 50`), or give
`--config-json '{...}'`. Exit status as the gateway's: 2 for a bad option, 3 when the port cannot be opened."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import orjson
from aiohttp import web

from .config import EmulatorConfig, default_field, knob_names, knob_type
from .server import create_app


_CHOICES = {
    "flavour": ["vllm", "sglang"],
    "tokenizer": ["simple", "dsv41"],
    "reasoning_field": ["reasoning", "reasoning_content", "both"],
}


def build_parser(prog: str = "gateway.emulator") -> argparse.ArgumentParser:
    from ..cli.common import Parser  # one-line usage errors, as every gateway command

    p = Parser(prog=prog, description="SGLang/vLLM-like upstream emulator: OpenAI-compatible, with a real "
                                      "prefix cache; every knob below is also a key of --config-json")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--config-json", default=None, help="JSON object of knobs, applied before the flags")
    p.add_argument("--flavor", dest="flavour", default=None, help=argparse.SUPPRESS)
    for name in knob_names():
        flag = "--" + name.replace("_", "-")
        kind = knob_type(name)
        default = default_field(name)
        if kind is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                           help=f"default {default}")
        elif kind is tuple:
            p.add_argument(flag, dest=name, action="append", default=None, help="repeatable")
        elif name in _CHOICES:
            p.add_argument(flag, dest=name, choices=_CHOICES[name], default=None, help=f"default {default}")
        else:
            p.add_argument(flag, dest=name, type=kind, default=None, help=f"default {default}")
    return p


def config_from_args(argv: Sequence[str] | None = None,
                     prog: str = "gateway.emulator") -> tuple[EmulatorConfig, str, int]:
    if argv and argv[0] == "--":
        argv = argv[1:]  # `gateway emulate -- --port ...` (the old spelling) still works
    args = build_parser(prog).parse_args(argv)
    config = EmulatorConfig()
    if args.config_json:
        try:
            knobs = orjson.loads(args.config_json)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"--config-json is not valid JSON: {exc}") from None
        if not isinstance(knobs, dict):
            raise ValueError("--config-json must be a JSON object of knobs")
        config = config.merged(knobs)
    flags = {name: getattr(args, name) for name in knob_names() if getattr(args, name, None) is not None}
    config = config.merged(flags)
    return config, args.host, args.port


def run(config: EmulatorConfig, host: str = "127.0.0.1", port: int = 8100) -> None:
    """Serve until SIGINT/SIGTERM, on uvloop when it is installed."""
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    app = create_app(config)
    ready = f"emulator ({config.flavour}, model {config.model}) listening on http://{host}:{port}"
    # handler_cancellation: a client that goes away cancels its handler at once, which is how the
    # emulator sees (and records) disconnects while it is waiting, not only when a write fails.
    # shutdown_timeout: an emulator owes nobody a graceful drain; a stalled stream must not hold SIGTERM.
    web.run_app(
        app, host=host, port=port, access_log=None, handler_cancellation=True, loop=loop,
        print=lambda _msg: print(ready, file=sys.stderr, flush=True),  # once bound: never before a bind error
        shutdown_timeout=0.5,
    )


def main(argv: Sequence[str] | None = None, prog: str = "gateway.emulator") -> int:
    try:
        config, host, port = config_from_args(argv, prog)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        run(config, host, port)
    except OSError as exc:  # the port is taken, or the host is not an address of this machine
        print(f"{prog}: error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    return 0
