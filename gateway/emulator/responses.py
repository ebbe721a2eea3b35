"""The emulator's JSON answers: a body, an error in the emulated engine's own shape, and an error as
Anthropic's Messages API gives it. The request handlers (server.py) and a generation (job.py) both
answer with them, so they belong to neither.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from . import shapes
from .config import EmulatorConfig

_JSON = "application/json"


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=_JSON, headers=headers)


def error(cfg: EmulatorConfig, status: int, message: str, type: str, param: str | None = None) -> web.Response:
    return json_response(shapes.error_body(cfg.flavour, message, type=type, code=status, param=param), status)


def anthropic_error(status: int, message: str) -> web.Response:
    return json_response({"type": "error", "error": {"type": "invalid_request_error", "message": message}}, status)
