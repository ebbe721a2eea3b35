"""An upstream's error answer → what the client sees: OpenAI's shape, a status that tells the truth,
and no secrets (see scrub.py).

Statuses: the engine's 4xx are about the request (context too long, bad parameter) and pass on;
401/403/407 mean the *gateway's* credentials for the lane are wrong, which is not the client's
fault: 502 `upstream_auth_failed`; 408 is the upstream giving up waiting: 504; an engine's 500 is
a 502 `upstream_error` with the engine's message (a 500 from the gateway means a fault of its own);
501-504 pass on; anything else an engine cannot mean (1xx, 3xx, 505+) is a 502.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..core.errors import error_body
from ..relay.scrub import Scrubber

MAX_ERROR_BODY = 64 * 1024  # bytes of an error answer read; the rest is dropped with the connection

_AUTH = frozenset((401, 403, 407))
_PASS_5XX = frozenset((501, 502, 503, 504))


def client_status(upstream_status: int) -> tuple[int, str | None]:
    """The status the client gets for an upstream's error status, and the code the gateway imposes."""
    if upstream_status in _AUTH:
        return 502, "upstream_auth_failed"
    if upstream_status == 408:
        return 504, "upstream_timeout"
    if upstream_status == 500:
        return 502, "upstream_error"
    if 400 <= upstream_status < 500 or upstream_status in _PASS_5XX:
        return upstream_status, None
    return 502, "upstream_bad_response"


def normalise_error(status: int, data: bytes | dict[str, Any] | None, scrubber: Scrubber) -> dict[str, Any]:
    """Any engine's error body → OpenAI's `{"error": {message, type, param, code}}`, scrubbed."""
    parsed: Any
    if isinstance(data, (bytes, bytearray)):
        try:
            parsed = orjson.loads(data) if data else None
        except orjson.JSONDecodeError:
            parsed = None
    else:
        parsed = data
    err: dict[str, Any] | None = None
    if isinstance(parsed, dict):
        inner = parsed.get("error")
        if isinstance(inner, dict):
            err = inner
        elif isinstance(inner, str):  # {"error": "text"} (many proxies)
            err = {"message": inner}
        elif "message" in parsed:  # SGLang and old vLLM: flat {"object": "error", ...}
            err = parsed
        elif isinstance(parsed.get("detail"), (str, list)):  # FastAPI's default
            err = {"message": str(parsed["detail"])}
    if err is None:
        if isinstance(data, (bytes, bytearray)) and data:
            text = bytes(data[:4096]).decode("utf-8", "replace").strip()
        else:
            text = ""
        err = {"message": text}
    message = err.get("message")
    message = scrubber.text(message if isinstance(message, str) else str(message or "")).strip()
    code = scrubber.code(err.get("code"))
    type_ = scrubber.code(err.get("type"))
    param = scrubber.code(err.get("param"))
    return error_body(
        message or f"the upstream answered HTTP {status}",
        type=str(type_) if isinstance(type_, str) else ("invalid_request_error" if status < 500 else "api_error"),
        param=param if isinstance(param, str) else None,
        code=code if isinstance(code, str) else None,  # OpenAI's codes are strings (vLLM sends 400)
    )
