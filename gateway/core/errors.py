"""Errors the client should see: the one way the gateway says no, in OpenAI's shape or, on the
Anthropic Messages routes, in Anthropic's."""

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


class AnthropicError(GatewayError):
    """The same error in Anthropic's shape: what an error before the pipeline (the key check) becomes
    on the Messages routes, whose clients read `{"type": "error", "error": {"type", "message"}}`."""

    @classmethod
    def of(cls, exc: GatewayError) -> "AnthropicError":
        return cls(exc.status, exc.message, code=exc.code, param=exc.param, type=exc.type, headers=exc.headers)

    def body(self) -> dict[str, Any]:
        return anthropic_body(self.status, self.message)


def anthropic_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            529: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


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
