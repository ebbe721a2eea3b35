"""OpenAI-shaped errors: the one way the gateway says no."""

from __future__ import annotations

from typing import Any

import orjson


class GatewayError(Exception):
    """An error the client should see, already shaped like OpenAI's.

    Raise it anywhere on the request path; the app turns it into a JSON response with
    ``{"error": {"message", "type", "param", "code"}}`` and the given HTTP status.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _default_type(status)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def json_bytes(self) -> bytes:
        return orjson.dumps(self.body())


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code, type="invalid_request_error")


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "invalid_request_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "api_error" if status != 503 else "service_unavailable"
    return "invalid_request_error"
